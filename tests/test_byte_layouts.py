"""A reshape or transpose between a dequantize and a quantize of one scale and zero point moves
the 8-bit values themselves (`tirbyoc.relax.byte_layouts`): bit for bit what TVM's build of the
untouched QDQ graph computes, at every byte and at scales far from round numbers; left where the
scales differ or the round trip could lose the byte."""

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.relax.byte_layouts import byte_layouts
from tirbyoc.relax.quantized import quantized_to_integer


def attention_input(dtype: str, zero: int, scale: float, scale_after: float | None = None):
    """A projection's output as ONNX Runtime's QDQ flow leaves it for an attention: ``q`` of
    ``[32, 8, 4]`` reshaped to heads and transposed, each step dequantized and quantized again
    (``scale_after``: the transpose's quantize at another scale), then dequantized."""
    s, z = R.const(scale, "float32"), R.const(zero, dtype)
    s2 = R.const(scale if scale_after is None else scale_after, "float32")

    @I.ir_module
    class Module:
        @R.function
        def main(q: R.Tensor((32, 8, 4), dtype)):
            with R.dataflow():
                d = R.dequantize(q, s, z, out_dtype="float32", axis=-1)
                r = R.reshape(d, R.shape([32, 8, 2, 2]))
                rq = R.quantize(r, s, z, out_dtype=dtype, axis=-1)
                rd = R.dequantize(rq, s, z, out_dtype="float32", axis=-1)
                t = R.permute_dims(rd, [0, 2, 1, 3])
                tq = R.quantize(t, s2, z, out_dtype=dtype, axis=-1)
                y = R.dequantize(tq, s2, z, out_dtype="float32", axis=-1)
                R.output(y)
            return y

    return Module


def _run(mod, x):
    vm = relax_vm(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _every_byte(dtype: str) -> np.ndarray:
    lo = -128 if dtype == "int8" else 0
    return (np.arange(256 * 4) % 256 + lo).astype(dtype).reshape(32, 8, 4)


@pytest.mark.parametrize("dtype,zero,scale", [("uint8", 129, 0.0238056), ("int8", -3, 1 / 3),
                                              ("uint8", 0, 7.3e-4), ("uint8", 255, 913.7)])
def test_the_round_trips_go_and_the_layout_steps_move_bytes_bit_for_bit(dtype, zero, scale):
    mod = attention_input(dtype, zero, scale)
    moved = []
    func = byte_layouts(mod["main"], moved)
    assert moved == ["reshape", "transpose"]
    text = func.script()
    assert text.count("R.quantize") == 0 and text.count("R.dequantize") == 1, text
    new = tvm.IRModule({"main": func})
    x = _every_byte(dtype)
    np.testing.assert_array_equal(_run(new, x), _run(mod, x))


def test_another_scale_keeps_its_round_trip():
    """The transpose's quantize at another scale requantizes: that round trip stays (a byte
    table's business, not a layout's), the reshape's goes."""
    mod = attention_input("uint8", 128, 0.02, scale_after=0.03)
    moved = []
    func = byte_layouts(mod["main"], moved)
    assert moved == ["reshape"]
    assert func.script().count("R.quantize") == 1
    x = _every_byte("uint8")
    np.testing.assert_array_equal(_run(tvm.IRModule({"main": func}), x), _run(mod, x))


def test_a_scale_too_small_to_give_the_byte_back_is_left():
    mod = attention_input("uint8", 128, 1e-38)  # (q - z) * s is subnormal: bits lost
    moved = []
    func = byte_layouts(mod["main"], moved)
    assert moved == [] and func.same_as(mod["main"])


def test_the_integer_pass_runs_it_first_and_reports_it():
    mod = attention_input("uint8", 129, 0.0238056)
    new, report = quantized_to_integer(mod)
    assert report.byte_layouts == ["reshape", "transpose"]
    assert "2 reshape or transpose steps on the 8-bit values" in report.describe()
    assert report.to_json()["byte_layouts"] == ["reshape", "transpose"]
    x = _every_byte("uint8")
    np.testing.assert_array_equal(_run(new, x), _run(mod, x))
