"""`Bfloat16`: a float model's convolutions and matmuls read bfloat16 and accumulate in float32.

bfloat16 keeps float32's exponent and 8 of its 24 mantissa bits: a product of two bfloat16
numbers is exact in float32, so a dot product of bfloat16 operands summed in float32 loses
only what rounding the operands lost. CPUs multiply them at twice the float32 rate or more
(AVX512_BF16's ``vdpbf16ps``: two products per float32 lane; AMX-BF16's ``tdpbf16ps``: 16 x 16
x 32 a step), which is why OpenVINO runs float models in bfloat16 by default where the CPU has
it. tirbyoc does it only when asked (``tirbyoc run --precision bf16``): it changes values.

The pass, before legalization, on each float32 ``conv1d`` / ``conv2d`` / ``conv3d`` /
``matmul``::

    conv2d(x, w)  ->  conv2d(astype(x, bfloat16), astype(w, bfloat16), out_dtype=float32)

and leaves everything else (bias, normalization, softmax, activations) in float32. A weight
bound as a constant is converted once: `tirbyoc.app.model_in.preparation.with_constant_weights` folds
its ``astype`` at build time; an activation's ``astype`` is an elementwise op that TVM's
fusion puts into the write-back of the layer that produced it. Legalized, each such layer
reads ``float32(x_bf16[...]) * float32(w_bf16[...])`` - the pattern the bf16 templates
(``x86_amx_bf16``, ``x86_avx512_bf16``) declare; a float32 template still takes it through
its exact widening copies (`tirbyoc.matching.casts`).

Both builds of a run compile the converted module, so an offload is verified against TVM's
own bfloat16 build; the accuracy the conversion costs is measured separately, against the
float32 model as given (`Bf16Report`: maximum error relative to the output's scale, argmax
agreement per row), as OpenVINO users check when they accept its bfloat16 default.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tvm import relax
from tvm.relax import expr_functor

from tirbyoc.relax.mutation import mutate_functions, reporting_pass

@dataclass
class Bf16Report:
    """What `Bfloat16` converted (``converted``: op -> call sites), what it left in float32
    because it was not float32 x float32 (``kept``), and - once both builds ran - the converted
    model's accuracy against the float32 model as given: ``max_rel_err`` (the largest output
    difference over the float32 output's largest magnitude) and ``argmax_agreement`` (the
    fraction of output rows whose largest entry is the same; None for a one-element output)."""

    converted: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)
    pools: int = 0  # max pools run on bfloat16 (their output only read narrowed)
    max_rel_err: float | None = None
    argmax_agreement: float | None = None
    rows: int = 0

    @property
    def rounding(self) -> str | None:
        """The dtype the converted model rounds its activations to between layers (what the
        whole model's output is compared at: `tirbyoc.app.running.run.compare`); None when nothing
        was converted."""
        return "bfloat16" if self.converted else None

    def add(self, other: "Bf16Report") -> None:
        self.converted.update(other.converted)
        self.kept.update(other.kept)
        self.pools += other.pools

    def measure(self, bf16_out: np.ndarray, fp32_out: np.ndarray) -> None:
        """Fill in the accuracy of ``bf16_out`` against ``fp32_out`` (the same inputs)."""
        ref = np.asarray(fp32_out, np.float64)
        got = np.asarray(bf16_out, np.float64)
        scale = float(np.abs(ref).max(initial=0.0)) or 1.0
        self.max_rel_err = float(np.abs(got - ref).max(initial=0.0)) / scale
        if ref.ndim >= 1 and ref.shape[-1] > 1:
            a, b = ref.reshape(-1, ref.shape[-1]), got.reshape(-1, ref.shape[-1])
            self.rows = a.shape[0]
            self.argmax_agreement = float(np.mean(a.argmax(-1) == b.argmax(-1)))

    def describe(self) -> str:
        if not self.converted:
            return "bf16 asked for, but the model has no float32 convolution or matmul"
        ops = ", ".join(f"{n} {op}" for op, n in sorted(self.converted.items()))
        text = f"bf16: {ops} read bfloat16 operands, accumulate in float32"
        if self.pools:
            text += f"; {self.pools} max pool{'' if self.pools == 1 else 's'} on bfloat16"
        if self.kept:
            text += "; left as they are (not float32): " + ", ".join(
                f"{n} {op}" for op, n in sorted(self.kept.items()))
        if self.max_rel_err is not None:
            text += f"; against the float32 model: max error {self.max_rel_err:.2e} of the output's scale"
        if self.argmax_agreement is not None:
            text += f", argmax agrees on {self.argmax_agreement:.1%} of {self.rows} rows"
        return text

    def to_json(self) -> dict:
        return {"converted": dict(self.converted), "kept": dict(self.kept), "max_pools_on_bf16": self.pools,
                "max_rel_err": self.max_rel_err, "argmax_agreement": self.argmax_agreement,
                "rows": self.rows}


def _dtype(expr) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def _conv(make):
    """A convolution's call with new operands and ``out_dtype``, every other attribute kept."""

    def rebuild(call, data, weight, out_dtype):
        at = call.attrs
        return make(data, weight, strides=at.strides, padding=at.padding, dilation=at.dilation,
                    groups=at.groups, data_layout=at.data_layout, kernel_layout=at.kernel_layout,
                    out_layout=at.out_layout, out_dtype=out_dtype)

    return rebuild


# relax op -> (short name in the report, the call rebuilt from (call, operands..., out_dtype))
CONVERTED_OPS = {
    "relax.nn.conv1d": ("conv1d", _conv(relax.op.nn.conv1d)),
    "relax.nn.conv2d": ("conv2d", _conv(relax.op.nn.conv2d)),
    "relax.nn.conv3d": ("conv3d", _conv(relax.op.nn.conv3d)),
    "relax.matmul": ("matmul", lambda call, a, b, out_dtype: relax.op.matmul(a, b, out_dtype=out_dtype)),
}


@expr_functor.mutator
class _Narrower(relax.PyExprMutator):
    """Rewrites each float32 x float32 call of `CONVERTED_OPS`, counting what it did."""

    def __init__(self, mod, report: Bf16Report):
        super().__init__(mod)
        self.report = report
        self.narrowed = {}  # a float32 operand -> its bfloat16 value, emitted once for all its readers

    def visit_binding_block_(self, block):
        self.narrowed = {}  # a value emitted in one block is not reused in another
        return super().visit_binding_block_(block)

    def visit_dataflow_block_(self, block):
        self.narrowed = {}
        return super().visit_dataflow_block_(block)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op not in CONVERTED_OPS:
            return call
        name, rebuild = CONVERTED_OPS[op]
        out = str(getattr(call.attrs, "out_dtype", "") or "")
        if any(_dtype(a) != "float32" for a in call.args[:2]) or out not in ("", "void", "float32"):
            self.report.kept[name] += 1
            return call
        self.report.converted[name] += 1
        args = [self._narrowed(a) for a in call.args[:2]]
        return rebuild(call, *args, "float32")

    def _narrowed(self, operand):
        """``astype(operand, bfloat16)``; for a max pool's output, the pool of the narrowed
        input instead: rounding to bfloat16 is non-decreasing, so it commutes with a maximum
        (the same values), and the pool then reads and writes half the bytes (the layer
        before it stores bfloat16, its cast fused into its write-back). Emitted once per
        operand, whatever number of convolutions read it; a float32 reader of the pool keeps
        the float32 pool beside it."""
        if isinstance(operand, relax.Var) and operand in self.narrowed:
            return self.narrowed[operand]
        value = self._narrow(operand)
        if isinstance(operand, relax.Var):
            self.narrowed[operand] = value
        return value

    def _narrow(self, operand):
        bound = self.lookup_binding(operand) if isinstance(operand, relax.Var) else None
        if isinstance(bound, relax.Call) and getattr(bound.op, "name", None) == "relax.nn.max_pool2d":
            at = bound.attrs
            narrow = self.builder_.emit(relax.op.astype(bound.args[0], "bfloat16"))
            self.report.pools += 1
            return self.builder_.emit(relax.op.nn.max_pool2d(
                narrow, pool_size=at.pool_size, strides=at.strides, padding=at.padding, dilation=at.dilation,
                ceil_mode=at.ceil_mode, count_include_pad=at.count_include_pad, layout=at.layout,
                out_layout=at.out_layout))
        return self.builder_.emit(relax.op.astype(operand, "bfloat16"))


def bf16_of(mod) -> tuple[object, Bf16Report]:
    """(``mod`` with its float32 convolutions and matmuls reading bfloat16, what was
    converted). Before legalization: the ops are Relax operators, not yet PrimFuncs."""
    report = Bf16Report()
    new = mutate_functions(mod, _Narrower(mod, report))
    if report.pools:  # the float32 pools no convolution reads any more (every function kept)
        entries = [gv.name_hint for gv, f in new.functions.items() if isinstance(f, relax.Function)]
        new = relax.transform.DeadCodeElimination(entry_functions=entries)(new)
    return (new if report.converted else mod), report


def Bfloat16(report: Bf16Report | None = None):  # noqa: N802 - a pass, named as TVM's are
    """`bf16_of` as an IRModule pass; ``report``, when given, is filled in."""
    return reporting_pass(bf16_of, report, "tirbyoc.Bfloat16")


__all__ = ["Bf16Report", "Bfloat16", "CONVERTED_OPS", "bf16_of"]
