"""A model's PrimFunc is checked on its call site's constants (weights, scales), drawn data
only for the rest: a requantizing layer whose real scales keep its outputs in range is
checked meaningfully where drawn scales would round every output to one value."""

import numpy as np
import pytest
from cpu_templates import runnable
from tvm import relax

import tirbyoc
from tirbyoc.errors import VerificationError
from tirbyoc.relax.bridge import offload_module
from tirbyoc.relax.call_sites import constant_argument_values, constant_arguments
from tirbyoc.testing.workloads import parse

# u8 x s8 -> i32 over 64 steps, requantized by a per-column scale (times 1e-7, as a folded
# input scale would be) around the zero point 128
REQUANT = """
@T.prim_func(s_tir=True)
def main(x: T.Buffer((16, 64), "uint8"), w: T.Buffer((64, 32), "int8"), scale: T.Buffer((32,), "float32"),
         out: T.Buffer((16, 32), "uint8")):
    acc = T.sblock_alloc_buffer((16, 32), "int32")
    for i, j, k in T.grid(16, 32, 64):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                acc[vi, vj] = 0
            acc[vi, vj] = acc[vi, vj] + T.Cast("int32", x[vi, vk]) * T.Cast("int32", w[vk, vj])
    for i, j in T.grid(16, 32):
        with T.sblock("requantize"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.Cast("uint8", T.max(T.min(
                T.round(T.Cast("float32", acc[vi, vj]) * scale[vj] * T.float32(1e-07)) + T.float32(128),
                T.float32(255)), T.float32(0)))
"""


def _model():
    """``main(x) = requant(x, W, scale)`` with W and scale Relax constants (scales of 3000-6000:
    the products' sums of ~1e5 land across the uint8 range)."""
    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, (64, 32)).astype("int8")
    scale = rng.uniform(3000, 6000, (32,)).astype("float32")
    bb = relax.BlockBuilder()
    gv = bb.add_func(parse(REQUANT).with_attr("global_symbol", "requant"), "requant")
    x = relax.Var("x", relax.TensorType((16, 64), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.call_tir(gv, [x, relax.const(weight), relax.const(scale)],
                                              relax.TensorType((16, 32), "uint8")))
        bb.emit_func_output(y)
    return bb.get(), weight, scale


def test_the_call_sites_constants_are_found_by_position():
    mod, weight, scale = _model()
    assert constant_arguments(mod) == {"requant": {1, 2}}
    values = constant_argument_values(mod)["requant"]
    assert sorted(values) == [1, 2]
    np.testing.assert_array_equal(values[1].value.numpy(), weight)
    np.testing.assert_array_equal(values[2].value.numpy(), scale)


def test_a_layer_is_checked_on_its_weights_and_scales():
    """Drawn scales in [-1, 1] round every output to the zero point (nothing checked); the
    model's own make the same offload's check meaningful, and it passes."""
    runnable("x86_avx2")
    mod, _, _ = _model()
    drawn = tirbyoc.offload(mod["requant"], "x86_avx2")
    assert drawn.offloaded and drawn.verification.passed is None, drawn.verification.describe()
    assert "one constant value" in drawn.verification.describe()
    _, report = offload_module(mod, ["x86_avx2"])
    (func,) = report.functions
    assert func.offloaded_macs == func.macs and func.verified is True, (func.verified, func.check_note)


def test_constants_of_another_shape_are_an_error_not_a_silent_check():
    mod, _, _ = _model()
    with pytest.raises(VerificationError, match="shape"):
        tirbyoc.verify(mod["requant"], mod["requant"], inputs={"w": np.zeros((3, 3), "int8")})
