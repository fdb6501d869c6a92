"""Division by a constant, bit for bit, without the divider: ``round(x / c)`` in a write-back.

A quantized model's requantization is ``round(x / s_y) + z_y`` per output element (ONNX
QuantizeLinear, Relax ``quantize``), with ``s_y`` a float32 constant. TVM builds it as a
vector division (``vdivps``): a 16-lane division issues every several cycles, against two
fused multiply-adds every cycle. Measured on an Emerald Rapids Xeon (one thread, each
offloaded function of int8 ResNet-50 timed alone, both forms in turns): the residual 1x1
layers gain 5-20%, the whole of the offloaded code 1.6%. LLVM does not turn
``x / c`` into ``x * (1 / c)`` (it rounds differently), and neither may we: the offloaded
build must agree with TVM's bit for bit.

Markstein's correction does, with three multiply-adds instead of the division (Handbook of
Floating-Point Arithmetic, 2nd ed., Theorem 4.10)::

    y  = RN(1 / c)              # once, at build time (numpy, float32)
    q0 = RN(x * y)              # within one ulp of x / c
    r  = fma(-q0, c, x)         # x - q0 * c, exact
    q  = fma(r, y, q0)          # = RN(x / c)  (copysign(q, q0): a zero keeps its sign)

For binary32 ``x``, ``c`` with no overflow and no underflow on the way, ``q`` is ``x / c``
correctly rounded - the same float TVM's division gives. The exceptions are a dividend below
about 2^-100 in magnitude (the remainder ``r`` falls under the normal range and loses bits; the
tests find such cases one ulp off), a quotient below 2^-125, and a quotient that overflows
(``q0`` infinite makes ``q`` NaN). So only a division whose quotient is then rounded to an
integer (``round(x / c)``, the quantize pattern) is rewritten, and only for ``2^-60 <= |c| <=
2^100``: a dividend that small then has a quotient under 2^-40, which rounds to 0 either way,
as does a quotient below 2^-125; and an accumulator dequantized to float (|x| under 2^31 times
its scale) is nowhere near float32's overflow. ``q0``'s product is
behind an arithmetic fence (no contraction into ``r``), and both fused multiply-adds are
LLVM's ``llvm.fma`` (always fused, unlike TVM's ``fmuladd``).

`exact_divisions` runs on the write-backs `tirbyoc.rewrite.cpu.cpu_epilogue.fence_products`
visits, after TVM's lowering (vector divisions by a broadcast constant included); a function
tirbyoc did not offload keeps TVM's division (the schedule of the rest was measured with it
too, on int8 MobileNetV2's depthwise layers: no gain, so it is left as TVM builds it).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from tirbyoc._tvm import PrimCall, call_name, expr_dtype, tirx, tvm_ffi


@cache
def fence_id() -> int:
    """LLVM's id of ``llvm.arithmetic.fence`` (an intrinsic call carries the id, not the name)."""
    probe = tirx.call_llvm_pure_intrin("float32", "llvm.arithmetic.fence", tirx.FloatImm("float32", 0.0))
    return int(probe.args[0].value)


def fenced(expr):
    """``expr`` behind ``llvm.arithmetic.fence``: LLVM keeps its rounding (no contraction of a
    product into a later sum) and emits no instruction for it."""
    return tirx.call_llvm_pure_intrin(expr_dtype(expr), "llvm.arithmetic.fence", expr)


def fence_argument(expr):
    """What ``expr`` fences, where it is an arithmetic fence (`fenced`); else None."""
    if (isinstance(expr, PrimCall) and call_name(expr) == "tirx.call_llvm_pure_intrin" and len(expr.args) == 2
            and int(expr.args[0].value) == fence_id()):
        return expr.args[1]
    return None


def is_round(expr) -> bool:
    """Whether ``expr`` is ``round(...)`` or ``nearbyint(...)`` (both round ties to even)."""
    return isinstance(expr, PrimCall) and call_name(expr) in ("tirx.round", "tirx.nearbyint")


def float_constant(expr) -> float | None:
    """The float32 value of a scalar constant or of a vector broadcast of one, else None."""
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    if isinstance(expr, tirx.FloatImm) and str(expr_dtype(expr)) == "float32":
        return float(expr.value)
    return None


def constant_like(expr, value: float):
    """``value`` as a float constant of ``expr``'s element type, shaped like ``expr`` (a scalar
    or a broadcast)."""
    imm = tirx.FloatImm(expr_dtype(expr).split("x")[0], value)
    return tirx.Broadcast(imm, expr.lanes) if isinstance(expr, tirx.Broadcast) else imm


SMALLEST, LARGEST = 2.0 ** -60, 2.0 ** 100  # the divisors rewritten (see the module's docstring)


def reciprocal(c: float) -> float | None:
    """RN(1 / c) in float32, or None for a divisor the rewrite leaves alone: zero, infinite,
    NaN, or outside [2^-60, 2^100] in magnitude (see the module's docstring)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        c32 = np.float32(c)
        if not np.isfinite(c32) or not SMALLEST <= abs(float(c32)) <= LARGEST:
            return None
        return float(np.float32(1) / c32)


def exact_quotient(div, signed_zero: bool = True):
    """``div`` (``x / c``, float32) as Markstein's correction (see the module's docstring), or
    ``div`` itself where ``c`` is not a usable constant. ``signed_zero=False``: a zero quotient
    may come out as -0 where the division gives +0 or the reverse (no ``copysign``: for a
    value that ends in an integer cast, `tirbyoc.rewrite.cpu.integer_writeback`)."""
    c = float_constant(div.b)
    y = reciprocal(c) if c is not None else None
    if y is None or not str(expr_dtype(div)).startswith("float32"):
        return div
    dtype = str(expr_dtype(div))
    x, c_, y_ = div.a, div.b, constant_like(div.b, y)
    q0 = fenced(x * y_)
    r = tirx.call_llvm_pure_intrin(dtype, "llvm.fma", -q0, c_, x)
    q = tirx.call_llvm_pure_intrin(dtype, "llvm.fma", r, y_, q0)
    if not signed_zero:
        return q
    # a zero quotient keeps the dividend's sign as the division does (-0 / c is -0; the sum
    # of +0 and -0 in the last step would be +0); q0 always has the quotient's sign
    return tirx.call_llvm_pure_intrin(dtype, "llvm.copysign", q, q0)


def _rounded_quotient(call, signed_zero: bool = True):
    # a fused write-back rounds with ``round`` only: `cpu_epilogue._marked` made every
    # ``nearbyint`` one before TVM's lowering (the same ties-to-even rounding)
    if call_name(call) != "tirx.round" or not isinstance(call.args[0], tirx.Div):
        return call
    new = exact_quotient(call.args[0], signed_zero)
    return call if new.same_as(call.args[0]) else tirx.round(new)


def exact_divisions(stmt, signed_zero: bool = True):
    """``stmt`` with each ``round(x / c)`` (float32, ``c`` a constant) computed without a
    division, to the same bits (``signed_zero=False``: up to the sign of a zero, see
    `exact_quotient`)."""
    return tvm_ffi.structural_map(stmt, [(PrimCall, lambda call: _rounded_quotient(call, signed_zero))])


__all__ = ["constant_like", "exact_divisions", "exact_quotient", "fence_argument", "fence_id", "fenced",
           "float_constant", "is_round", "reciprocal"]
