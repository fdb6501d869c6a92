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

from .tir_walk import root_block


def _nest(stmt):
    """(loops outer to inner, leaf SBlockRealize) of a perfect loop nest, or None."""
    from ._tvm import s_tir, tirx

    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return (loops, stmt) if isinstance(stmt, s_tir.SBlockRealize) else None


def _covers_buffer(block, indices, buffer, kinds) -> bool:
    """Every element of ``buffer`` is written: indices are distinct iterators of the given
    kinds whose extents are the buffer's dimensions."""
    from ._tvm import tirx

    seen = []
    if len(indices) != len(buffer.shape):
        return False
    for index, dim in zip(indices, buffer.shape):
        iv = next((v for v in block.iter_vars if isinstance(index, tirx.Var) and v.var.same_as(index)), None)
        if iv is None or int(iv.iter_type) not in kinds or any(iv.var.same_as(s) for s in seen):
            return False
        if not (hasattr(iv.dom.extent, "value") and hasattr(dim, "value")
                and int(iv.dom.extent.value) == int(dim.value) and int(getattr(iv.dom.min, "value", 0)) == 0):
            return False
        seen.append(iv.var)
    return True


def merge_separate_init(func, init_name: str, update_name: str):
    """``func`` with block ``init_name`` folded into ``update_name`` as its ``T.init()``, or
    None when the two cannot be merged exactly (see the module docstring)."""
    from ._tvm import s_tir, tirx

    root = root_block(func)
    if root is None or not isinstance(root.body, tirx.SeqStmt):
        return None
    stmts = list(root.body.seq)
    found = {}
    for n, stmt in enumerate(stmts):
        nest = _nest(stmt)
        if nest is not None and str(nest[1].block.name_hint) in (init_name, update_name):
            found[str(nest[1].block.name_hint)] = (n, nest)
    if set(found) != {init_name, update_name}:
        return None
    (ni, (_, init_realize)), (nu, (uloops, update_realize)) = found[init_name], found[update_name]
    if nu != ni + 1:
        return None
    init, update = init_realize.block, update_realize.block
    if update.init is not None or type(init.body).__name__ != "BufferStore" \
            or type(update.body).__name__ != "BufferStore":
        return None
    store = init.body
    buffer = store.buffer
    if not update.body.buffer.same_as(buffer) or type(store.value).__name__ not in ("IntImm", "FloatImm", "Cast"):
        return None
    if type(store.value).__name__ == "Cast" and type(store.value.value).__name__ not in ("IntImm", "FloatImm"):
        return None
    spatial, reduce_ = 0, 2  # IterVarType: DataPar, CommReduce
    if not _covers_buffer(init, list(store.indices), buffer, {spatial}) \
            or not _covers_buffer(update, list(update.body.indices), buffer, {spatial}):
        return None
    if not any(int(iv.iter_type) == reduce_ for iv in update.iter_vars):
        return None
    # a reduction block with an init does not list its output among its reads (TVM's form)
    reads = [r for r in update.reads if not r.source.same_as(buffer)]
    new_block = s_tir.SBlock(update.iter_vars, reads, update.writes, update.name_hint,
                             update.body, tirx.BufferStore(buffer, store.value, update.body.indices),
                             update.alloc_buffers, update.match_buffers, update.annotations)
    body = s_tir.SBlockRealize(update_realize.iter_values, update_realize.predicate, new_block)
    for loop in reversed(uloops):
        body = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                        loop.thread_binding, loop.annotations)
    new_stmts = stmts[:ni] + [body] + stmts[nu + 1:]
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                            new_stmts[0] if len(new_stmts) == 1 else tirx.SeqStmt(new_stmts),
                            root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    realize = func.body
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))


__all__ = ["merge_separate_init"]
