"""``erf`` in float32 as arithmetic LLVM can put in vectors, about as accurate as libm's.

TVM lowers ``erf`` to one call of libm's scalar ``erff`` per element, which LLVM cannot
vectorize: the GELU in BERT-base's FFN1 write-back took 2 of each call's 4.6 ms (Zen 5, one
thread), more than the rest of the write-back and a third of the matmul. ONNX Runtime
evaluates erf with its own vector polynomial. `vectorizable_math` replaces each float32 ``erf``
of an offloaded function (`tirbyoc.offloading.offloader` does, for CPU targets) with:

* ``|x| <= ERF_SPLIT``: ``x + x * P(x^2)`` (the odd series' leading 1 kept out of the
  polynomial, so its rounding error stays a fraction of the result's);
* ``ERF_SPLIT < |x| < ERF_ONE``: ``1 - exp(-x^2) * Q(1 / |x|)``, with ``x^2`` split exactly
  into ``hi + lo`` by a fused multiply-add and ``exp`` by Cody-Waite range reduction, a degree-7
  polynomial and the exponent built in the float's bits;
* ``|x| >= ERF_ONE``: ``+-1`` (erfc(3.92) < half an ulp of 1); NaN stays NaN.

P and Q are least-squares fits at Chebyshev nodes (degrees 8 and 12), their coefficients
rounded to float32. Measured against ``math.erf`` on every 7th float32 of [0.5, 4] and 0.8
million values of [-5, 5], 4.4 million in all, in TVM's build: at most 1.3 units in the last
place, 0.25 on average (tests/test_vector_math.py keeps it within 2); libm's ``erff`` is
within one. Not ``--fast-math``
(`tirbyoc.relax.fast_math`, TVM's ``fast_erf``: 4.2e-7 absolute, 7 ulp near 1), which
applies to every function of a model, TVM's build included; this applies to the offloaded
ones only, and their verification compares them with TVM's build of libm's erf.
"""

from __future__ import annotations

from tirbyoc._tvm import PrimCall, call_name, expr_dtype, tirx, tvm_ffi
from tirbyoc.rewrite.foundation.steps import Step, StepKind

ERF_SPLIT = 1.125
ERF_ONE = 3.92
# erf(x) = x + x * P(x^2) for |x| <= ERF_SPLIT, P's coefficients from x^0 up
ERF_SMALL = (0.12837916612625122, -0.37612637877464294, 0.11283789575099945, -0.026866022497415543,
             0.005223376210778952, -0.0008534552762284875, 0.00011867515422636643, -1.3397837392403744e-05,
             9.393471032126399e-07)
# erfc(x) * exp(x^2) = Q(1 / x) for ERF_SPLIT < x < ERF_ONE
ERF_LARGE = (-1.8659911802387796e-05, 0.5647363662719727, -0.007272535935044289, -0.22422727942466736,
             -0.304459810256958, 1.520316243171692, -2.669376850128174, 2.9029934406280518,
             -2.1239306926727295, 1.0319023132324219, -0.30663082003593445, 0.04472019523382187,
             -0.0011683377670124173)
EXP_TAYLOR = (1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040)
LN2_HI, LN2_LO, LOG2E = 0.693359375, -2.12194440e-4, 1.4426950408889634


def _f(value: float):
    return tirx.const(value, "float32")


def _horner(coefficients, v):
    out = _f(coefficients[-1])
    for c in coefficients[-2::-1]:
        out = out * v + _f(c)
    return out


def _exp_negative(y):
    """exp(y) for y in [-16, 0] (no overflow, no subnormal result to care for)."""
    n = tirx.round(y * _f(LOG2E))
    r = (y - n * _f(LN2_HI)) - n * _f(LN2_LO)
    scale = tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"),
                                                        tirx.const(23, "int32")))
    return _horner(EXP_TAYLOR, r) * scale


