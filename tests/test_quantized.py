"""Quantized (QDQ) models: their float chains become exact integer cores that the int8
templates offload."""

import json
import subprocess
import sys

import numpy as np
import pytest
from tvm import relax

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.app.model_in.loaders import import_onnx
from tirbyoc.app.running.reference import output_step
from tirbyoc.app.running.run import run_model
from tirbyoc.relax.quantized import has_quantize_ops, quantized_to_integer
from tirbyoc.testing.qdq import float_cnn, float_transformer, ort_quantize, qdq_matmul

pytest.importorskip("onnx")
CPU = tvm.target.Target({"kind": "llvm"})


def run(mod, x):
    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=CPU)
    return relax_vm(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_hand_written_qdq_matmul_becomes_an_exact_integer_core(tmp_path, act):
    mod = import_onnx(qdq_matmul(tmp_path / "mm.onnx"))
    assert has_quantize_ops(mod)
    new, report = quantized_to_integer(mod, act)
    assert report.integer == ["matmul 32x24"] and not report.kept
    text = new.script(show_meta=False)
    assert 'R.matmul(' in text and 'out_dtype="int32"' in text and act in text
    x = np.random.default_rng(3).uniform(-1.2, 1.2, (4, 32)).astype("float32")  # some saturate
    np.testing.assert_array_equal(run(new, x), run(mod, x))


@pytest.mark.parametrize("act", ["uint8", "int8"])
@pytest.mark.parametrize("zero_point", [3, list(range(-12, 12))], ids=["per-tensor", "per-column"])
def test_asymmetric_weights_become_an_exact_integer_core(tmp_path, act, zero_point):
    """Weight zero points (3, or one per output column): the core multiplies the raw
    weights, the zero points' share comes from the input's row sums."""
    mod = import_onnx(qdq_matmul(tmp_path / "mm.onnx", weight_zero_point=zero_point))
    new, report = quantized_to_integer(mod, act)
    assert report.integer == ["matmul 32x24"] and not report.kept
    x = np.random.default_rng(5).uniform(-1, 1, (4, 32)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


@pytest.mark.parametrize("make", ["float_cnn", "float_depthwise"])
def test_asymmetric_weights_from_onnxruntime_are_exact_and_offload(tmp_path, make):
    """ONNX Runtime's quantizer with asymmetric weights (per tensor: it keeps per-channel int8
    weights symmetric): the convolutions' window sums come from an 8-bit conv with a kernel of
    ones (per channel for the depthwise one), so every chain is integer, equal to the QDQ
    graph, and offloads."""
    pytest.importorskip("onnxruntime")
    from onnx import numpy_helper

    import tirbyoc.testing.qdq as qdq

    path = ort_quantize(getattr(qdq, make)(tmp_path / "f.onnx"), tmp_path / "q.onnx", symmetric_weights=False,
                        per_channel=False)
    zero_points = [numpy_helper.to_array(i) for i in __import__("onnx").load(str(path)).graph.initializer
                   if i.name.endswith("zero_point") and i.data_type == 3]  # int8: the weights'
    assert any(np.any(z != 0) for z in zero_points), "the quantizer wrote symmetric weights"
    mod = import_onnx(path)
    new, report = quantized_to_integer(mod, "int8")
    assert len(report.integer) == 3 and not report.kept, report.kept
    x = np.random.default_rng(9).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))
    r = run_model(str(path), ["vta"], repeat=1)
    assert r.verified is True and r.comparison.abs_err == 0, r.table()
    # every 8-bit core offloads; what stays is the window sums' one-channel int32 box filter,
    # 1/(C*O) of its convolution's MACs (C*O >= 24 here, in the thousands in real networks)
    kept = [f for f in r.report.functions if f.macs and not f.offloaded_macs]
    assert kept and all("int32" in (f.reason or "") for f in kept), r.table()
    assert sum(f.macs * f.calls for f in kept) * 16 <= r.report.offloaded_macs, r.table()


def _ort_quantized(tmp_path_factory, make_float, name: str):
    """``make_float``'s model quantized by ONNX Runtime (the test skips without it)."""
    pytest.importorskip("onnxruntime")
    folder = tmp_path_factory.mktemp(name)
    return ort_quantize(make_float(folder / f"{name}.onnx"), folder / f"{name}_qdq.onnx")


