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
from tirbyoc.rewrite.foundation.pipeline import ORDER, stage, stage_names, stages
from tirbyoc.rewrite.foundation.steps import Step, StepKind
from tirbyoc.rewrite.block.tensorize import tensorize

VTA = tirbyoc.get_template("vta")


def test_stages_run_in_the_written_order_each_from_the_module_it_names():
    """The order is `ORDER`, written once; each stage's function comes from the module its row
    names, whatever was imported before."""
    expected = ["cast", "commute", "canonicalize", "stage", "pad", "tile", "scratchpad", "epilogue", "fragments", "schedule",
                "dma copies", "fragment copies", "cpu epilogue", "decompose", "tensorize", "init", "link"]
    assert stage_names() == expected
    assert [s.name for s in stages()] == expected
    assert [s.fn.__module__ for s in stages()] == [f"tirbyoc.rewrite.{module}" for _, module, _ in ORDER]
    assert [s.target_kinds for s in stages() if s.target_kinds] == [("cuda",), ("cuda",), ("llvm",)]


def test_a_stage_must_be_a_row_of_the_order_and_registered_once():
    with pytest.raises(ValueError, match="no rewrite stage 'late' in the stage order"):
        stage("late")(lambda s: None)
    with pytest.raises(ValueError, match="already registered"):
        stage("tile")(lambda s: None)


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
