"""`FastMath`: a model's transcendental functions as TVM's vectorizable approximations, opt-in.

TVM lowers ``erf``, ``tanh`` and ``exp`` to one scalar libm call per element, which LLVM
cannot put in vectors: on BERT-base (fp32, 2 threads) the GELUs' ``erf`` alone took 17 of
170 ms, more than every layer norm and softmax together. TVM ships polynomial approximations
built from multiplies, adds and bit casts (``topi.fast_erf``, ``fast_tanh``, ``fast_exp``,
``nn.fast_softmax``) that vectorize like any elementwise loop; ONNX Runtime approximates these
functions as well. This pass rewrites, in float32 only (the approximations are float32 ones):

    relax.erf, relax.tanh, relax.exp          -> topi.fast_erf / fast_tanh / fast_exp
    relax.nn.softmax                          -> topi.nn.fast_softmax
    relax.sigmoid, relax.nn.silu              -> 1 / (1 + fast_exp(-x)), times x for SiLU
    relax.nn.gelu, relax.nn.gelu_tanh         -> LegalizeOps' own formulas, fast_erf / fast_tanh

It changes values, so it is opt-in (``tirbyoc run --fast-math``) and runs before
legalization on the module that *both* builds compile: TVM's build that verifies an offload
computes the same approximations, so verification still compares like with like. Measured
over [-20, 20] against float64 (tests/test_fast_math.py keeps these true): erf within
``ERF_ABS`` and tanh within ``TANH_ABS`` absolute, exp within ``EXP_REL`` relative. TVM's own
``relax.transform.FastMathTransform`` covers the first two rows, but not GELU, sigmoid or
SiLU (which legalize to ``erf``/``exp`` themselves), and does not say what it replaced. Where
it goes::

    (QuantizedToInteger) -> FastMath -> LegalizeOps -> OffloadTIR -> ...
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from tvm import relax, topi
from tvm.relax import expr_functor

from tirbyoc._tvm import tirx
from tirbyoc.relax.mutation import mutate_functions, reporting_pass

ERF_ABS = 5e-7  # measured 4.2e-7 (at -3.32)
TANH_ABS = 5e-7  # measured 3.2e-7 (at -5.95)
EXP_REL = 1.5e-6  # measured 1.07e-6


def _sigmoid(x):
    one = tirx.const(1.0, x.dtype)
    return topi.divide(one, topi.add(one, topi.fast_exp(topi.negative(x))))


def _gelu(x):
    half = tirx.const(0.5, x.dtype)
    return x * (half + topi.fast_erf(x * tirx.const(0.5 ** 0.5, x.dtype)) * half)


def _gelu_tanh(x):
    c = lambda v: tirx.const(v, x.dtype)  # noqa: E731 - a constant of x's dtype
    inner = c(math.sqrt(2.0 / math.pi)) * x * (c(1.0) + c(0.044715) * x * x)
    return c(0.5) * x * (c(1.0) + topi.fast_tanh(inner))


def _elementwise(fn, hint: str):
    """The approximation of a one-argument op: ``fn`` of its argument, as a PrimFunc named
    ``hint`` (`BlockBuilder.call_te`)."""
    return lambda bb, call: bb.call_te(fn, call.args[0], primfunc_name_hint=hint)


# relax op -> (short name in the report, the approximation as a function of (builder, call))
APPROXIMATIONS = {
    "relax.erf": ("erf", _elementwise(topi.fast_erf, "fast_erf")),
    "relax.tanh": ("tanh", _elementwise(topi.fast_tanh, "fast_tanh")),
    "relax.exp": ("exp", _elementwise(topi.fast_exp, "fast_exp")),
    "relax.nn.softmax": ("softmax", lambda bb, call: bb.call_te(
        topi.nn.fast_softmax, call.args[0], int(call.attrs.axis), primfunc_name_hint="fast_softmax")),
    "relax.sigmoid": ("sigmoid", _elementwise(_sigmoid, "fast_sigmoid")),
    "relax.nn.silu": ("silu", _elementwise(lambda x: topi.multiply(x, _sigmoid(x)), "fast_silu")),
    "relax.nn.gelu": ("gelu", _elementwise(_gelu, "fast_gelu")),
    "relax.nn.gelu_tanh": ("gelu_tanh", _elementwise(_gelu_tanh, "fast_gelu_tanh")),
}


@dataclass
class FastMathReport:
    """What `FastMath` approximated (``replaced``: op name -> call sites), and the calls it
    left exact because they are not float32 (``kept``: op name -> call sites)."""

    replaced: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)

    def add(self, other: "FastMathReport") -> None:
        self.replaced.update(other.replaced)
        self.kept.update(other.kept)

    def describe(self) -> str:
        if not self.replaced:
            text = "fast math asked for, but the model has no erf, tanh, exp, softmax, sigmoid, SiLU or GELU in float32"
        else:
            ops = ", ".join(f"{n} {op}" for op, n in sorted(self.replaced.items()))
            text = (f"fast math: {ops} as TVM's vectorizable approximations (erf, tanh within "
                    f"{ERF_ABS:.0e}, exp within {EXP_REL:.1e} relative); the TVM build compared "
                    "against computes the same")
        if self.kept:
            text += "; left exact (not float32): " + ", ".join(f"{n} {op}" for op, n in sorted(self.kept.items()))
        return text

    def to_json(self) -> dict:
        return {"replaced": dict(self.replaced), "kept": dict(self.kept),
                "bounds": {"erf_abs": ERF_ABS, "tanh_abs": TANH_ABS, "exp_rel": EXP_REL}}


@expr_functor.mutator
class _Approximator(relax.PyExprMutator):
    """Replaces each float32 call of an op in `APPROXIMATIONS`, counting what it did."""

    def __init__(self, mod, report: FastMathReport):
        super().__init__(mod)
        self.report = report

    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op not in APPROXIMATIONS:
            return call
        name, approximate = APPROXIMATIONS[op]
        dtype = getattr(call.args[0].ty, "dtype", None)
        if str(dtype) != "float32":
            self.report.kept[name] += 1
            return call
        self.report.replaced[name] += 1
        return approximate(self.builder_, call)


def fast_math_of(mod) -> tuple[object, FastMathReport]:
    """(``mod`` with its float32 transcendental ops approximated, what was replaced). Before
    legalization: the ops are Relax operators, not yet PrimFuncs."""
    report = FastMathReport()
    new = mutate_functions(mod, _Approximator(mod, report))
    return (new if report.replaced else mod), report


def FastMath(report: FastMathReport | None = None):  # noqa: N802 - a pass, named as TVM's are
    """`fast_math_of` as an IRModule pass; ``report``, when given, is filled in."""
    return reporting_pass(fast_math_of, report, "tirbyoc.FastMath")


__all__ = ["APPROXIMATIONS", "EXP_REL", "ERF_ABS", "FastMath", "FastMathReport", "TANH_ABS", "fast_math_of"]
