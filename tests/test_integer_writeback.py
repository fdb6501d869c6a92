"""A write-back that stores integers computed without the steps only a signed zero tells apart
(`tirbyoc.rewrite.cpu.integer_writeback`): the same integers as TVM's build, bit for bit, on the
values where the shortcuts could differ (zeros of both signs, halfway points, values too large
for ``+ z`` to be exact)."""

import numpy as np
import pytest
from tvm.script import tirx as T

from tirbyoc._tvm import tvm
from tirbyoc.rewrite.cpu.integer_writeback import integer_writebacks

N = 1 << 14
S1, S2, Z = 0.010359642095863819, 0.036594510078430176, 131.0  # ResNet-50's res2 residual


def residual_requantize(out_dtype: str, z: float, zo: float = 7.0):
    """ResNet's residual write-back: ``y = (clip(round(x / s1) + z) - z) * s1 + r``, then
    ``clip(round(y / s2) + zo)`` stored as ``out_dtype`` (an integer cast, or float32: no cast)."""
    lo, hi = (-128.0, 127.0) if out_dtype == "int8" else (0.0, 255.0)

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), R: T.Buffer((N,), "float32"), B: T.Buffer((N,), out_dtype)):
        T.func_attr({"global_symbol": "main"})
        for i in range(N):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = T.Cast(out_dtype, T.max(T.min(T.round(
                    ((T.max(T.min(T.round(A[vi] / T.float32(S1)) + T.float32(z), T.float32(hi)), T.float32(lo))
                      - T.float32(z)) * T.float32(S1) + R[vi]) / T.float32(S2)) + T.float32(zo), T.float32(hi)),
                    T.float32(lo)))

    return func


def run(func, a, r, out_dtype):
    exe = tvm.compile(func, target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros(N, out_dtype))
    exe(tvm.runtime.tensor(a), tvm.runtime.tensor(r), out)
    return out.numpy()


