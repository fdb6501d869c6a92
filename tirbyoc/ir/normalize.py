"""Bring a block that a schedule already transformed back to one loop per block iterator.

A PrimFunc may arrive scheduled: its loops split, reordered or fused (``for i0, j0, i1, j1,
k``, with ``vi = i0 * 16 + i1``). The rewrite engine re-tiles a block for an intrinsic with
``transform_block_layout``, which wants the block's own loops to map one to one onto its
iterators. When the block's loop nest is perfect (nothing else inside it), its bindings are a
bijection of those loops (TVM's ``detect_iter_map`` proves it) and it has no predicate, the
nest can be rebuilt as ``for vi, vj, vk`` over the iterators' domains: every instance still
runs exactly once, only in another order, which a reduction's semantics allow.

`simplify_indices` is the other normalisation: TVM's own ``te`` workloads write indices such
as ``co // 64 * 64 + rc`` that are plain ``rc`` within the iterators' bounds (TVM's
``StmtSimplify`` proves it); read unsimplified, the output channel seems to index the input.

`unique_buffer_names` gives every parameter buffer of a function its own name: Relax's
legalization can name two parameters alike (``lv36`` and another ``lv36``, printed
``lv36_1``), and the rewrite finds a block's regions and staged copies by buffer name.
"""

from __future__ import annotations

from tirbyoc._tvm import (
    TensorLoad,
    iter_stores,
    prim_expr,
    root_block,
    s_tir,
    structural_equal,
    sym,
    tirx,
    tvm,
    tvm_ffi,
)
from tirbyoc.ir.tir_walk import (
    always_true,
    iter_exprs,
    perfect_nest,
    uses_var,
    with_loop_body,
    with_root_body,
)


def _trivial(loops, realize) -> bool:
    vals = list(realize.iter_values)
    return len(loops) == len(vals) and all(
        isinstance(v, tirx.Var) and v.same_as(lp.loop_var) for v, lp in zip(vals, loops))


def is_bijection(exprs, dom: dict) -> bool:
    """Whether ``exprs`` map the iterators of ``dom`` (var -> Range) one to one onto their
    joint range (TVM's ``detect_iter_map``, bijective); False where TVM cannot analyse them."""
    try:
        res = sym.detect_iter_map(list(exprs), dom, check_level=sym.iter_affine_map.IterMapLevel.Bijective)
    except Exception:  # noqa: BLE001 - TVM raises on forms it cannot analyse: not ours to fix
        return False
    return len(res.indices) == len(exprs)


def bijective_binding(loops, realize) -> bool:
    """Whether the block's instances are exactly the loops' iterations, once each: loops the
    bindings do not use have extent 1, an iterator bound to a constant has a one-element
    domain at that constant, and the other bindings are a bijection (`is_bijection`)."""

    values = list(realize.iter_values)
    used = [lp for lp in loops if any(uses_var(v, lp.loop_var) for v in values)]
    if any(int(getattr(lp.extent, "value", 0)) != 1 for lp in loops if lp not in used):
        return False  # a loop the block does not depend on would repeat its instances
    varying = []
    for iv, v in zip(realize.block.iter_vars, values):
        if isinstance(v, tirx.IntImm):
            if int(getattr(iv.dom.extent, "value", 0)) != 1 or int(v.value) != int(getattr(iv.dom.min, "value", -1)):
                return False
        else:
            varying.append(v)
    if not varying:
        return True
    return is_bijection(varying, {lp.loop_var: tvm.ir.Range.from_min_extent(lp.min, lp.extent) for lp in used})


def _rebuilt(loops, realize):
    """One serial loop per block iterator, over its domain, bound trivially."""
    block = realize.block
    new_vars = [tirx.Var(f"l{str(iv.var.name)}", iv.var.ty) for iv in block.iter_vars]
    body = s_tir.SBlockRealize(new_vars, realize.predicate, block)
    for iv, var in reversed(list(zip(block.iter_vars, new_vars))):
        body = tirx.For(var, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, body)
    return body


def _replace(stmt, name: str):
    """``stmt`` with ``name``'s loop nest rebuilt, or None where it is not inside or cannot be."""
    nest = perfect_nest(stmt)
    if nest is not None and nest[0]:
        loops, realize = nest
        if str(realize.block.name_hint) != name:
            return None
        if _trivial(loops, realize) or not always_true(realize.predicate) or not bijective_binding(loops, realize):
            return None
        return _rebuilt(loops, realize)
    if isinstance(stmt, tirx.SeqStmt):
        stmts = list(stmt.seq)
        for n, child in enumerate(stmts):
            new = _replace(child, name)
            if new is not None:
                return tirx.SeqStmt(stmts[:n] + [new] + stmts[n + 1:])
        return None
    if isinstance(stmt, tirx.For):
        new = _replace(stmt.body, name)
        if new is None:
            return None
        return with_loop_body(stmt, new)
    return None


def trivial_loops(func, block_name: str):
    """``func`` with block ``block_name``'s loop nest rebuilt as one loop per iterator, or
    None when it already is, or when that would not be exactly equivalent (see the module
    docstring)."""
    root = root_block(func)
    if root is None:
        return None
    body = _replace(root.body, block_name)
    return None if body is None else with_root_body(func, body)


def _divides_in_index(func) -> bool:
    """Whether some buffer access index holds a division or modulo (what simplification can
    remove; other functions are left exactly as they came)."""
    div = (prim_expr.Div, prim_expr.Mod, prim_expr.FloorDiv, prim_expr.FloorMod)
    accesses = [n for n in iter_exprs(func.body) if isinstance(n, TensorLoad)]
    accesses += list(iter_stores(func.body))
    return any(isinstance(e, div) for a in accesses for i in a.indices for e in iter_exprs(i))


def simplify_indices(func):
    """``func`` with its indices simplified within its iterators' bounds (TVM's
    ``StmtSimplify``) when one holds a division or modulo, else ``func`` itself."""
    if root_block(func) is None or not _divides_in_index(func):
        return func
    try:
        new = s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]
    except Exception:  # noqa: BLE001 - left as it is; matching reports what it cannot read
        return func
    return func if structural_equal(new, func) else new


def unique_buffer_names(func):
    """``func`` with parameter buffers that share a name renamed ``name_1``, ``name_2``...
    (as TVM's printer shows them), else ``func`` itself. Only names change."""
    params = list(func.params)
    names = [str(p.name) for p in params]
    if len(set(names)) == len(names):
        return func
    taken, renamed = set(names), {}
    for k, buf in enumerate(params):
        if names[k] not in names[:k]:
            continue
        n = 1
        while f"{names[k]}_{n}" in taken:
            n += 1
        new = f"{names[k]}_{n}"
        taken.add(new)
        renamed[k] = tirx.decl_buffer(buf.shape, str(buf.dtype), new, data=buf.data,
                                      strides=list(buf.strides), elem_offset=buf.elem_offset,
                                      scope=str(buf.scope()), data_alignment=buf.data_alignment,
                                      offset_factor=buf.offset_factor)
    olds = {k: params[k] for k in renamed}

    def swap(buf):
        for k, old in olds.items():
            if buf.same_as(old):
                return renamed[k]
        return buf

    return tvm_ffi.structural_map(func, [(tirx.Buffer, swap)])


__all__ = ["bijective_binding", "is_bijection", "simplify_indices", "trivial_loops", "unique_buffer_names"]
