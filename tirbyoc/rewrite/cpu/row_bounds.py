"""Bounds checks of fused run-time rows without a division per row.

`tirbyoc.rewrite.cpu.run_time_rows.fuse_run_time_rows` folds a served model's ``batch x seq``
rows into one row ``r``; the buffers still index ``[r // seq, r % seq]``, and the write-back's
predicate (the padded rows are not stored) checks each part: ``0 <= r // seq < batch and
0 <= r % seq < seq``. TVM flattens the indices back to ``r`` (``r // seq * seq + r % seq``),
but not the predicate - it cannot know that ``seq`` is positive - so every row of every
register block paid two 64-bit divisions (eight a 6-row block of int8 BERT's FFN1, about 7%
of its time with K = 768).

`simplify_row_bounds` rewrites the predicates of a scheduled function's blocks with what the
shape says: an extent of a parameter's dimension is never negative and, where it divides, not
zero - so positive - which makes ``x // s < y`` the same as ``x < y * s``, ``x % s < s`` and
``0 <= x % s`` always true, and ``0 <= x // s`` the same as ``0 <= x``. The predicate above
becomes ``0 <= r and r < batch * seq``, TVM's own simplifier drops the first (a loop index),
and no division is left.
"""

from __future__ import annotations

from tirbyoc._tvm import is_buffer, s_tir, sym, tirx, tvm_ffi


def _dimensions(func) -> list:
    """The variables among ``func``'s parameters' extents (a served model's ``batch``, ``seq``)."""
    found = []
    for buf in filter(is_buffer, func.params):
        found += [d for d in buf.shape if isinstance(d, tirx.Var) and not any(d.same_as(f) for f in found)]
    return found


def _bounds_rules(dims: list):
    """The rewrites of the module docstring for divisors among ``dims``, for `tvm_ffi.structural_map`."""
    def is_dim(s):
        return isinstance(s, tirx.Var) and any(s.same_as(d) for d in dims)

    def less(node):
        a, b = node.a, node.b
        if isinstance(a, tirx.FloorDiv) and is_dim(a.b):
            return tirx.LT(a.a, b * a.b)
        if isinstance(a, tirx.FloorMod) and is_dim(a.b) and b.same_as(a.b):
            return tirx.const(True, "bool")
        return node

    def at_most(node):
        a, b = node.a, node.b
        if not (isinstance(a, tirx.IntImm) and int(a) == 0):
            return node
        if isinstance(b, tirx.FloorMod) and is_dim(b.b):
            return tirx.const(True, "bool")
        if isinstance(b, tirx.FloorDiv) and is_dim(b.b):
            return tirx.LE(a, b.a)
        return node

    return [(tirx.LT, less), (tirx.LE, at_most)]


def simplify_row_bounds(func):
    """``func`` (scheduled, before TVM's lowering) with its blocks' predicates rewritten as the
    module docstring says; unchanged where no predicate divides by one of its extents."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    dims = _dimensions(func)
    if not dims:
        return func
    rules, analyzer = _bounds_rules(dims), sym.Analyzer()

    def realize(node):
        predicate = tvm_ffi.structural_map(node.predicate, rules)
        if predicate.same_as(node.predicate):
            return node
        return s_tir.SBlockRealize(node.iter_values, analyzer.simplify(predicate), node.block)

    body = tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, realize)])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["simplify_row_bounds"]
