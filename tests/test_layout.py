"""ChannelsLast: a quantized model converted to NHWC once, its values unchanged."""

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.relax.layout import channels_last, count_ops, decompose_qdq
from tirbyoc.relax.quantized import quantized_to_integer

CPU = tvm.target.Target({"kind": "llvm"})


def run(mod, *arrays):
    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=CPU)
    return relax_vm(exe, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def qdq_module(scales: np.ndarray):
    """quantize / dequantize per tensor (uint8, zero point 3), per channel (int8), a clip."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 5, 5], "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            s, z = relax.const(0.05, "float32"), relax.const(3, "uint8")
            q = bb.emit(op.quantize(x, s, z, axis=1, out_dtype="uint8"))
            d = bb.emit(op.dequantize(q, s, z, axis=1, out_dtype="float32"))
            sc, zc = relax.const(scales), relax.const(np.zeros(8, "int8"))
            p = bb.emit(op.quantize(d, sc, zc, axis=1, out_dtype="int8"))
            e = bb.emit(op.dequantize(p, sc, zc, axis=1, out_dtype="float32"))
            out = bb.emit_output(op.clip(e, -1.5, 2.0))
        bb.emit_func_output(out)
    return bb.get()


def test_quantize_dequantize_and_clip_become_elementwise_operators_with_the_same_values():
    """Written as the operators their legalization computes (which have layout rules), per
    tensor and per channel, saturating at both ends and rounding ties to even."""
    rng = np.random.default_rng(0)
    mod = qdq_module(rng.uniform(0.05, 0.2, 8).astype("float32"))
    new = decompose_qdq(mod)
    for op in ("relax.quantize", "relax.dequantize", "relax.clip"):
        assert count_ops(mod, op) > 0 and count_ops(new, op) == 0, op
    x = rng.uniform(-20, 20, (1, 8, 5, 5)).astype("float32")
    x.flat[:4] = [0.025, 0.075, -0.125, 0.175]  # ties at the 0.05 step
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def round_trip_module(shared: bool):
    """x quantized to uint8 (zero point 131) and dequantized at once, the 8-bit value also the
    output where ``shared``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 5, 5], "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            s, z = relax.const(0.07, "float32"), relax.const(131, "uint8")
            q = bb.emit(op.quantize(x, s, z, axis=1, out_dtype="uint8"))
            d = bb.emit(op.dequantize(q, relax.const(0.02, "float32"), relax.const(128, "uint8"), axis=1))
            out = bb.emit_output(relax.Tuple([d, q]) if shared else d)
        bb.emit_func_output(out)
    return bb.get()


def test_a_value_quantized_then_dequantized_skips_the_8_bit_round_trip_bit_for_bit():
    """The dequantize is computed from the clipped float (no cast to uint8, int32 and back)
    when it is the 8-bit value's only user; saturated values and ties give TVM's bits."""
    from tirbyoc.relax.layout import LayoutReport

    rng = np.random.default_rng(2)
    x = rng.uniform(-15, 15, (1, 4, 5, 5)).astype("float32")
    x.flat[:3] = [0.035, 0.105, -0.175]  # ties at the 0.07 step
    report = LayoutReport()
    new = decompose_qdq(round_trip_module(False), report)
    assert report.round_trips == 1 and count_ops(new, "relax.astype") == 0
    np.testing.assert_array_equal(run(new, x), run(round_trip_module(False), x))
    shared = LayoutReport()
    kept = decompose_qdq(round_trip_module(True), shared)
    assert shared.round_trips == 0 and count_ops(kept, "relax.astype") > 0  # the uint8 value is needed


def _quantized_cnn(tmp_path):
    pytest.importorskip("onnxruntime")
    from tirbyoc.app.model_in.loaders import import_onnx
    from tirbyoc.testing.qdq import float_cnn, ort_quantize

    mod = import_onnx(ort_quantize(float_cnn(tmp_path / "cnn.onnx"), tmp_path / "cnn_qdq.onnx"))
    return quantized_to_integer(mod, "uint8")[0]


def test_an_integer_cnn_runs_nhwc_end_to_end_bit_for_bit(tmp_path):
    """ONNX Runtime's QDQ CNN made integer: every convolution NHWC, no transposes but at the
    model's NCHW input and before its classifier's reshape, and the same output bits."""
    pytest.importorskip("onnx")
    mod = _quantized_cnn(tmp_path)
    new, report = channels_last(mod)
    assert report.convolutions == count_ops(mod, "relax.nn.conv2d") > 0
    assert report.transposes_before == 0 and report.transposes_after <= 2
    assert report.transposes_after == count_ops(new, "relax.permute_dims")
    text = new.script(show_meta=False)
    assert 'data_layout="NHWC"' in text and 'data_layout="NCHW"' not in text
    assert "channels-last" in report.describe()
    x = np.random.default_rng(1).uniform(-1, 1, [int(d) for d in mod["main"].params[0].ty.shape]).astype("float32")
    np.testing.assert_array_equal(run(new, x), run(mod, x))