@pytest.fixture(scope="module")
def ort_cnn(tmp_path_factory):
    return _ort_quantized(tmp_path_factory, float_cnn, "cnn")


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_onnxruntime_quantized_cnn_is_exact_as_integers(ort_cnn, act):
    """Padded convolutions (the pad value is the zero point), per-channel weights, int32
    biases, a matmul: the integer graph gives the float QDQ graph's output exactly."""
    mod = import_onnx(ort_cnn)
    new, report = quantized_to_integer(mod, act)
    assert sorted(report.integer) == ["conv2d 16x16x3x3", "conv2d 16x3x3x3", "matmul 1024x10"], report.kept
    x = np.random.default_rng(5).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def test_run_on_vta_makes_the_chains_integer_and_offloads_every_core(ort_cnn):
    r = run_model(str(ort_cnn), ["vta"], repeat=1)
    assert r.quantized is not None and len(r.quantized.integer) == 3
    assert r.report.coverage == 1.0 and r.verified is True, r.table()
    assert r.comparison.abs_err == 0  # against TVM's build of the integer model: exact
    assert r.quantized.step > 0 and r.quantized.float_max_abs_diff <= r.quantized.step  # vs the float QDQ graph
    assert "quantized model: 3 of 3 quantized conv/matmul chains made integer" in r.table()


