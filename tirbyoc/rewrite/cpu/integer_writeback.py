"""A write-back that stores integers, with the float steps only a signed zero would tell apart.

A quantized layer's fused write-back computes in float32 and stores 8-bit integers:
``cast(u8, clip(round(y / s_y) + z_y))``; with a residual (ResNet's bottlenecks) the
convolution's own output is quantized and dequantized first, ``(clip(round(x / s_x) + z_x) -
z_x) * s_x + r``. TVM builds each step as written: on AVX-512 that is about 26 vector
instructions per 16 outputs, and the write-back, not the convolution, is most of a residual
1x1 layer's time (ResNet-50's res2 expansions: three quarters of it, on AMX or VNNI alike).

Two of those steps exist only for a signed zero, and a value that ends in an integer cast has
no signed zero: the cast of -0.0 and of +0.0 is 0. Where every step between is one whose
result differs, for inputs that differ only in the sign of a zero, at most in the sign of a
zero (sums, differences, products, division by a constant, min, max, rounding, casts: `_BLIND`),
the stored integers are the same whichever sign each zero had. There:

* the exact division (`tirbyoc.rewrite.cpu.exact_division`) drops its ``copysign``, which only
  gave a zero quotient the dividend's sign;
* ``clip(round(q) + z, lo, hi) - z`` becomes ``clip(round(q), lo - z, hi - z)``: the same
  integers (a rounded value is an integer; one too large for ``+ z`` to be exact clips to the
  same bound either way), one addition and one subtraction fewer; only ``round(q) = -0`` comes
  out as -0 where TVM's build has +0.

Measured on an Emerald Rapids Xeon, one thread: see `bench/results/integer_writeback.json`.
"""

from __future__ import annotations

from tirbyoc._tvm import PrimCall, PrimExpr, TensorLoad, call_name, expr_dtype, tirx, tvm, tvm_ffi
from tirbyoc.rewrite.cpu.exact_division import constant_like, exact_divisions, fence_id, is_round
from tirbyoc.rewrite.cpu.finite_division import proven_quotient

_BLIND = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Min, tirx.Max, tirx.Cast, tirx.Broadcast, tirx.Ramp, TensorLoad,
          tirx.FloatImm, tirx.IntImm)
_BLIND_CALLS = ("tirx.round", "tirx.nearbyint")
LARGEST_SHIFT = 2.0 ** 16  # zero points and bounds shifted: far inside float32's exact integers (2^24)


def _integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _sign_blind(expr) -> bool:
    """Whether every node of ``expr`` maps values differing only in a zero's sign to values
    differing at most in a zero's sign (`_BLIND`; a division only by a constant)."""
    ok = [True]

    def visit(node):
        if isinstance(node, tvm.ir.Op):
            return
        if isinstance(node, tirx.Div):
            ok[0] &= isinstance(node.b, (tirx.Broadcast, tirx.FloatImm))
        elif isinstance(node, tirx.Var):
            # a load's buffer, an index or a pointer; a float scalar (a let's) hides how it was made
            ok[0] &= not (isinstance(node.ty, tvm.ir.PrimType) and expr_dtype(node).startswith(("float", "bfloat")))
        elif isinstance(node, PrimCall):
            name = call_name(node)
            ok[0] &= (name in _BLIND_CALLS if name != "tirx.call_llvm_pure_intrin"
                      else int(node.args[0].value) == fence_id())
        elif not isinstance(node, _BLIND):
            ok[0] = False

    tvm_ffi.structural_walk(expr, (PrimExpr, visit), order="pre")
    return ok[0]


def _integer_constant(expr) -> float | None:
    """The value of a float constant (or a broadcast of one) that is a small integer, else None."""
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    if isinstance(expr, tirx.FloatImm) and float(expr.value).is_integer() and abs(expr.value) <= LARGEST_SHIFT:
        return float(expr.value)
    return None


