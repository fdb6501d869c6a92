"""A rounded quotient whose dividend takes few values, its division proven away at build time
(`tirbyoc.rewrite.cpu.finite_division`): ResNet-50's residual write-backs, the same bytes as TVM's
build on every (quantized output, residual byte) pair."""

import numpy as np
import pytest
from tvm.script import tirx as T

from tirbyoc._tvm import build, tirx, tvm
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.rewrite.cpu.finite_division import proven_quotient

# (s_x, z_x, s_r, s_y) of two of int8 ResNet-50's res3 residual write-backs: the first has a pair
# that every cheaper form rounds differently from the division, the second none
KEPT = (0.013710105791687965, 128.0, 0.034139946103096008, 0.031866896897554398)
PROVEN = (0.015003138221800327, 123.0, 0.031866896897554398, 0.035095557570457458)
N = 256 * 256 + 1024


def residual_writeback(s_x: float, z_x: float, s_r: float, s_y: float):
    """``clip(round(((clip(round(x / s_x) + z_x) - z_x) * s_x + r * s_r) / s_y))`` stored as bytes,
    ``r`` a byte: in 16-lane vectors under tirbyoc's fence mark, as the CPU schedule leaves it."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), R: T.Buffer((N,), "uint8"), B: T.Buffer((N,), "uint8")):
        T.func_attr({"global_symbol": "main"})
        with T.attr("tirbyoc_fence_products", "tirbyoc_fence_products", 1):
            for j in T.parallel(N // 16):
                for i in T.vectorized(16):
                    with T.sblock("B"):
                        vi = T.axis.spatial(N, j * 16 + i)
                        B[vi] = T.Cast("uint8", T.max(T.min(T.round(
                            ((T.max(T.min(T.round(A[vi] / T.float32(s_x)) + T.float32(z_x), T.float32(255.0)),
                                    T.float32(0.0)) - T.float32(z_x)) * T.float32(s_x)
                             + T.Cast("float32", T.Cast("int32", R[vi])) * T.float32(s_r)) / T.float32(s_y)),
                            T.float32(255.0)), T.float32(0.0)))

    return func


def separate_blocks(s_x: float, z_x: float, s_r: float, s_y: float):
    """The same as TVM's build of the model has it: the residual's dequantization its own
    block (ONNX DequantizeLinear), stored to float32 before the sum reads it, so its product
    rounds on its own (in one expression LLVM would fuse it into the sum)."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), R: T.Buffer((N,), "uint8"), B: T.Buffer((N,), "uint8")):
        T.func_attr({"global_symbol": "main"})
        D = T.sblock_alloc_buffer((N,), "float32")
        for i in range(N):
            with T.sblock("D"):
                vi = T.axis.remap("S", [i])
                D[vi] = T.Cast("float32", T.Cast("int32", R[vi])) * T.float32(s_r)
        for i in range(N):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = T.Cast("uint8", T.max(T.min(T.round(
                    ((T.max(T.min(T.round(A[vi] / T.float32(s_x)) + T.float32(z_x), T.float32(255.0)),
                            T.float32(0.0)) - T.float32(z_x)) * T.float32(s_x) + D[vi]) / T.float32(s_y)),
                    T.float32(255.0)), T.float32(0.0)))

    return func


def every_pair(s_x: float, z_x: float):
    """Accumulators that quantize to each of the 256 levels, against each of the 256 residual
    bytes; then halfway points, zeros of both signs and values far outside the range."""
    levels = (np.arange(256, dtype=np.float32) - np.float32(z_x)) * np.float32(s_x)
    a = np.repeat(levels, 256)
    r = np.tile(np.arange(256, dtype=np.uint8), 256)
    rng = np.random.default_rng(3)
    k = rng.integers(-200, 200, 1024).astype(np.float32)
    extra = np.concatenate([(k[:512] + np.float32(0.5)) * np.float32(s_x),
                            np.array([0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30], np.float32),
                            rng.uniform(-3, 3, 1024 - 518).astype(np.float32)]).astype(np.float32)
    return (np.concatenate([a, extra]).astype(np.float32),
            np.concatenate([r, rng.integers(0, 256, 1024).astype(np.uint8)]))


def run(func, pipeline, a, r, target):
    exe = build(func, target, pipeline)
    out = tvm.runtime.tensor(np.zeros(N, "uint8"))
    exe(tvm.runtime.tensor(a), tvm.runtime.tensor(r), out)
    return out.numpy()


def avx512_asm(func) -> str:
    """The machine code of ``func`` for an AVX-512 CPU (built, not run: one zmm a vector, the
    loop as written, whatever CPU runs the test)."""
    return build(func, {"kind": "llvm", "mcpu": "skylake-avx512"}, PIPELINE).mod.inspect_source("asm")


@pytest.mark.parametrize("scales", [PROVEN, KEPT], ids=["proven", "kept"])
def test_every_pair_stores_tvms_bytes(scales, vector_target):
    a, r = every_pair(scales[0], scales[1])
    mine = run(residual_writeback(*scales), PIPELINE, a, r, vector_target)
    tvms = run(separate_blocks(*scales), "default", a, r, vector_target)
    np.testing.assert_array_equal(mine, tvms)
    asm = avx512_asm(residual_writeback(*scales))
    assert "vdivps" not in asm
    # the accumulator's quantization is divided exactly (two fused multiply-adds); the residual
    # sum's division is gone where proven (none), kept exact where not (two more)
    fmas = sum(asm.count(op) for op in ("vfmadd", "vfnmadd"))
    assert fmas == (2 if scales is PROVEN else 4)


def quotient(s_r: float, s_y: float, leaf_dtype: str = "uint8"):
    """``round((q + r * s_r) / s_y)``, ``q`` a clipped rounded value, ``r`` a ``leaf_dtype`` load."""
    a = tirx.decl_buffer((16,), "float32", "A")
    r = tirx.decl_buffer((16,), leaf_dtype, "R")
    i = tirx.IntImm("int32", 0)
    q = tirx.Max(tirx.Min(tirx.round(tirx.BufferLoad(a, [i])), tirx.FloatImm("float32", 127.0)),
                 tirx.FloatImm("float32", -128.0))
    rf = tirx.Cast("float32", tirx.BufferLoad(r, [i]))
    return tirx.round((q + rf * tirx.FloatImm("float32", s_r)) / tirx.FloatImm("float32", s_y))


def test_a_provable_quotient_loses_its_division():
    new = proven_quotient(quotient(0.5, 0.25))  # a power of two: every form is exact
    assert not new.same_as(quotient(0.5, 0.25)) and "/" not in str(new)


def test_a_dividend_with_a_float_load_is_left_alone():
    call = quotient(0.031866896897554398, 0.035095557570457458, leaf_dtype="float32")
    assert proven_quotient(call).same_as(call)


def test_loads_of_two_buffers_are_two_leaves():
    """``round((r1 * s + r2 * s) / c)`` over two byte buffers takes 256 x 256 values, not 256:
    the same expression read from another buffer is another leaf."""
    from tirbyoc.rewrite.cpu.finite_division import _Domain, _evaluate

    i = tirx.IntImm("int32", 0)
    r1, r2 = (tirx.decl_buffer((16,), "uint8", name) for name in ("R1", "R2"))
    s = tirx.FloatImm("float32", 0.03)
    x = tirx.Cast("float32", tirx.BufferLoad(r1, [i])) * s + tirx.Cast("float32", tirx.BufferLoad(r2, [i])) * s
    domain = _Domain()
    values = _evaluate(x, domain)
    assert len(domain.leaves) == 2 and domain.points == 256 * 256 and values.size == 256 * 256
