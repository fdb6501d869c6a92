"""Whole vectors where a predicated vector loop's lanes are all real.

A register block's write-back stores only real elements: its block is predicated on the
columns (and rows) that padding added - padding known only at run time, where a served
model's attention multiplies by a run-time ``seq`` (q . k^T has ``seq`` columns). TVM's
vectorizer cannot keep a predicate that varies across lanes in a vector, so it scalarizes the
whole loop: each lane's requantize / dequantize chain one element at a time. BERT-base's int8
q . k^T with ``seq`` symbolic ran 2.1 ms a call, 0.6 with ``seq`` fixed (its epilogue is ten
operations an element over a reduction of 64).

`split_predicated_vectors` gives such a loop two versions, chosen when it runs: every lane real
(the predicate true at the first lane and at the last, which, for a conjunction of comparisons
linear in the lane, means at every lane) runs the block unpredicated, a whole vector; the
remainder at the padding's edge keeps the predicated, scalarized loop.
"""

from __future__ import annotations

from tirbyoc._tvm import s_tir, sym, tirx, tvm_ffi
from tirbyoc.ir.tir_walk import always_true, uses_var

_ORDER_COMPARISONS = (tirx.LT, tirx.LE, tirx.GT, tirx.GE)


def _conjuncts(expr) -> list:
    if isinstance(expr, tirx.And):
        return [*_conjuncts(expr.a), *_conjuncts(expr.b)]
    return [expr]


def _monotone_in(term, var) -> bool:
    """Whether ``term`` holds over a range of ``var`` wherever it holds at the range's ends: it
    does not read ``var``, or it is an order comparison of sides linear in ``var``."""
    if not uses_var(term, var):
        return True
    if not isinstance(term, _ORDER_COMPARISONS):
        return False
    return bool(sym.detect_linear_equation(term.a - term.b, [var]))


def _at(expr, var, value):
    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: value if v.same_as(var) else v)])


def _split(loop):
    if loop.kind != tirx.ForKind.VECTORIZED or not isinstance(loop.body, s_tir.SBlockRealize) \
            or not isinstance(loop.extent, tirx.IntImm):
        return loop
    realize, var = loop.body, loop.loop_var
    if always_true(realize.predicate) or not uses_var(realize.predicate, var) \
            or not all(_monotone_in(t, var) for t in _conjuncts(realize.predicate)):
        return loop
    last = loop.min + (int(loop.extent) - 1)
    every_lane = tirx.And(_at(realize.predicate, var, loop.min), _at(realize.predicate, var, last))
    whole = s_tir.SBlockRealize(realize.iter_values, tirx.const(True, "bool"), realize.block)
    fast = tirx.For(var, loop.min, loop.extent, loop.kind, whole, loop.thread_binding, loop.annotations)
    # bound to a flag: TVM's CompactBufferAllocation narrows buffers by the conditions around
    # their uses and overflows on run-time ones (see run_time_rows)
    flag = tirx.Var("all_lanes_real", "bool")
    return tirx.SeqStmt([tirx.Bind(flag, every_lane), tirx.IfThenElse(flag, fast, loop)])


def split_predicated_vectors(func):
    """``func`` (scheduled, before TVM's lowering) with each vectorized loop over a block
    predicated per lane given a whole-vector version for where every lane is real (see the
    module's docstring). Predicates that are not conjunctions of comparisons linear in the
    lane are left as they are."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.For, _split)])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["split_predicated_vectors"]
