"""The Relax bridge and `tirbyoc run`: a built-in model offloaded, built, run and compared."""

import json

import pytest

import tirbyoc
from tirbyoc.app.commands.cli import main
from tirbyoc.relax.bridge import OffloadReport, OffloadTIR
from tirbyoc.app.running.run import run_model


def legalized(name):
    from tvm import relax

    from tirbyoc.app.model_in.models import build_model

    return relax.transform.LegalizeOps()(build_model(name))


def test_options_are_one_record_given_whole_or_by_field_and_an_unknown_one_is_named():
    from tirbyoc.app.options import RunOptions, from_flags

    with pytest.raises(TypeError, match=r"unknown option\(s\) repat; RunOptions has target, seed"):
        run_model("builtin:mlp", ["blas"], repat=1)
    assert from_flags(seed=3, target=None, fast_math=None) == RunOptions(seed=3)
    opts = RunOptions(repeat=1, seed=3, time_baseline=False)
    r = run_model("builtin:mlp", ["blas"], opts)
    assert r.verified is True and "baseline" not in r.latency_ms
    assert "baseline" in run_model("builtin:mlp", ["blas"], opts, time_baseline=True).latency_ms  # a field given wins


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
    from tirbyoc.offloading.verification import tolerance

    err = float(np.abs(outs[0] - outs[1]).max())
    assert err <= tolerance("float32", 512, float(np.abs(outs[1]).max())), err


def test_whole_call_is_not_used_for_a_function_with_more_than_the_kernel():
    from tvm.script import tirx as T

    from tirbyoc.offloading.whole_function import find_whole_call

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
    new, report = tirbyoc.relax.bridge.offload_module(mod, ["x86_vnni"])
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


def write_onnx_mlp(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n)
               for n, s in (("W1", (64, 128)), ("B1", (128,)), ("W2", (128, 32)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "B1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_cli_run_onnx_json(tmp_path, capsys):
    path = write_onnx_mlp(tmp_path / "x.onnx")
    assert main(["run", "--model", str(path), "--json", "-q", "-t", "blas"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(path) and out["verified"] is True
    assert out["total_macs"] == 8 * 64 * 128 + 8 * 128 * 32 and out["coverage"] == 1.0
    assert {f["extern"] for f in out["functions"] if f["macs"]} == {"tirbyoc_blas_matmul_nn"}


RELAX_FILE = """
from tvm.script import ir as I, relax as R

@I.ir_module
class Model:
    @R.function
    def main(x: R.Tensor((32, 64), "float32"), w: R.Tensor((64, 48), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            R.output(y)
        return y
"""
NN_FILE = """
from tvm.relax.frontend import nn

class Net(nn.Module):
    def __init__(self):
        self.fc = nn.Linear(64, 48, bias=False)

    def forward(self, x):
        return nn.op.relu(self.fc(x))

model = Net()
spec = {"forward": {"x": nn.spec.Tensor((32, 64), "float32")}}
"""
TORCH_FILE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 48))

    def forward(self, x):
        return torch.relu(x @ self.w)

model = Net()
example_inputs = (torch.randn(32, 64),)
"""


@pytest.mark.parametrize("source", [RELAX_FILE, NN_FILE, TORCH_FILE], ids=["tvmscript", "relax-nn", "torch"])
def test_run_python_model_files(tmp_path, source):
    if "torch" in source.split("\n")[1]:
        pytest.importorskip("torch")
    path = tmp_path / "model.py"
    path.write_text(source)
    r = run_model(str(path), ["blas"])
    assert r.verified is True and r.report.total_macs == 32 * 64 * 48 and r.report.coverage == 1.0


@pytest.mark.parametrize("source,message", [
    ("x = 1\n", "defines no model"),
    ("raise RuntimeError('boom')\n", "raised RuntimeError while being imported: boom"),
    ("from tvm.relax.frontend import nn\nclass N(nn.Module):\n    def forward(self, x):\n        return x\nm = N()\n",
     "needs `spec`"),
])
def test_bad_model_files_say_what_is_wrong(tmp_path, capsys, source, message):
    path = tmp_path / "bad.py"
    path.write_text(source)
    assert main(["run", "-q", "--model", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("model,message", [("builtin:nope", "unknown built-in model 'nope'"),
                                           ("model.txt", "an .onnx file or a .py file"),
                                           ("missing.onnx", "no such file")])
def test_cli_run_bad_model(capsys, model, message):
    assert main(["run", "-q", "--model", model]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["cnn_int8", "transformer_int8"])
def test_int8_builtins_run_verified_on_x86_vnni(name):
    from vnni import VNNI

    r = run_model(f"builtin:{name}", [VNNI], repeat=1)
    assert r.verified is True and r.max_abs_err == 0 and r.report.coverage == 1.0
    assert ("offloaded" in r.latency_ms) == (not VNNI.emulates)  # no time for an emulation
    assert ("offloaded not measured (x86_vnni_emulated emulates vpdpbusd" in r.table()) == bool(VNNI.emulates)
    assert r.to_json()["emulates"] == ({VNNI.name: VNNI.emulates} if VNNI.emulates else {})


def test_builtin_architectures():
    from tirbyoc.app.model_in.models import build_model

    text = str(build_model("mobilenet_v2")["forward"])
    assert text.count("R.nn.conv2d(") == 52 and text.count("groups=") >= 17
    quantized = build_model("cnn_int8")["forward"].script(show_meta=False)  # QDQ, weights constant
    assert quantized.count("R.nn.conv2d(") == 3 and quantized.count("R.matmul(") == 1
    # the input, each chain's end (conv outputs, the logits) and the pooled features the classifier reads
    assert quantized.count('R.quantize(') == 6 and 'out_dtype="uint8"' in quantized


def test_cli_run_writes_an_html_report(tmp_path, capsys):
    path = tmp_path / "run.html"
    assert main(["run", "-q", "-t", "blas", "--report", str(path)]) == 0
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert page.count("<svg") == 1 and page.count('fill="#2e7d32"') == 3  # three matmuls, all offloaded
    assert "100.0% (7,340,032 of 7,340,032)" in page and "tirbyoc_blas_matmul_nn (call_dps_packed)" in page
    assert f"report written to {path}" in capsys.readouterr().err


def test_coverage_weighs_shared_primfuncs_by_their_call_sites():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Twice:
        @R.function
        def main(x: R.Tensor((16, 32), "float32"), w: R.Tensor((32, 32), "float32"),
                 v: R.Tensor((16, 48), "float32"), u: R.Tensor((48, 24), "float32")):
            with R.dataflow():
                a = R.matmul(x, w)
                b = R.matmul(a, w)  # same shapes: LegalizeOps shares one PrimFunc
                c = R.matmul(v, u)
                R.output(b, c)
            return (b, c)

    from tvm import relax

    mod = relax.transform.LegalizeOps()(Twice)
    _, report = tirbyoc.relax.bridge.offload_module(mod, ["x86_vnni"], verify=False)  # fp32: stays
    by_name = {f.name: f for f in report.functions}
    assert sorted((f.calls, f.macs) for f in by_name.values()) == [(1, 16 * 48 * 24), (2, 16 * 32 * 32)]
    assert report.total_macs == 2 * 16 * 32 * 32 + 16 * 48 * 24 and report.coverage == 0.0
