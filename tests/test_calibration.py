"""Static quantization of float models (the built-ins' _int8 variants) into QDQ form, and the
shift requantization an integer ALU runs: the built-ins take the path a user's QDQ model
takes."""

import numpy as np
import pytest
from tvm import relax

from tirbyoc._tvm import build, relax_vm, to_tensor, tvm
from tirbyoc.decl.host import host_target
from tirbyoc.app.model_in.model_inputs import model_inputs
from tirbyoc.app.model_in.models import build_model, small_cnn
from tirbyoc.app.model_in.preparation import with_constant_weights
from tirbyoc.app.running.run import run_model
from tirbyoc.relax.calibration import activation_params, quantize_static, weight_params
from tirbyoc.relax.quantized import has_quantize_ops, quantized_to_integer
from tirbyoc.relax.requantize import shift_exponent
from tirbyoc.rewrite.foundation.steps import StepKind


def run(mod, arrays):
    vm = relax_vm(build(mod, host_target()), tvm.cpu())
    return vm["forward"](*[to_tensor(a) for a in arrays]).numpy()


@pytest.fixture(scope="module")
def float_cnn():
    """The float built-in CNN with its weights bound, and an input it was not calibrated on."""
    mod = small_cnn()
    bound, rest = with_constant_weights(mod, "forward", model_inputs(relax.transform.LegalizeOps()(mod), "forward", 0))
    samples = [model_inputs(relax.transform.LegalizeOps()(bound), "forward", s) for s in (1, 2)]
    return bound, rest, samples


def _constants(mod, op: str) -> list:
    """The constant arguments of every call to ``op`` in ``mod``'s forward, as numpy arrays."""
    found = []

    def visit(expr):
        if getattr(getattr(expr, "op", None), "name", None) == op:
            found.append([a.value.numpy() for a in expr.args if isinstance(a, tvm.ir.expr.GenericConst)])

    relax.analysis.post_order_visit(mod["forward"], visit)
    return found


def test_minmax_activation_parameters_are_onnxruntimes():
    scale, zero = activation_params(-1.0, 3.0, "uint8", False)  # (max - min) / 255, -min / scale
    assert scale == pytest.approx(4 / 255) and zero == 64
    scale, zero = activation_params(-1.0, 3.0, "int8", False)
    assert scale == pytest.approx(4 / 255) and zero == -128 + 64
    assert activation_params(0.5, 2.0, "uint8", False)[1] == 0  # the range is widened to hold 0
    assert activation_params(0.0, 3.0, "uint8", True) == (2.0 ** -6, 0)  # 3/255 -> the next power of two
    assert activation_params(-3.0, 1.0, "int8", True) == (2.0 ** -5, 0)  # symmetric: 3/127


def test_weights_are_symmetric_int8_per_output_channel():
    w = np.array([[[[0.5]]], [[[-0.02]]]], "float32")  # two output channels
    q, scale = weight_params(w, 0, False)
    np.testing.assert_allclose(scale, [0.5 / 127, 0.02 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q.ravel().tolist() == [127, -127]
    q, scale = weight_params(w, 0, True)  # one power-of-two scale for the tensor
    assert scale.tolist() == [2.0 ** -7] * 2 and q.ravel().tolist() == [64, -3]


def test_cnn_quantized_like_onnxruntime_is_exact_as_integers(float_cnn):
    bound, rest, samples = float_cnn
    qdq = quantize_static(bound, "forward", samples, "uint8")
    assert has_quantize_ops(qdq)
    weights = [c for c in _constants(qdq, "relax.dequantize") if c and c[0].dtype == np.int8]
    assert len(weights) == 4 and all(c[1].size == c[0].shape[0 if c[0].ndim == 4 else 1] for c in weights)
    biases = [c for c in _constants(qdq, "relax.dequantize") if c and c[0].dtype == np.int32]
    assert len(biases) == 4  # int32 at input scale x weight scale
    new, report = quantized_to_integer(qdq, "uint8")
    assert len(report.integer) == 4 and not report.kept and not report.shifted
    out, q_out, f_out = run(new, rest), run(qdq, rest), run(bound, rest)
    np.testing.assert_array_equal(out, q_out)  # the integer model is the QDQ graph's arithmetic
    step = 2 * np.abs(f_out).max() / 255  # about the output's quantization step
    assert 0 < np.abs(q_out - f_out).max() < 4 * step  # quantized, and close to the float model


def test_power_of_two_scales_requantize_by_a_shift(float_cnn):
    bound, rest, samples = float_cnn
    qdq = quantize_static(bound, "forward", samples, "int8", power_of_two=True)
    scales = [float(c[0]) for c in _constants(qdq, "relax.quantize")]
    assert scales and all(float(np.log2(s)).is_integer() for s in scales)
    new, report = quantized_to_integer(qdq, "int8", "shift")
    assert len(report.shifted) == 4 and not report.unshifted and "4 requantized by a shift" in report.describe()
    text = new.script(show_meta=False)
    assert "R.right_shift(" in text and "R.multiply(" not in text and "R.quantize(" in text  # only the input's
    out, q_out = run(new, rest), run(qdq, rest)
    step = float(_constants(qdq, "relax.dequantize")[-1][0])  # the output's scale
    assert np.abs(out - q_out).max() <= step  # ties round up (VTA), not to even (ONNX): one step at most
    same, _ = quantized_to_integer(qdq, "int8", "float")
    np.testing.assert_array_equal(run(same, rest), q_out)


def test_shift_needs_a_power_of_two_ratio(float_cnn):
    bound, _, samples = float_cnn
    qdq = quantize_static(bound, "forward", samples, "uint8")  # ONNX Runtime's scales
    _, report = quantized_to_integer(qdq, "uint8", "shift")
    assert not report.shifted and len(report.unshifted) == 4
    assert {why for _, why in report.unshifted} == {"the requantization scale is not a power of two (no shift computes it)"}
    assert shift_exponent(np.array([0.25, 0.25], "float32"), 1.0) == 2
    assert shift_exponent(np.array([0.25, 0.5], "float32"), 1.0) is None
    assert shift_exponent(np.array([2.0], "float32"), 1.0) is None  # a left shift


def test_int8_builtins_are_qdq_models_made_integer_on_the_users_path():
    qdq = build_model("cnn_int8", "int8", "shift")
    assert has_quantize_ops(qdq) and len(qdq["forward"].params) == 1  # weights are constants
    r = run_model("builtin:cnn_int8", ["vta"], repeat=1)
    assert r.verified is True and r.comparison.abs_err == 0 and r.report.coverage == 1.0
    assert len(r.quantized.shifted) == 4 and r.quantized.float_max_abs_diff <= r.quantized.step
    fused = [f for f in r.report.functions if any(st.kind is StepKind.EPILOGUE for st in f.epilogue)]
    assert fused, r.table()  # bias, shift and clip on VTA's ALU


def test_attention_matmuls_are_quantized_as_activations():
    mod = build_model("transformer_int8", "uint8", "float")
    new, report = quantized_to_integer(mod, "uint8")
    assert len(report.integer) == 6 and report.integer.count("matmul (activations)") == 2 and not report.kept