def test_run_json_reports_the_quantized_chains(ort_cnn, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tirbyoc", "run", "-q", "-t", "vta", "-m", str(ort_cnn),
                           "--json", "--repeat", "1"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert len(out["quantized"]["integer"]) == 3 and out["quantized"]["kept"] == []


def test_float_templates_keep_the_model_as_given(ort_cnn):
    r = run_model(str(ort_cnn), ["blas"], repeat=1)
    assert r.quantized is None and r.verified is True


def test_onnxruntime_reference_runs_the_same_file_on_the_same_inputs(ort_cnn):
    r = run_model(str(ort_cnn), ["vta"], repeat=2, reference="onnxruntime")
    ref = r.reference
    assert ref.name == "onnxruntime" and ref.latency_ms > 0 and ref.threads >= 1
    assert ref.step is not None and ref.step > 0  # a QDQ model's output is quantized
    assert ref.spec_max_abs_err <= ref.step  # the ONNX semantics, as the graph is written
    assert ref.agree == (ref.max_abs_err <= ref.step * (1 + 1e-6))  # ORT's fused kernels: machine-dependent
    assert "reference: onnxruntime" in r.table() and r.to_json()["reference"]["name"] == "onnxruntime"


def test_reference_needs_an_onnx_file():
    from tirbyoc.errors import TirbyocError

    pytest.importorskip("onnxruntime")
    with pytest.raises(TirbyocError, match="ONNX files"):
        run_model("builtin:mlp", ["blas"], repeat=1, reference="onnxruntime")


@pytest.fixture(scope="module")
def ort_transformer(tmp_path_factory):
    return _ort_quantized(tmp_path_factory, float_transformer, "enc")


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_attention_matmuls_of_two_activations_become_exact_integer_cores(ort_transformer, act):
    """q.k^T and p.v: both operands quantized at run time; both zero points' shares come from
    row and column sums of the operands."""
    mod = import_onnx(ort_transformer)
    new, report = quantized_to_integer(mod, act)
    assert report.integer.count("matmul (activations)") == 2 and len(report.integer) == 8, report.kept
    x = np.random.default_rng(7).uniform(-1, 1, (16, 64)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def test_quantized_transformer_offloads_every_matmul_to_vta(ort_transformer):
    r = run_model(str(ort_transformer), ["vta"], repeat=1)
    assert r.report.coverage == 1.0 and r.verified is True and r.comparison.abs_err == 0, r.table()
    assert r.quantized.describe().startswith("8 of 8 quantized conv/matmul chains made integer")
    assert r.quantized.float_max_abs_diff <= r.quantized.step


def test_depthwise_conv_and_a_transposed_gemm_become_exact_integer_cores(tmp_path):
    pytest.importorskip("onnxruntime")
    from tirbyoc.testing.qdq import float_depthwise

    mod = import_onnx(ort_quantize(float_depthwise(tmp_path / "dw.onnx"), tmp_path / "dw_qdq.onnx"))
    new, report = quantized_to_integer(mod, "int8")
    assert sorted(report.integer) == ["conv2d 8x1x3x3", "conv2d 8x3x3x3", "matmul 128x10"], report.kept
    x = np.random.default_rng(9).uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def test_match_explains_the_integer_cores_run_offloads(ort_cnn, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tirbyoc", "match", str(ort_cnn), "-t", "vta", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    blocks = json.loads(proc.stdout)["blocks"]
    gemms = [b for b in blocks if b["intrinsic"] and "gemm" in b["intrinsic"]]
    assert len(gemms) == 3, [b for b in blocks if b["macs"]]


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_dynamic_quantization_matmul_integer_becomes_an_8bit_core(tmp_path, act):
    """ONNX Runtime's quantize_dynamic: MatMulInteger, which TVM imports as an int32 x int32
    matmul of zero-point-centred operands, becomes an 8-bit core plus the zero points' shares."""
    pytest.importorskip("onnxruntime")
    from tirbyoc.testing.qdq import ort_quantize_dynamic

    mod = import_onnx(ort_quantize_dynamic(float_transformer(tmp_path / "enc.onnx"), tmp_path / "enc_dyn.onnx"))
    new, report = quantized_to_integer(mod, act)
    assert report.integer.count("matmul_integer") == 6 and not report.kept  # the weight matmuls
    x = np.random.default_rng(11).uniform(-1, 1, (16, 64)).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def test_a_quantized_model_deploys(ort_cnn, tmp_path):
    """tirbyoc build takes the same path: the QDQ CNN on vta as one library, run in a fresh
    process, equal to this process's run."""
    from test_deploy import run_fresh

    from tirbyoc.app.building.deploy import build_library

    built = build_library(str(ort_cnn), ["vta"], output=tmp_path / "out" / "cnn.so")
    assert built.report.offloaded_macs == built.report.total_macs
    np.testing.assert_array_equal(run_fresh(built, tmp_path), built.output)


@pytest.mark.parametrize("builder, kwargs, shape, cores, steps", [
    ("float_resnet50", {"size": 32, "classes": 10}, (1, 3, 32, 32), 53 + 1, 4),
    ("float_mobilenet_v2", {"size": 32, "classes": 10}, (1, 3, 32, 32), 52 + 1, 0),
    ("float_bert_base", {"seq": 16, "dim": 64, "heads": 4, "hidden": 128, "layers": 2}, (16, 64), 2 * 8, 0),
], ids=["resnet50", "mobilenet_v2", "bert_base"])
def test_benchmark_architectures_quantized_by_onnxruntime_become_integer(tmp_path, builder, kwargs, shape, cores,
                                                                         steps):
    """The float graphs bench/reach.py --qdq quantizes (here at small sizes): ONNX Runtime's
    quantizer wraps every conv and matmul, and every such chain becomes an integer core
    (attention's two per head as activation x activation matmuls) computing what the QDQ graph
    computes: exactly, or within ``steps`` output quantization steps where the float graph's
    rounded float32 sums put a value on the other side of a rounding tie and the residual adds
    of ResNet-50's 16 blocks carry that step on (measured: 3)."""
    pytest.importorskip("onnxruntime")
    from tirbyoc.testing import qdq

    floating = getattr(qdq, builder)(tmp_path / "f.onnx", **kwargs)
    mod = import_onnx(ort_quantize(floating, tmp_path / "q.onnx"))
    new, report = quantized_to_integer(mod, "int8")
    assert len(report.integer) == cores and not report.kept, report.kept
    x = np.random.default_rng(3).uniform(-1, 1, shape).astype("float32")
    got, want = run(new, x), run(mod, x)
    assert np.abs(got - want).max() <= steps * output_step(tmp_path / "q.onnx") * (1 + 1e-5)


def test_matmul_integer_of_wider_operands_stays_int32_with_the_reason():
    """The MatMulInteger shape (zero-point-centred operands widened to int32) on int16
    operands: no 8-bit core takes them, so the matmul stays as it is and the report says why."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Wide:
        @R.function
        def main(a: R.Tensor((4, 8), "int16"), w: R.Tensor((8, 3), "int16"), za: R.Tensor((), "int16"),
                 zw: R.Tensor((), "int16")):
            with R.dataflow():
                x = R.subtract(R.astype(a, "int32"), R.astype(za, "int32"))
                y = R.subtract(R.astype(w, "int32"), R.astype(zw, "int32"))
                out = R.matmul(x, y, out_dtype="int32")
                R.output(out)
            return out

    new, report = quantized_to_integer(Wide, "uint8")
    assert not report.integer
    assert report.kept == [("matmul_integer", "operands not 8-bit, or not accumulated in int32")]
    assert new.script(show_meta=False).count("R.matmul(") == 1


def test_one_output_step_apart_agrees_whatever_the_float32_rounding():
    """Dequantized outputs are whole steps apart only up to float32 rounding at their
    magnitude (a step of 0.03940047 read as 0.0394011 near 40): one step agrees, two do
    not, and the count of steps is what the agreement is decided by."""
    from tirbyoc.app.running.reference import agrees, steps_apart

    step = 0.03940047
    q = np.arange(900, 1100)
    ours, theirs = (q * np.float32(step)).astype(np.float32), ((q + 1) * np.float32(step)).astype(np.float32)
    agree, err = agrees(ours, theirs, step)
    assert err > step * (1 + 1e-6)  # the rounding a bound of exactly one step had no room for
    assert agree and steps_apart(err, step) == 1
    agree, err = agrees(ours, ((q + 2) * np.float32(step)).astype(np.float32), step)
    assert not agree and steps_apart(err, step) == 2