@I.ir_module
class Padded:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "uint8"), w: R.Tensor((4, 4, 1, 1), "int8"),
             v: R.Tensor((8, 4, 3, 3), "int8")):
        with R.dataflow():
            a = R.astype(R.nn.conv2d(x, w, out_dtype="int32"), "uint8")
            p = R.nn.pad(a, [0, 0, 0, 0, 1, 1, 2, 0], pad_value=7.0)
            y = R.nn.conv2d(p, v, out_dtype="int32")
            R.output(y)
        return y


def test_a_pad_between_transposes_pads_in_its_own_layout():
    """``nn.pad`` has no layout rule: ConvertLayout leaves it between two transposes, which
    become one pad of the NHWC tensor (its widths permuted)."""
    new, report = channels_last(Padded)
    text = new.script(show_meta=False)
    assert "pad_width=[0, 0, 1, 1, 2, 0, 0, 0]" in text
    assert report.transposes_after == 2  # the NCHW input in, the result out
    assert report.weight_transposes == 2 and "2 computed from the weights alone" in report.describe()
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (1, 4, 6, 6)).astype("uint8")
    w = rng.integers(-2, 3, (4, 4, 1, 1)).astype("int8")
    v = rng.integers(-128, 128, (8, 4, 3, 3)).astype("int8")
    np.testing.assert_array_equal(run(new, x, w, v), run(Padded, x, w, v))


def test_a_model_without_convolutions_is_left_as_it_is():
    mod = qdq_module(np.ones(8, "float32"))
    new, report = channels_last(mod)
    assert new is mod and report.convolutions == 0


@I.ir_module
class Stem:
    @R.function
    def main(x: R.Tensor((1, 3, 12, 12), "uint8")):
        with R.dataflow():
            w = R.const(np.arange(8 * 3 * 3 * 3, dtype="int8").reshape(8, 3, 3, 3) % 7 - 3)
            y = R.nn.conv2d(x, w, strides=2, out_dtype="int32")
            R.output(y)
        return y


def test_an_image_s_three_channels_are_padded_to_the_core_s_reduction_tile():
    """With a reduction tile of 4 (vpdpbusd's bytes per lane) the stem convolution reads 4
    channels, the fourth a zero one times zero weights: the same output bits."""
    new, report = channels_last(Stem, channel_multiple=4)
    assert report.padded_channels == 1 and "1 with input channels padded" in report.describe()
    assert "pad_width=[0, 0, 0, 0, 0, 0, 0, 1]" in new.script(show_meta=False)
    x = np.random.default_rng(3).integers(0, 256, (1, 3, 12, 12)).astype("uint8")
    np.testing.assert_array_equal(run(new, x), run(Stem, x))
    assert channels_last(Stem, channel_multiple=1)[1].padded_channels == 0


def test_an_imported_relu6_follows_the_layout_with_the_same_values():
    """TVM's ONNX importer writes Clip as call_tir of a max and a min against 0-d tensors: no
    layout rule moves a call_tir, so each ReLU6 sat between two transposes. Written back as
    Relax's maximum / minimum, it runs NHWC with the convolutions, its values TVM's."""
    from tvm import topi

    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 6, 6], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w1 = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
            w2 = relax.const(rng.standard_normal((4, 8, 1, 1)).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=(1, 1)))
            lo = bb.emit(relax.const(np.float32(0.0)))
            hi = bb.emit(relax.const(np.float32(6.0)))
            y = bb.emit_te(topi.maximum, y, lo)
            y = bb.emit_te(topi.minimum, y, hi)
            out = bb.emit_output(relax.op.nn.conv2d(y, w2))
        bb.emit_func_output(out)
    mod = bb.get()
    assert count_ops(mod, "relax.call_tir") == 2
    new, report = channels_last(mod)
    assert report.transposes_after == 2 and report.decomposed == 2, report.describe()  # the input's and output's
    assert count_ops(new, "relax.call_tir") == 0
    data = rng.standard_normal((1, 8, 6, 6)).astype("float32") * 4
    got, want = run(new, data), run(mod, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # NHWC convolutions sum in another order
