"""Fold a reduction's separate init block into the reduction block (``T.init()``).

A reduction written as two loop nests - ``C[i, j] = 0`` then ``C[i, j] += ...`` - has two
blocks writing ``C``; TVM's ``cache_write`` and reindexing refuse a buffer with two writers, so
staging the output (a transposed or padded ``C``) fails. TVM has no schedule primitive that
merges them (``decompose_reduction`` only goes the other way), so this rewrites the IR: the
update block gets ``init = C[...] = <the constant>`` and the init nest is dropped. It applies
only when that is exactly equivalent: the init nest is a perfect loop nest directly before the
update's, its block stores one constant to every element of the buffer with identity indices,
and the update block's spatial iterators index every element of the buffer.
"""

from __future__ import annotations

from tirbyoc._tvm import REDUCE, SPATIAL, prim_expr, root_block, s_tir, structural_equal, sym, tirx
from tirbyoc.ir.tir_walk import always_true, perfect_nest, uses_var, with_loop_body, with_root_body


def _covers_buffer(block, indices, buffer, kinds) -> bool:
    """Every element of ``buffer`` is written: indices are distinct iterators of the given
    kinds whose extents are the buffer's dimensions."""

    seen = []
    if len(indices) != len(buffer.shape):
        return False
    for index, dim in zip(indices, buffer.shape):
        iv = next((v for v in block.iter_vars if isinstance(index, tirx.Var) and v.var.same_as(index)), None)
        if iv is None or int(iv.iter_type) not in kinds or any(iv.var.same_as(s) for s in seen):
            return False
        if not (_equal(iv.dom.extent, dim) and int(getattr(iv.dom.min, "value", 1)) == 0):
            return False
        seen.append(iv.var)
    return True


def _equal(extent, dim) -> bool:
    """An iterator's extent is the buffer's dimension: the same number, or the same size
    variable (a size known only at run time; int32 and int64 spellings alike)."""
    if hasattr(extent, "value") and hasattr(dim, "value"):
        return int(extent.value) == int(dim.value)
    return bool(sym.Analyzer().can_prove_equal(extent, dim))


def merge_separate_init(func, init_name: str, update_name: str):
    """``func`` with block ``init_name`` folded into ``update_name`` as its ``T.init()``, or
    None when the two cannot be merged exactly (see the module docstring).

    The two nests may sit at the top of the function or inside loops they share, as
    ``decompose_reduction`` leaves a scheduled reduction (``for i0, j0, i1, j1: C_init;
    for k: C_update``): there the init must write, for each instance of the shared loops, the
    element the update then reduces into (the same bindings)."""
    root = root_block(func)
    if root is None:
        return None
    body = _merge_in(root.body, init_name, update_name, top=True)
    return None if body is None else with_root_body(func, body)


def _merge_in(stmt, init_name: str, update_name: str, top: bool):
    """``stmt`` with the merge done somewhere inside it, or None if no place fits. ``top``:
    ``stmt`` is the function's body, inside no loop."""

    if isinstance(stmt, tirx.SeqStmt):
        stmts = list(stmt.seq)
        for n in range(len(stmts) - 1):
            merged = _merge_pair(stmts[n], stmts[n + 1], init_name, update_name, top)
            if merged is not None:
                new = stmts[:n] + [merged] + stmts[n + 2:]
                return new[0] if len(new) == 1 else tirx.SeqStmt(new)
        for n, child in enumerate(stmts):
            inner = _merge_in(child, init_name, update_name, top)
            if inner is not None:
                return tirx.SeqStmt(stmts[:n] + [inner] + stmts[n + 1:])
        return None
    if isinstance(stmt, tirx.For):
        inner = _merge_in(stmt.body, init_name, update_name, top=False)
        if inner is None:
            return None
        return with_loop_body(stmt, inner)
    return None


