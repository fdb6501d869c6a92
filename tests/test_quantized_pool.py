"""Max pooling on quantized values: ``quantize(max_pool(dequantize(q)))`` pools the 8-bit
values instead, with the same output bits."""

import numpy as np
import pytest
from tvm import relax

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.relax.quantized import quantized_to_integer

CPU = tvm.target.Target({"kind": "llvm"})


def run(mod, x):
    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=CPU)
    return relax_vm(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def pooled_qdq(dtype: str, s: float, z: int, s2: float, z2: int, scale_shape=()):
    """x -> quantize -> dequantize -> max_pool2d 3x3 / 2, padded -> quantize -> dequantize,
    as a QDQ model's stem has it (``s2, z2``: the pool's output quantization)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 3, 9, 9], "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            sc = relax.const(np.full(scale_shape, s, "float32"))
            q = bb.emit(op.quantize(x, sc, relax.const(z, dtype), axis=1, out_dtype=dtype))
            d = bb.emit(op.dequantize(q, sc, relax.const(z, dtype), axis=1, out_dtype="float32"))
            p = bb.emit(op.nn.max_pool2d(d, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]))
            q2 = bb.emit(op.quantize(p, relax.const(s2, "float32"), relax.const(z2, dtype), axis=1, out_dtype=dtype))
            out = bb.emit_output(op.dequantize(q2, relax.const(s2, "float32"), relax.const(z2, dtype), axis=1,
                                               out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype,s,z,s2,z2", [
    ("uint8", 0.05, 3, 0.05, 3),       # the pool's quantization is its input's: no requantization
    ("uint8", 0.05, 3, 0.031, 130),    # another one: the pooled integers requantized
    ("int8", 0.07, -5, 0.07, -5),
])
def test_a_quantized_max_pool_runs_on_the_integers_with_the_same_bits(dtype, s, z, s2, z2):
    """Negative inputs saturate at the dtype's minimum, the padded border's windows hold
    them: the padding (the dtype's minimum in integers, the lowest float in float) must not
    change a maximum."""
    mod = pooled_qdq(dtype, s, z, s2, z2)
    new, report = quantized_to_integer(mod, dtype)
    assert report.pools == [f"max_pool2d 3x3 on {dtype}"]
    assert "1 max pool on the quantized values" in report.describe()
    text = new.script(show_meta=False)
    pool_line = next(line for line in text.splitlines() if "max_pool2d" in line)
    assert f'dtype="{dtype}"' in pool_line
    assert text.count("R.quantize(") == (2 if (s, z) != (s2, z2) else 1)
    x = np.random.default_rng(0).uniform(-12, 12, (1, 3, 9, 9)).astype("float32")
    x[0, 0, :3, :3] = -100.0  # a corner window of saturated minimums only
    np.testing.assert_array_equal(run(new, x), run(mod, x))


def test_a_per_channel_quantized_pool_stays_float():
    """Only per-tensor parameters are taken (a per-channel scale is left as it is)."""
    mod = pooled_qdq("uint8", 0.05, 3, 0.05, 3, scale_shape=(3,))
    new, report = quantized_to_integer(mod, "uint8")
    assert report.pools == []
    pool_line = next(line for line in new.script(show_meta=False).splitlines() if "max_pool2d" in line)
    assert 'dtype="float32"' in pool_line
