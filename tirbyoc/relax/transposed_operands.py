"""A matmul whose second operand is a run-time tensor transposed just for it reads that tensor
in place, as ``[..., N, K]``.

An attention exports ``q . k^T`` as ``MatMul(q, Transpose(k, perm=[..., -1, -2]))``; a decoder
reads its key cache that way on every step. TVM legalizes the two apart and never fuses an
injective producer into a matmul, so the transpose writes the whole key tensor (the cache, at
decode) and the matmul reads it again; the core then stages it once more into the panels its
register block reads. Read as ``[..., N, K]`` by the matmul itself (one PrimFunc: ``out[..., i,
j] = sum_k a[..., i, k] * b[..., j, k]``), the core's own staging copy is the only transpose
(`tirbyoc.matching`: an operand read transposed is staged transposing). A 1B-class decoder
layer at decode (`tirbyoc.testing.decoder`, batch 8 after 128 positions; Zen 4, one thread,
each call timed where the model makes it): the key transpose and q . k^T 3.08 -> 2.40 ms.

Weights are left alone: a constant transposed once is folded, and the packing stages it once
anyway. The sum runs in the order TVM's matmul runs it (``k`` ascending), so TVM's build of
the rewritten model computes what it computed before, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from tirbyoc._tvm import sym, tvm
from tirbyoc.relax.mutation import mutate_functions, reporting_pass

_FLOATS = ("float32", "float16", "bfloat16")


@dataclass
class TransposedReport:
    """How many matmuls read an operand in place instead of its transpose."""

    rewritten: int = 0

    def add(self, other: "TransposedReport") -> None:
        self.rewritten += other.rewritten

    def describe(self) -> str:
        return (f"{self.rewritten} matmul(s) read a run-time operand as [N, K] in place of its transpose"
                if self.rewritten else "")


def matmul_nt(a: te.Tensor, b: te.Tensor, out_dtype: str) -> te.Tensor:
    """``a [..., M, K] . b[..., N, K]^T`` (the leading axes equal), summed over ``k`` in order."""
    k = te.reduce_axis((0, a.shape[-1]), name="k")
    shape = [*a.shape[:-1], b.shape[-2]]

    def product(*i):
        lead, row, col = i[:-2], i[-2], i[-1]
        x, y = a[(*lead, row, k)], b[(*lead, col, k)]
        if str(a.dtype) != out_dtype:
            x, y = x.astype(out_dtype), y.astype(out_dtype)
        return te.sum(x * y, axis=k)

    return te.compute(shape, product, name="matmul")


def _swapped_last_two(call) -> bool:
    """Whether ``call`` is a permute_dims that swaps the last two axes and keeps the others."""
    if getattr(call.op, "name", None) != "relax.permute_dims":
        return False
    ndim = call.args[0].ty.ndim
    axes = call.attrs.axes
    if ndim < 2 or axes is None:
        return axes is None and ndim == 2
    return [int(x) % ndim for x in axes] == [*range(ndim - 2), ndim - 1, ndim - 2]


def _same_lead(a, b) -> bool:
    """Whether two operands' leading (batch) axes are provably the same (no broadcasting)."""
    sa, sb = a.ty, b.ty
    if sa.ndim != sb.ndim or sa.ndim < 2 or sa.shape is None or sb.shape is None:
        return False
    ana = sym.Analyzer()
    return all(ana.can_prove_equal(x, y) for x, y in zip(list(sa.shape.values)[:-2], list(sb.shape.values)[:-2]))


@mutator
class _InPlace(PyExprMutator):
    def __init__(self, mod, report: TransposedReport):
        super().__init__(mod)
        self.report = report

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.matmul" or not isinstance(call.args[1], relax.Var):
            return call
        bound = self.lookup_binding(call.args[1])
        if not isinstance(bound, relax.Call) or not _swapped_last_two(bound):
            return call
        a, b = call.args[0], bound.args[0]
        out = str(call.ty.dtype)
        if isinstance(b, tvm.ir.expr.GenericConst) or str(a.ty.dtype) not in _FLOATS \
                or a.ty.dtype != b.ty.dtype or out not in _FLOATS or not _same_lead(a, b):
            return call
        self.report.rewritten += 1
        return self.builder_.call_te(matmul_nt, a, b, out, primfunc_name_hint="matmul_nt")


def transposed_in_place(mod) -> tuple[object, TransposedReport]:
    """(``mod`` with each float ``matmul(a, permute_dims(b))`` of a run-time ``b`` that swaps
    its last two axes computed by one PrimFunc reading ``b`` in place, what was rewritten).
    Before legalization: the ops are Relax operators; a transpose no reader needs any more is
    dropped."""
    report = TransposedReport()
    new = mutate_functions(mod, _InPlace(mod, report))
    if not report.rewritten:
        return mod, report
    entries = [gv.name_hint for gv, f in new.functions.items() if isinstance(f, relax.Function)]
    return relax.transform.DeadCodeElimination(entry_functions=entries)(new), report


def TransposedInPlace(report: TransposedReport | None = None):  # noqa: N802 - a pass, named as TVM's are
    """`transposed_in_place` as an IRModule pass; ``report``, when given, is filled in."""
    return reporting_pass(transposed_in_place, report, "tirbyoc.TransposedInPlace")


__all__ = ["TransposedInPlace", "TransposedReport", "matmul_nt", "transposed_in_place"]
