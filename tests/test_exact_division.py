"""A quantize write-back's ``round(x / c)`` without a division, to the same bits
(`tirbyoc.rewrite.cpu.exact_division`: Markstein's correction with fused multiply-adds)."""

import numpy as np
import pytest
from tvm.script import tirx as T

from tirbyoc._tvm import tirx, tvm, tvm_ffi
from tirbyoc.rewrite.cpu.exact_division import exact_quotient, reciprocal

N = 1 << 16
SCALES = [0.03, 0.0029906476847827435, 0.0070884982123970985, 1 / 3, 7.0, 1e-6, 123.456, 0.1, -0.37,
          np.nextafter(np.float32(1), np.float32(2)), np.nextafter(np.float32(2), np.float32(1))]


def quotients(c: float, rounded: bool):
    """A PrimFunc of B[i] = A[i] / c (or round(A[i] / c)), with its division as written and
    with it rewritten."""
    c = float(np.float32(c))

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((N,), "float32"), B: T.Buffer((N,), "float32")):
        T.func_attr({"global_symbol": "main"})
        for i in range(N):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                if rounded:  # a Python bool: TVMScript parses only the branch taken
                    B[vi] = T.round(A[vi] / T.float32(c))
                else:
                    B[vi] = A[vi] / T.float32(c)

    rewritten = tvm_ffi.structural_map(func, [(tirx.Div, exact_quotient)])
    return func, rewritten


def run(func, x):
    exe = tvm.compile(func, target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros(N, "float32"))
    exe(tvm.runtime.tensor(x), out)
    return out.numpy()


def inputs(c: float) -> np.ndarray:
    """Values across the float32 range, exact multiples of ``c`` and the halfway points
    between them (where a quotient one ulp off would round to the other integer)."""
    rng = np.random.default_rng(0)
    c32 = np.float32(c)
    k = rng.integers(-300, 300, N // 4).astype(np.float32)
    spread = (rng.uniform(-1, 1, N // 4) * np.exp2(rng.uniform(-60, 60, N // 4))).astype(np.float32)
    bits = rng.integers(0x00800000, 0x7F000000, N // 4, dtype=np.int64).astype(np.uint32).view(np.float32)
    x = np.concatenate([k * c32, (k + np.float32(0.5)) * c32, spread, bits * np.sign(c32)]).astype(np.float32)
    limit = np.finfo(np.float32).max * min(1.0, abs(float(c32))) / 2  # no overflow on the way
    return np.where(np.abs(x) < limit, x, np.float32(1.0)).astype(np.float32)


@pytest.mark.parametrize("c", SCALES)
def test_the_rewritten_quotient_is_the_division_bit_for_bit(c):
    func, rewritten = quotients(c, rounded=False)
    assert "llvm.fma" in rewritten.script() and " / " not in rewritten.script().split("B[vi] =")[1]
    x = inputs(c)
    want = x / np.float32(c)  # numpy's float32 division: IEEE, correctly rounded
    # the correction's range (the module's docstring): dividend and quotient well above underflow
    normal = (np.abs(want) >= np.exp2(np.float32(-125))) & (np.abs(x) >= np.exp2(np.float32(-100)))
    assert normal.mean() > 0.9
    got = run(rewritten, x)
    assert np.array_equal(run(func, x)[normal].view(np.uint32), want[normal].view(np.uint32))
    assert np.array_equal(got[normal].view(np.uint32), want[normal].view(np.uint32))


@pytest.mark.parametrize("c", SCALES)
def test_a_rounded_quotient_agrees_everywhere_even_near_underflow(c):
    func, rewritten = quotients(c, rounded=True)
    x = inputs(c)
    u = np.random.default_rng(1).uniform(-1, 1, 2048)
    x[:1024] = (u[:1024] * np.exp2(-126.0) * abs(float(c))).astype(np.float32)  # quotients below the normal range
    x[1024:2048] = (u[1024:] * np.exp2(-101.0)).astype(np.float32)  # dividends whose remainder underflows
    assert np.array_equal(run(rewritten, x).view(np.uint32), run(func, x).view(np.uint32))


def test_a_divisor_without_a_usable_reciprocal_keeps_its_division():
    for c in (0.0, float("inf"), float("nan"), 1e-40, 1e39, 2.0 ** -61, 2.0 ** 101):
        assert reciprocal(c) is None, c
    div = tirx.Div(tirx.Var("x", "float32"), tirx.FloatImm("float32", 0.0))
    assert exact_quotient(div).same_as(div)
    var_div = tirx.Div(tirx.Var("x", "float32"), tirx.Var("s", "float32"))  # not a constant
    assert exact_quotient(var_div).same_as(var_div)