def edge_inputs():
    """Accumulators across the range, the halfway points of both quantizations, huge values
    (``round(x) + z`` inexact), and zeros and tiny values of both signs."""
    rng = np.random.default_rng(1)
    k = rng.integers(-400, 400, N // 8).astype(np.float32)
    halfway = np.concatenate([(k + np.float32(0.5)) * np.float32(S1), (k - np.float32(0.5)) * np.float32(S1)])
    spread = (rng.uniform(-1, 1, N // 8) * np.exp2(rng.uniform(-30, 40, N // 8))).astype(np.float32)
    huge = np.concatenate([np.float32(2.0 ** 24) * np.float32(S1) + rng.integers(-300, 300, N // 16) * np.float32(S1),
                           rng.choice([-1, 1], N // 16) * np.exp2(rng.uniform(24, 100, N // 16))]).astype(np.float32)
    zeros = np.array([0.0, -0.0, 1e-30, -1e-30, 0.4 * S1, -0.4 * S1, -0.6 * S1], np.float32)
    a = np.concatenate([halfway, spread, huge, np.resize(zeros, N // 8)]).astype(np.float32)
    a = np.resize(a, N)
    r = np.concatenate([np.zeros(N // 2, np.float32), -np.zeros(N // 4, np.float32),
                        rng.uniform(-8, 8, N // 8).astype(np.float32),
                        (rng.integers(-256, 256, N // 8) * np.float32(0.5 * S2)).astype(np.float32)])
    return a, rng.permutation(r).astype(np.float32)


@pytest.mark.parametrize("out_dtype,z,zo", [("uint8", Z, 7.0), ("int32", Z, 0.0), ("uint8", 0.0, 0.0),
                                            ("int8", -128.0, -5.0)])
def test_an_integer_store_keeps_its_integers_bit_for_bit(out_dtype, z, zo):
    func = residual_requantize(out_dtype, z, zo)
    cheaper = func.with_body(integer_writebacks(func.body))
    text = cheaper.script()
    assert "llvm.fma" in text and "copysign" not in text and " / " not in text  # no division, no signed zero
    assert "llvm.lrint" in text  # rounded by the conversion
    if z:
        assert f"- T.float32({z})" not in text and f"+ T.float32({z})" not in text  # folded into the bounds
    a, r = edge_inputs()
    np.testing.assert_array_equal(run(cheaper, a, r, out_dtype), run(func, a, r, out_dtype))


def test_a_float_store_keeps_every_step():
    func = residual_requantize("float32", Z)
    kept = func.with_body(integer_writebacks(func.body)).script()
    assert "copysign" in kept and f"- T.float32({Z})" in kept  # divided exactly, zero's sign kept


def test_a_step_that_sees_a_zeros_sign_keeps_the_exact_forms():
    """A division by a tensor's value (1 / -0 is -inf) makes the store keep the signed zero."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), D: T.Buffer((N,), "float32"), B: T.Buffer((N,), "int32")):
        for i in range(N):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = T.Cast("int32", T.round(A[vi] / T.float32(S1)) / D[vi])

    assert "copysign" in func.with_body(integer_writebacks(func.body)).script()


def vector_requantize(zo: float):
    """The write-back as tirbyoc's pipeline meets it: a parallel loop of 16-lane vectors under
    the fence mark (`cpu_epilogue.mark_writebacks`), lowered by TVM before the pass runs."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), R: T.Buffer((N,), "float32"), B: T.Buffer((N,), "uint8")):
        T.func_attr({"global_symbol": "main"})
        with T.attr("tirbyoc_fence_products", "tirbyoc_fence_products", 1):
            for j in T.parallel(N // 16):
                for i in T.vectorized(16):
                    with T.sblock("B"):
                        vi = T.axis.spatial(N, j * 16 + i)
                        B[vi] = T.Cast("uint8", T.max(T.min(T.round(
                            ((T.max(T.min(T.round(A[vi] / T.float32(S1)) + T.float32(Z), T.float32(255.0)),
                                    T.float32(0.0)) - T.float32(Z)) * T.float32(S1) + R[vi]) / T.float32(S2))
                            + T.float32(zo), T.float32(255.0)), T.float32(0.0)))

    return func


@pytest.mark.parametrize("zo", [0.0, 7.0])
def test_the_vector_write_back_through_tirbyocs_pipeline(zo, vector_target):
    from tirbyoc._tvm import build
    from tirbyoc.offloading.lowering import PIPELINE

    func = vector_requantize(zo)
    target = vector_target
    a, r = edge_inputs()
    outs = []
    for pipeline in (PIPELINE, "default"):
        exe = build(func, target, pipeline)
        out = tvm.runtime.tensor(np.zeros(N, "uint8"))
        exe(tvm.runtime.tensor(a), tvm.runtime.tensor(r), out)
        outs.append(out.numpy())
        if pipeline == PIPELINE:
            asm = exe.mod.inspect_source("asm")
            assert "vcvtps2dq" in asm and "vdivps" not in asm  # converted with rounding; no division
    np.testing.assert_array_equal(*outs)


def test_a_float_variable_keeps_the_exact_forms():
    """A let-bound float (here 1 / a tensor's value, which tells -0 from +0) hides how it was
    made: the store keeps the signed zero."""
    from tirbyoc._tvm import tirx

    a, d, b = (tirx.decl_buffer((N,), dtype, name) for name, dtype in (("A", "float32"), ("D", "float32"),
                                                                        ("B", "int32")))
    vi, q = tirx.Var("vi", "int32"), tirx.Var("q", "float32")
    store = tirx.BufferStore(b, tirx.Cast("int32", tirx.round((a[vi] + q) / tirx.FloatImm("float32", S1))), [vi])
    stmt = tirx.SeqStmt([tirx.Bind(q, tirx.FloatImm("float32", 1.0) / d[vi]), store])
    text = str(integer_writebacks(stmt))
    assert "copysign" in text and "llvm.lrint" not in text