EXP_LOW, EXP_HIGH = -104.0, 89.0  # exp below rounds to 0, above to inf, in float32


def exp_float32(x):
    """exp(x) for a float32 expression over the whole float32 range: `_exp_negative`'s range
    reduction and polynomial, with 2^n applied as two halves so that a subnormal result
    (x < -87.3) and an infinite one (x > 88.7) round as libm's do; NaN stays NaN."""
    # clamped by selects that keep a NaN, so that n stays within [-150, 129]
    upper = tirx.Select(x > _f(EXP_HIGH), _f(EXP_HIGH), x)
    y = tirx.Select(upper < _f(EXP_LOW), _f(EXP_LOW), upper)
    n = tirx.round(y * _f(LOG2E))
    r = (y - n * _f(LN2_HI)) - n * _f(LN2_LO)
    whole = tirx.Cast("int32", n)
    half = tirx.shift_right(whole, tirx.const(1, "int32"))  # floor(n / 2): both halves normal floats

    def power(e):
        return tirx.reinterpret("float32", tirx.shift_left(e + tirx.const(127, "int32"), tirx.const(23, "int32")))

    return _horner(EXP_TAYLOR, r) * power(half) * power(whole - half)


def erf_float32(x):
    """erf(x) for a float32 expression, as the arithmetic of the module's docstring."""
    ax = tirx.abs(x)
    small = x + x * _horner(ERF_SMALL, x * x)
    # clamped to [ERF_SPLIT, ERF_ONE] by selects that keep a NaN (min / max would clamp it)
    upper = tirx.Select(ax > _f(ERF_ONE), _f(ERF_ONE), ax)
    xc = tirx.Select(upper < _f(ERF_SPLIT), _f(ERF_SPLIT), upper)
    hi = xc * xc
    lo = tirx.call_llvm_pure_intrin("float32", "llvm.fma.f32", xc, xc, -hi)
    erfc = _exp_negative(-hi) * (_f(1.0) - lo) * _horner(ERF_LARGE, _f(1.0) / xc)
    large = _f(1.0) - erfc  # 1 from ERF_ONE on: erfc(3.92) is under half an ulp of 1
    signed = tirx.Select(x < _f(0.0), -large, large)
    # a NaN takes the second path and stays NaN through it (no isnan: TVM's vectorizer
    # scalarized the whole loop around one here)
    return tirx.Select(ax <= _f(ERF_SPLIT), small, signed)


VECTOR_FORMS = {"erf": erf_float32, "exp": exp_float32}  # TIR op -> its float32 vector form


def vectorizable_math(func, names=("erf",)):
    """(``func`` with every float32 call of the ops ``names`` (of `VECTOR_FORMS`) as their
    vector form, how many it replaced)."""
    count = []
    forms = {f"tirx.{name}": VECTOR_FORMS[name] for name in names}

    def visit(call):
        form = forms.get(call_name(call))
        if form is None or expr_dtype(call) != "float32":
            return call
        count.append(1)
        return form(call.args[0])

    body = tvm_ffi.structural_map(func.body, [(PrimCall, visit)])
    return (func if body.same_as(func.body) else func.with_body(body)), len(count)


def vector_math_for(func, target):
    """(``func`` with its float32 erf as vector arithmetic when ``target`` is a CPU (LLVM)
    target, how many it replaced); other targets call their own erf."""
    if target.kind.name != "llvm":
        return func, 0
    return vectorizable_math(func)


def vector_math_step(erfs: int) -> Step:
    """The step an offload reports for ``erfs`` replaced erf calls."""
    return Step(StepKind.VECTOR_MATH, f"{erfs} float32 erf as vector arithmetic (libm's erff is scalar; "
                                      "within 1.3 units in the last place)")


__all__ = ["ERF_ONE", "ERF_SPLIT", "VECTOR_FORMS", "erf_float32", "exp_float32", "vector_math_for", "vector_math_step",
           "vectorizable_math"]