def _clip_parts(expr):
    """(inner, lower bound, upper bound) of ``max(min(inner, hi), lo)`` or ``min(max(inner, lo),
    hi)`` with small integer bounds, else None (`_clipped` builds one)."""
    outer, inner_kind = (tirx.Max, tirx.Min) if isinstance(expr, tirx.Max) else (tirx.Min, tirx.Max)
    if not isinstance(expr, outer) or not isinstance(expr.a, inner_kind):
        return None
    first, second = _integer_constant(expr.a.b), _integer_constant(expr.b)
    if first is None or second is None:
        return None
    lo, hi = (second, first) if outer is tirx.Max else (first, second)
    return expr.a.a, lo, hi


def shifted_clip(sub):
    """``clip(round(q) + z) - z`` as ``clip(round(q))`` with the bounds shifted by ``-z`` (see the
    module's docstring), or ``sub`` itself."""
    z = _integer_constant(sub.b) if isinstance(sub, tirx.Sub) else None
    parts = _clip_parts(sub.a) if z is not None else None
    if parts is None or not isinstance(parts[0], tirx.Add):
        return sub
    added, lo, hi = parts
    if _integer_constant(added.b) != z or not is_round(added.a):
        return sub
    return _clipped(sub.a, added.a, lo - z, hi - z)


def _clipped(expr, inner, lo: float, hi: float):
    """``expr``'s clip (its kind and order kept) around ``inner`` with the bounds ``lo``, ``hi``."""
    first_bound, second_bound = expr.a.b, expr.b
    first, second = (hi, lo) if isinstance(expr.a, tirx.Min) else (lo, hi)
    return type(expr)(type(expr.a)(inner, constant_like(first_bound, first)), constant_like(second_bound, second))


def rounding_conversion(cast):
    """``cast(int, clip(round(q) [+ z]))`` as ``cast(int, lrint(clip(q)) [+ z])``: the float
    clip and LLVM's ``lrint`` (AVX-512 ``vcvtps2dq``, ties to even as ``round`` here) instead of
    a rounding and a truncating conversion; the same integers (the bounds are integers, which
    rounding keeps, and ``+ z`` moves to the integers, where it is exact). Else ``cast``."""
    parts = _clip_parts(cast.value) if str(expr_dtype(cast.value)).startswith("float32") else None
    if parts is None:
        return cast
    inner, lo, hi = parts
    z = 0.0
    if isinstance(inner, tirx.Add) and _integer_constant(inner.b) is not None:
        inner, z = inner.a, _integer_constant(inner.b)
    if not is_round(inner):
        return cast
    dtype = str(expr_dtype(cast.value)).replace("float32", "int32")
    rounded = tirx.call_llvm_pure_intrin(dtype, "llvm.lrint", _clipped(cast.value, inner.args[0], lo - z, hi - z))
    if z:
        shift, bound = tirx.IntImm("int32", int(z)), cast.value.b
        rounded = rounded + (tirx.Broadcast(shift, bound.lanes) if isinstance(bound, tirx.Broadcast) else shift)
    return tirx.Cast(str(expr_dtype(cast)), rounded)


def _cheaper(store):
    value = store.value
    if not _integer(expr_dtype(value)) or not isinstance(value, tirx.Cast) or not _sign_blind(value):
        return store
    new = tvm_ffi.structural_map(value, [(tirx.Sub, shifted_clip)])
    new = tvm_ffi.structural_map(new, [(PrimCall, proven_quotient)])
    new = rounding_conversion(exact_divisions(new, signed_zero=False))
    return store if new.same_as(value) else tirx.BufferStore(store.buffer, new, store.indices)


def integer_writebacks(stmt):
    """``stmt`` with each store of an integer cast whose steps are all sign-blind computed in
    the cheaper forms of the module's docstring; every other ``round(x / c)`` divided exactly
    with its signed zero kept (`exact_divisions`)."""
    return exact_divisions(tvm_ffi.structural_map(stmt, [(tirx.BufferStore, _cheaper)]))


__all__ = ["integer_writebacks", "rounding_conversion", "shifted_clip"]
