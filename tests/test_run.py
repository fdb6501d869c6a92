"""The Relax bridge and `tirbyoc run`: a built-in model offloaded, built, run and compared."""

import json

import pytest

import tirbyoc
from tirbyoc.cli import main
from tirbyoc.relax_bridge import OffloadReport, OffloadTIR
from tirbyoc.run import run_model


def legalized(name):
    from tvm import relax

    from tirbyoc.models import build_model

    return relax.transform.LegalizeOps()(build_model(name))


def test_run_default_is_verified_with_full_coverage():
    r = run_model()
    assert r.verified is True and r.max_abs_err <= 1e-3
    assert r.report.coverage == 1.0 and r.report.total_macs == 16 * (256 * 512 + 512 * 512 + 512 * 128)
    offloaded = [f for f in r.report.functions if f.offloaded]
    assert len(offloaded) == 3 and all(f.verified for f in offloaded)
    assert r.latency_ms["offloaded"] > 0 and r.latency_ms["baseline"] > 0
    assert "MAC coverage: 100.0%" in r.table()


def test_offload_tir_replaces_primfuncs_and_keeps_call_tir():
    mod = legalized("mlp")
    report = OffloadReport()
    new = OffloadTIR(["blas"], report=report, whole_calls=False)(mod)
    assert set(gv.name_hint for gv in new.functions) == set(gv.name_hint for gv in mod.functions)
    assert str(new["forward"]).count("R.call_tir(") == str(mod["forward"]).count("R.call_tir(")
    matmuls = [f for f in report.functions if f.macs]
    assert matmuls and all(f.offloaded and f.verified for f in matmuls)
    for f in matmuls:
        func = new[f.name]
        assert int(func.attrs["op_pattern"]) == 8  # opaque: fusion leaves it alone
        assert "blas" in func.script() or "sgemm" in func.script()
    assert report.coverage == 1.0


def test_whole_matmul_becomes_call_dps_packed_with_the_library_attached():
    import numpy as np
    import tvm
    from tvm import relax

    from tirbyoc._tvm import make_target, relax_vm

    mod = legalized("mlp")
    report = OffloadReport()
    new = OffloadTIR(["blas"], report=report)(mod)
    text = str(new["forward"])
    assert text.count('R.call_dps_packed("tirbyoc_blas_matmul_nn"') == 3
    matmuls = [f for f in report.functions if f.macs]
    assert [f.extern for f in matmuls] == ["tirbyoc_blas_matmul_nn"] * 3
    assert all(f.verified for f in matmuls)
    assert not any(f.name in {gv.name_hint for gv in new.functions} for f in matmuls)  # dropped
    assert len(new.attrs["external_mods"]) == 1
    target = make_target({"kind": "llvm"})
    rng = np.random.default_rng(1)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in mod["forward"].params]
    outs = [relax_vm(tvm.compile(m, target=target), tvm.cpu())["forward"](
        *[tvm.runtime.tensor(a) for a in args]).numpy() for m in (new, mod)]
    from tirbyoc.verification import tolerance

    err = float(np.abs(outs[0] - outs[1]).max())
    assert err <= tolerance("float32", 512, float(np.abs(outs[1]).max())), err


def test_whole_call_is_not_used_for_a_function_with_more_than_the_kernel():
    from tvm.script import tirx as T

    from tirbyoc.whole_function import find_whole_call

    @T.prim_func(s_tir=True)
    def matmul_relu(A: T.Buffer((32, 48), "float32"), B: T.Buffer((48, 16), "float32"),
                    C: T.Buffer((32, 16), "float32")):
        acc = T.sblock_alloc_buffer((32, 16), "float32")
        for i, j, k in T.grid(32, 16, 48):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + A[vi, vk] * B[vk, vj]
        for i, j in T.grid(32, 16):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = T.max(acc[vi, vj], T.float32(0))

    call, why = find_whole_call(matmul_relu, tirbyoc.match(matmul_relu, [tirbyoc.get_template("blas")]))
    assert call is None and "2 blocks" in why


def test_offload_tir_reports_why_a_function_stayed():
    mod = legalized("mlp")  # float32: x86_vnni is int8-only
    new, report = tirbyoc.relax_bridge.offload_module(mod, ["x86_vnni"])
    matmuls = [f for f in report.functions if f.macs]
    assert matmuls and not any(f.offloaded for f in matmuls)
    assert all(f.reason and "float32" in f.reason for f in matmuls), [f.reason for f in matmuls]
    assert report.coverage == 0.0


def test_cli_run_json(capsys):
    assert main(["run", "--json", "-q", "--template", "blas"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("model", "template", "coverage", "offloaded_macs", "total_macs", "verified",
                "max_abs_err", "latency_ms", "functions"):
        assert key in out, key
    assert out["model"] == "builtin:mlp" and out["verified"] is True and out["coverage"] == 1.0
    assert set(out["latency_ms"]) == {"offloaded", "baseline"}


@pytest.mark.parametrize("model,message", [("builtin:nope", "unknown built-in model 'nope'"),
                                           ("model.onnx", "built-in models only")])
def test_cli_run_bad_model(capsys, model, message):
    assert main(["run", "-q", "--model", model]) == 2
    assert message in capsys.readouterr().err
