"""float32 erf and exp as vector arithmetic (`tirbyoc.rewrite.rest_schedule.vector_math`): within 2 units in
the last place of the true function on dense grids, NaN / inf / signed zero / subnormal
results as libm, and no libm call left."""

import math

import numpy as np
from tvm.script import tirx as T

from tirbyoc._tvm import s_tir
from tirbyoc.decl.host import host_target
from tirbyoc.offloading.verification import compile_func, run_executable
from tirbyoc.rewrite.rest_schedule.vector_math import vectorizable_math


def _unary_func(n: int, op=T.erf):
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("op"):
                vi = T.axis.remap("S", [i])
                B[vi] = op(A[vi])

    return func


def _run(func, x: np.ndarray) -> np.ndarray:
    sch = s_tir.Schedule(func)
    loop = sch.get_loops(sch.get_sblock("op"))[0]
    sch.vectorize(sch.split(loop, [None, 16])[1])
    exe = compile_func(sch.mod["main"], host_target(), "erf")
    return run_executable(exe, [x, np.zeros_like(x)])[1], exe


def _ulps(x: np.ndarray, got: np.ndarray, fn=math.erf) -> np.ndarray:
    ref = np.array([fn(float(v)) for v in x])
    return np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)


def test_erf_within_two_ulps_and_vectorized():
    bits = np.arange(np.float32(0.5).view(np.int32), np.float32(4.0).view(np.int32), 97, dtype=np.int32)
    rng = np.random.default_rng(0)
    x = np.concatenate([bits.view(np.float32), -bits.view(np.float32), np.linspace(-6, 6, 20001, dtype=np.float32),
                        (np.float32(10) ** rng.uniform(-30, 0, 4000)).astype(np.float32)])
    x = np.ascontiguousarray(x[: len(x) // 16 * 16])
    func, count = vectorizable_math(_unary_func(len(x)))
    assert count == 1
    got, exe = _run(func, x)
    assert _ulps(x, got).max() <= 2.0
    source = exe.mod.inspect_source("ll")
    # no libm call, and TVM's vectorizer kept the loop in vectors (it scalarizes a loop whose
    # expression it cannot vectorize: scalar float multiplies then appear)
    assert "erff" not in source and "fmul float " not in source and "fmul <16 x float>" in source


def test_erf_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3.92, 100.0, -100.0, 1.125, -1.125,
                  np.nextafter(np.float32(1.125), np.float32(2)), 0.5, 2.0, -3.0], np.float32)
    func, _ = vectorizable_math(_unary_func(len(x)))
    got, _ = _run(func, x)
    assert np.isnan(got[0]) and list(got[1:3]) == [1.0, -1.0]
    assert got[3] == 0.0 and not np.signbit(got[3]) and got[4] == 0.0 and np.signbit(got[4])
    assert _ulps(x[5:], got[5:]).max() <= 2.0


def test_other_calls_and_dtypes_are_left_alone():
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((8,), "float64"), B: T.Buffer((8,), "float64")):
        for i in range(8):
            with T.sblock("erf"):
                vi = T.axis.remap("S", [i])
                B[vi] = T.erf(A[vi]) + T.exp(A[vi])

    same, count = vectorizable_math(func, ("erf", "exp"))
    assert count == 0 and same.same_as(func)


def test_exp_within_two_ulps_and_vectorized():
    """exp over the float32 range it does not round to 0 or inf, subnormal results included
    (the ulp there is the subnormal step)."""
    bits = np.arange(np.float32(0.25).view(np.int32), np.float32(2.0).view(np.int32), 97, dtype=np.int32)
    x = np.concatenate([bits.view(np.float32), -bits.view(np.float32), np.linspace(-103, 88.7, 40001, dtype=np.float32),
                        np.linspace(-1e-3, 1e-3, 4001, dtype=np.float32)])
    x = np.ascontiguousarray(x[: len(x) // 16 * 16])
    func, count = vectorizable_math(_unary_func(len(x), T.exp), ("exp",))
    assert count == 1
    got, exe = _run(func, x)
    ulps = np.abs(got.astype(np.float64) - np.exp(x.astype(np.float64)))
    ulps /= np.maximum(np.spacing(np.exp(x).astype(np.float32)), np.float32(2.0 ** -149)).astype(np.float64)
    assert ulps.max() <= 2.0, (x[ulps.argmax()], ulps.max())
    source = exe.mod.inspect_source("ll")
    assert "expf" not in source and "llvm.exp" not in source and "fmul <16 x float>" in source


def test_exp_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.8, 89.0, 1e4, -104.0, -1e4, -87.5, -100.0,
                  88.72, -0.5, 1.0, 30.0], np.float32)
    func, _ = vectorizable_math(_unary_func(len(x), T.exp), ("exp",))
    got, _ = _run(func, x)
    with np.errstate(over="ignore"):
        ref = np.exp(x)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0
    assert list(got[3:5]) == [1.0, 1.0] and list(got[5:8]) == [np.inf] * 3 and list(got[8:10]) == [0.0, 0.0]
    assert np.allclose(got[10:], ref[10:], rtol=3e-7, atol=2.0 ** -148)
