"""A matmul whose operand is a run-time tensor transposed for it reads that tensor where it
lies.

An attention exports ``q . k^T`` as ``MatMul(q, Transpose(k, perm=[..., -1, -2]))`` (a decoder
reads its key cache that way on every step), and an encoder splits its heads with transposes
that only its two matmuls read (BERT's keys ``[b, s, h, d] -> [b, h, d, s]``, its queries and
values ``-> [b, h, s, d]``). TVM legalizes each apart and never fuses an injective producer
into a matmul, so the transpose writes the whole tensor and the matmul reads it again; the core
then stages it once more into the panels its register block reads (or pads its rows). Read
through the permutation by the matmul itself (one PrimFunc: ``out[..., i, j] = sum_k
A[..., i, k] * B[..., k, j]`` with ``A``, ``B`` indexing the untransposed tensors), the core's
own staging copy is the only one (`tirbyoc.matching`: an operand read transposed is staged
transposing). A 1B-class decoder layer at decode (`tirbyoc.testing.decoder`, batch 8 after 128
positions; Zen 4, one thread, each call timed where the model makes it): the key transpose and
q . k^T 3.08 -> 2.40 ms.

A constant's transpose is left alone (an imported weight: folded, and staged once by the
packing anyway). The sum runs in the order TVM's matmul runs it (``k`` ascending), so TVM's
build of the rewritten model computes what it computed before, bit for bit.
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
        return (f"{self.rewritten} matmul(s) read a run-time operand where it lies, in place of its transpose"
                if self.rewritten else "")


def _permuted(t: te.Tensor, perm):
    """An index function reading ``t`` as ``permute_dims(t, perm)`` would hold it."""
    if perm is None:
        return lambda idx: t[tuple(idx)]

    def read(idx):
        original = [None] * len(perm)
        for axis, i in zip(perm, idx):
            original[axis] = i
        return t[tuple(original)]

    return read


def matmul_in_place(a: te.Tensor, b: te.Tensor, perm_a, perm_b, out_dtype: str) -> te.Tensor:
    """``permute_dims(a, perm_a) . permute_dims(b, perm_b)`` (a ``perm`` None: as it is; the
    leading axes equal), each operand read where it lies, summed over ``k`` in order as TVM's
    matmul sums it."""
    a_at, b_at = _permuted(a, perm_a), _permuted(b, perm_b)
    a_shape = [a.shape[i] for i in perm_a] if perm_a else list(a.shape)
    b_shape = [b.shape[i] for i in perm_b] if perm_b else list(b.shape)
    k = te.reduce_axis((0, a_shape[-1]), name="k")

    def product(*i):
        lead, row, col = i[:-2], i[-2], i[-1]
        x, y = a_at((*lead, row, k)), b_at((*lead, k, col))
        if str(a.dtype) != out_dtype:
            x, y = x.astype(out_dtype), y.astype(out_dtype)
        return te.sum(x * y, axis=k)

    return te.compute([*a_shape[:-1], b_shape[-1]], product, name="matmul")


def _permutation(call) -> list[int] | None:
    """The axes of a permute_dims ``call`` that moves axes (None for anything else)."""
    if not isinstance(call, relax.Call) or getattr(call.op, "name", None) != "relax.permute_dims":
        return None
    ndim = call.args[0].ty.ndim
    axes = call.attrs.axes
    perm = list(reversed(range(ndim))) if axes is None else [int(x) % ndim for x in axes]
    return perm if perm != list(range(ndim)) else None


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

    def _source(self, operand):
        """(the tensor ``operand`` permutes, its permutation), or (``operand``, None)."""
        bound = self.lookup_binding(operand) if isinstance(operand, relax.Var) else None
        perm = _permutation(bound)
        if perm is None or isinstance(bound.args[0], tvm.ir.expr.GenericConst):
            return operand, None  # a weight's transpose is folded and packed once anyway
        return bound.args[0], perm

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.matmul":
            return call
        (a, perm_a), (b, perm_b) = self._source(call.args[0]), self._source(call.args[1])
        out, dtype = str(call.ty.dtype), str(call.args[0].ty.dtype)
        if (perm_a is None and perm_b is None) or dtype not in _FLOATS or out not in _FLOATS \
                or str(call.args[1].ty.dtype) != dtype or not _same_lead(call.args[0], call.args[1]):
            return call
        self.report.rewritten += 1
        return self.builder_.call_te(matmul_in_place, a, b, perm_a, perm_b, out, primfunc_name_hint="matmul_in_place")


def transposed_in_place(mod) -> tuple[object, TransposedReport]:
    """(``mod`` with each float matmul of a run-time operand transposed for it (any
    ``permute_dims``) computed by one PrimFunc reading that operand where it lies, what was
    rewritten).
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


__all__ = ["TransposedInPlace", "TransposedReport", "matmul_in_place", "transposed_in_place"]
