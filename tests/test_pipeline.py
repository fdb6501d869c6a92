"""The rewrite as named stages, its step records and dump hook; typed mismatches."""

import json

import pytest
from workloads import matmul

import tirbyoc
from tirbyoc import offload, verify
from tirbyoc.app.commands.cli import main
from tirbyoc.ir.pattern import function_blocks
from tirbyoc.matching.candidates import candidates
from tirbyoc.matching.matcher import match_block
from tirbyoc.matching.results import Match, MatchStage, Mismatch
from tirbyoc._tvm import tvm
from tirbyoc.offloading.function_steps import FUNCTION_STEPS
from tirbyoc.offloading.lowering import AFTER_LOWERING, BEFORE_LOWERING
from tirbyoc.rewrite.block.order import STAGES, stage_names
from tirbyoc.rewrite.foundation.pipeline import Stage, run_in_order
from tirbyoc.rewrite.foundation.steps import Step, StepKind
from tirbyoc.rewrite.block.tensorize import tensorize

VTA = tirbyoc.get_template("vta")


def test_every_pipeline_is_rows_of_stages_holding_their_functions():
    """The rewrite's stages, the function steps and the lowering passes are written one way:
    rows of `Stage` (name, the function itself, what it does, the targets it serves), run in
    order by one runner."""
    expected = ["cast", "commute", "canonicalize", "stage", "pad", "tile", "scratchpad", "epilogue", "fragments", "schedule",
                "dma copies", "fragment copies", "cpu epilogue", "decompose", "tensorize", "init", "link"]
    assert stage_names() == expected
    for rows in (STAGES, FUNCTION_STEPS, BEFORE_LOWERING, AFTER_LOWERING):
        assert all(isinstance(s, Stage) and callable(s.fn) and s.what for s in rows)
        assert len({s.name for s in rows}) == len(rows)
    assert [s.target_kinds for s in STAGES if s.target_kinds] == [("cuda",), ("cuda",), ("llvm",)]
    assert [s.fn.__name__ for s in FUNCTION_STEPS] == ["in_place", "bind_to_gpu", "account_scratchpads"]


def test_the_runner_skips_what_does_not_apply_and_serves_only_its_targets():
    seen = []
    rows = (Stage("double", lambda v: v * 2, "x2"), Stage("skip", lambda v: None, "nothing"),
            Stage("gpu only", lambda v: v + 100, "+100", ("cuda",)), Stage("inc", lambda v: v + 1, "+1"))
    out = run_in_order(rows, 5, lambda st, v: seen.append(st.name) or st.fn(v),
                       target=tvm.target.Target({"kind": "llvm"}))
    assert out == 11 and seen == ["double", "skip", "inc"]


def test_steps_are_records_that_read_as_sentences(tmp_path, monkeypatch):
    """A scratchpad rewrite: every step has a kind; the dump hook writes the TIR after each
    stage that applied, in order; the result still verifies."""
    monkeypatch.setenv("TIRBYOC_DUMP", str(tmp_path))
    func = matmul(32, 32, 32, "int8", "int8", "int32", trans_b=True)
    (m,) = [x for x in tirbyoc.match(func, VTA) if x.block == "C" and x.intrinsic.role.value == "compute"][:1]
    rw = tensorize(func, m)
    assert all(isinstance(s, Step) and isinstance(s, str) for s in rw.steps)
    kinds = {s.kind for s in rw.steps}
    assert {StepKind.CANONICALIZE, StepKind.TILE, StepKind.SCRATCHPAD_PLAN, StepKind.DMA,
            StepKind.TENSORIZE} <= kinds
    assert any(s.kind is StepKind.DMA and s.operand == "A" for s in rw.steps)
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps and len({p.split(".")[0] for p in dumps}) == 1  # one rewrite, numbered
    assert all(p.split(".", 1)[1].startswith("main.C.") for p in dumps)
    stages_dumped = [p.split("-", 1)[1].removesuffix(".py") for p in dumps]
    order = [s.replace(" ", "_") for s in stage_names()]
    assert stages_dumped == [s for s in order if s in stages_dumped]
    assert {"canonicalize", "tile", "scratchpad", "dma_copies", "tensorize", "link"} <= set(stages_dumped)
    assert "T.prim_func" in (tmp_path / dumps[-1]).read_text()
    assert verify(func, rw.func, VTA.target).passed


def test_offload_report_shows_decisions_by_kind():
    out = offload(matmul(30, 20, 17, "int8", "int8", "int32", trans_b=True), VTA)
    assert out.offloaded, out.table()
    assert "pad_einsum" in out.table() and "scratchpad tile of" in out.table()


def test_match_block_returns_a_typed_mismatch_and_never_raises():
    func = matmul(16, 16, 16, "float32", "float32", "float32")
    block = next(b for b in function_blocks(func) if b.name == "C")
    results = [match_block(c, block, "main") for c in candidates(VTA)]
    assert results and all(isinstance(r, (Match, Mismatch)) for r in results)
    gemm = [r for r, c in zip(results, candidates(VTA)) if c.intrinsic.role.value == "compute"]
    assert all(isinstance(r, Mismatch) for r in gemm)
    assert any(r.stage is MatchStage.DTYPE and r.expected == "int32" and r.found == "float32" for r in gemm)


def test_match_json_carries_the_mismatch_record(tmp_path, capsys):
    src = tmp_path / "w.py"
    src.write_text(
        "from tvm.script import tirx as T\n\n"
        "@T.prim_func(s_tir=True)\n"
        "def f32(A: T.Buffer((16, 16), 'float32'), B: T.Buffer((16, 16), 'float32'),\n"
        "        C: T.Buffer((16, 16), 'float32')):\n"
        "    for i, j, k in T.grid(16, 16, 16):\n"
        "        with T.sblock('C'):\n"
        "            vi, vj, vk = T.axis.remap('SSR', [i, j, k])\n"
        "            with T.init():\n"
        "                C[vi, vj] = T.float32(0)\n"
        "            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]\n")
    assert main(["match", str(src), "-t", "vta", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out)["blocks"] if r["block"] == "C"]
    assert row["intrinsic"] is None and row["mismatch"]["stage"] == "dtype"
    assert row["mismatch"]["found"] == "float32" and row["reason"].endswith(row["mismatch"]["message"])


def test_the_function_steps_and_the_lowering_dump_like_the_stages(tmp_path, monkeypatch):
    """One runner, one dump: an offload to a CPU template writes the rewrite's stages, the
    function steps and the lowering passes that changed the function, each named by its run."""
    monkeypatch.setenv("TIRBYOC_DUMP", str(tmp_path))
    out = offload(matmul(64, 64, 64), "x86_fp32_avx2")
    assert out.offloaded and out.verification.passed
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(".main.C." in n for n in names), names  # the block's stages
    lowered = [n for n in names if ".lowering." in n]
    marked = [n for n in lowered if n.endswith("-mark_write-backs.py")]
    assert marked, lowered
    assert (tmp_path / marked[0]).read_text().startswith("# after stage 'mark write-backs'\n")
    assert all((tmp_path / n).read_text().startswith("# after stage '") for n in names)