def _merge_pair(first, second, init_name: str, update_name: str, top: bool):
    """The update nest ``second`` with the init block of nest ``first`` as its ``T.init()``,
    or None unless that is exactly equivalent."""

    a, b = perfect_nest(first), perfect_nest(second)
    if a is None or b is None:
        return None
    (iloops, init_realize), (uloops, update_realize) = a, b
    init, update = init_realize.block, update_realize.block
    if str(init.name_hint) != init_name or str(update.name_hint) != update_name:
        return None
    if update.init is not None or not isinstance(init.body, tirx.BufferStore) \
            or not isinstance(update.body, tirx.BufferStore):
        return None
    store = init.body
    buffer = store.buffer
    if not update.body.buffer.same_as(buffer) or not isinstance(store.value, (prim_expr.IntImm, prim_expr.FloatImm, prim_expr.Cast)):
        return None
    if isinstance(store.value, prim_expr.Cast) and not isinstance(store.value.value, (prim_expr.IntImm, prim_expr.FloatImm)):
        return None
    if not _covers_buffer(init, list(store.indices), buffer, {SPATIAL}) \
            or not _covers_buffer(update, list(update.body.indices), buffer, {SPATIAL}):
        return None
    if not any(int(iv.iter_type) == REDUCE for iv in update.iter_vars):
        return None
    same = (_same_elements(init_realize, store.indices, iloops, update_realize, update.body.indices)
            if top or not iloops else
            _same_slice(init_realize, store.indices, iloops, update_realize, update.body.indices, uloops))
    if not same:
        return None
    # a reduction block with an init does not list its output among its reads (TVM's form)
    reads = [r for r in update.reads if not r.source.same_as(buffer)]
    new_block = s_tir.SBlock(update.iter_vars, reads, update.writes, update.name_hint,
                             update.body, tirx.BufferStore(buffer, store.value, update.body.indices),
                             update.alloc_buffers, update.match_buffers, update.annotations)
    body = s_tir.SBlockRealize(update_realize.iter_values, update_realize.predicate, new_block)
    for loop in reversed(uloops):
        body = with_loop_body(loop, body)
    return body


def _binding(realize, var):
    block = realize.block
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if iv.var.same_as(var):
            return value
    return None


def _same_elements(init_realize, init_idx, iloops, update_realize, update_idx) -> bool:
    """Whether the init writes, dimension by dimension, the element the update reduces into.

    Two separate top-level nests each cover the whole buffer (their own loops); an init without
    loops of its own inside shared loops must bind each dimension to the same expression of
    those loops."""
    if iloops:  # its own loops: it covers the whole buffer before the update starts
        return always_true(init_realize.predicate)
    for iv, uv in zip(init_idx, update_idx):
        a, b = _binding(init_realize, iv), _binding(update_realize, uv)
        if a is None or b is None or not structural_equal(a, b, map_free_vars=False):
            return False
    return True


def _same_slice(init_realize, init_idx, iloops, update_realize, update_idx, uloops) -> bool:
    """Inside shared loops, an init nest of its own loops (a pre-split reduction: ``for i0, j0:
    for i1, j1: C = 0; for k0, i1, j1, k1: C += ...``) writes, per instance of the shared
    loops, exactly the slice the update then reduces into: each dimension's binding pairs at
    most one init loop with one update loop of the same range, and with the init loops
    renamed to their partners every binding is the update's."""
    if not (always_true(init_realize.predicate) and always_true(update_realize.predicate)):
        return False
    bound = [(_binding(init_realize, iv), _binding(update_realize, uv)) for iv, uv in zip(init_idx, update_idx)]
    if any(a is None or b is None for a, b in bound):
        return False
    pairs = {}
    for a, b in bound:
        mine = [lp for lp in iloops if uses_var(a, lp.loop_var)]
        theirs = [lp for lp in uloops if uses_var(b, lp.loop_var)]
        if len(mine) > 1 or len(theirs) != len(mine):
            return False
        for i, u in zip(mine, theirs):
            if not (structural_equal(i.min, u.min) and structural_equal(i.extent, u.extent)):
                return False
            if pairs.setdefault(i.loop_var, u) is not u:
                return False
    if len(pairs) != len(iloops):
        return False  # an init loop no index uses writes its slice several times: not read here
    for a, b in bound:
        renamed = tirx.IndexMap([lp.loop_var for lp in iloops], [a], None).map_indices(
            [pairs[lp.loop_var].loop_var for lp in iloops])[0]
        if not structural_equal(renamed, b, map_free_vars=False):
            return False
    return True


__all__ = ["merge_separate_init"]
