"""Staging copies that move nothing, removed: the intrinsic reads or writes the parameter in
place, through a view of it.

The matcher stages an operand whose intrinsic axis is fused from several loops (a 1x1
convolution's pixels ``y * W + x``, an NHWC activation's rows ``(n, y, x)``) through a reindexed
copy, because TVM's tensorize hands an intrinsic a *region* of a buffer, never a reshaped one.
Many of those copies put every element at the address it already had: ``D[0, c, y, x]``
copied into ``D_global[c, y * 14 + x]``, an OIHW 1x1 weight into ``[1, 1, O, I]``, the
``[O, pixels]`` result written back into ``O[0, o, y, x]``. Each such copy is a pass over the
tensor per call (a read and a write of a megabyte on a ResNet-50 layer) for nothing.

`read_in_place` finds them among a scheduled function's top-level loop nests and replaces the
copy's buffer with a view of the parameter (TVM's ``DeclBuffer`` bound to the parameter's
data; ``D_global = D.view(256, 196)`` in TVMScript), dropping the copy. It proves, for each:

- the nest is one block ``G[v] = X[f(v)]`` (a read) or ``X[f(v)] = G[v]`` (a write-back), no
  predicate, one dtype; ``X`` a compact parameter, ``G`` a ``global`` allocation of as many
  elements;
- the loops run the block's iterators once each, and ``G``'s flat index is a bijection of the
  iterators onto all of ``G`` (`tirbyoc.ir.normalize`: ``detect_iter_map``, bijective): the
  copy covers ``G`` once;
- the flat indices of ``G`` and ``X`` are equal (``Analyzer.can_prove_equal``);
- no other nest touches ``X``; a read comes before every other nest using ``G`` and none of
  them writes ``G`` (it would write the caller's input); a write-back comes after them all.

Anything else keeps its copy. Padded copies (more elements), transposes and packings (other
addresses) and scratchpad stagings (another scope) are never identities.
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc._tvm import PrimCall, TensorLoad, child_stmts, is_buffer, iter_blocks, root_block, sym, tirx, tvm_ffi
from tirbyoc.ir.normalize import bijective_binding, is_bijection
from tirbyoc.ir.tir_walk import always_true, perfect_nest, with_root_body

_MAX_ELEMENTS = 2 ** 31 - 1  # flat indices are proved in int32


@dataclass(frozen=True)
class InPlace:
    """A copy removed: ``copy`` (the staging buffer) is now a view of parameter ``param``."""

    copy: str
    param: str
    kind: str  # "read" or "write"
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.param} as [{', '.join(map(str, self.shape))}]"


def in_place_note(done: list[InPlace]) -> str:
    """One sentence for a report: which parameters are now used in place, as what."""
    return f"in place: {', '.join(d.describe() for d in done)} (their copies moved nothing)"


def read_in_place(func) -> tuple[object, list[InPlace]]:
    """(``func`` with its identity staging copies replaced by views of its parameters, what
    was removed); ``func`` itself when there is none (see the module's docstring). A chain of
    them (a 1x1 convolution's identity pad, then the GEMM's staging of the padded buffer) is
    removed copy by copy: a view of a parameter is a parameter to the next round."""
    done = []
    while True:
        func, found = _one_round(func)
        if not found:
            return func, done
        done.extend(found)


def _one_round(func) -> tuple[object, list[InPlace]]:
    root = root_block(func)
    if root is None:
        return func, []
    nests = child_stmts(root.body) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    params = _parameters(func, nests)
    allocs = list(root.alloc_buffers)
    views, done = {}, []  # staging buffer -> (view, parameter)
    kept = list(nests)
    for i, nest in enumerate(nests):
        found = _identity_copy(nest, [b for b, _ in params])
        if found is None:
            continue
        g, x, kind = found
        owner = next(p for b, p in params if b.same_as(x))
        family = [b for b, p in params if p.same_as(owner)]
        if not any(b.same_as(g) for b in allocs) or not _alone(nests, i, g, family, kind):
            continue
        views[g] = (tirx.decl_buffer(g.shape, g.dtype, str(g.name)), owner)
        allocs = [b for b in allocs if not b.same_as(g)]
        kept[i] = None
        done.append(InPlace(str(g.name), str(owner.name), kind, tuple(int(e) for e in g.shape)))
    if not done:
        return func, []
    rest = [n for n in kept if n is not None]

    def swap(buf):
        for g, (view, _) in views.items():
            if buf.same_as(g):
                return view
        return buf

    body = tvm_ffi.structural_map(rest[0] if len(rest) == 1 else tirx.SeqStmt(rest), [(tirx.Buffer, swap)])
    decls = [tirx.DeclBuffer(view, data=x.data) for view, x in views.values()]
    return with_root_body(func, tirx.SeqStmt(decls + [body]), allocs), done


def _parameters(func, nests) -> list[tuple]:
    """The buffers a copy may be an identity of, each to the parameter it is: the function's
    buffer parameters, and the views of them an earlier round declared (compact ``DeclBuffer``
    statements atop the root block bound to a parameter's data), as (buffer, parameter) pairs
    (a list: a Buffer is a Var, whose ``==`` builds an expression)."""
    params = [(p, p) for p in func.params if is_buffer(p)]
    for stmt in nests:
        if isinstance(stmt, tirx.DeclBuffer) and not list(stmt.buffer.strides):
            owner = next((p for b, p in params if _data_of(stmt, b)), None)
            if owner is not None:
                params.append((stmt.buffer, owner))
    return params


def identity_copies(func) -> list:
    """The buffers that top-level copies of ``func`` fill with a parameter's elements at their
    own addresses (directly or through such a copy): what `read_in_place` may make views of,
    if nothing else touches them; a schedule that would move such a copy elsewhere leaves it."""
    root = root_block(func)
    if root is None:
        return []
    nests = child_stmts(root.body) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    known = [p for p, _ in _parameters(func, nests)]
    found = []
    for nest in nests:
        copy = _identity_copy(nest, known)
        if copy is not None and copy[2] == "read":
            known.append(copy[0])
            found.append(copy[0])
    return found


def _data_of(decl, buffer) -> bool:
    """Whether ``decl`` binds its view to ``buffer``'s data (in TVM 0.27 ``Buffer.data`` is a
    fresh ``tirx.buffer_data(buffer)`` call each time it is read: compare what it names)."""
    data = decl.data
    return (isinstance(data, PrimCall) and len(data.args) == 1 and str(data.op.name) == "tirx.buffer_data"
            and data.args[0].same_as(buffer))


def _identity_copy(nest, params):
    """(staging buffer, parameter, "read" | "write") when ``nest`` is a whole copy between
    them that keeps every element's address, else None."""
    found = perfect_nest(nest)
    if found is None:
        return None
    loops, realize = found
    blk = realize.block
    store = blk.body
    if (not always_true(realize.predicate) or blk.init is not None or blk.alloc_buffers
            or blk.match_buffers or not isinstance(store, tirx.BufferStore)
            or not isinstance(store.value, TensorLoad)):
        return None
    dst, src = store.buffer, store.value.source
    src_param, dst_param = _holds(params, src), _holds(params, dst)
    if src_param and not dst_param:
        g, x, kind, g_idx, x_idx = dst, src, "read", store.indices, store.value.indices
    elif dst_param and not src_param:
        g, x, kind, g_idx, x_idx = src, dst, "write", store.value.indices, store.indices
    else:
        return None
    size = _elements(g.shape)
    if (size is None or size != _elements(x.shape) or size > _MAX_ELEMENTS or str(g.dtype) != str(x.dtype)
            or str(g.scope()) != "global" or list(x.strides) or list(g.strides)):
        return None
    if not bijective_binding(loops, realize):
        return None
    iter_dom = {iv.var: iv.dom for iv in blk.iter_vars}
    g_flat = _flat(g.shape, g_idx)
    if _elements([iv.dom.extent for iv in blk.iter_vars]) != size or not is_bijection([g_flat], iter_dom):
        return None
    analyzer = sym.Analyzer()
    for var, dom in iter_dom.items():
        analyzer.bind(var, dom)
    return (g, x, kind) if analyzer.can_prove_equal(g_flat, _flat(x.shape, x_idx)) else None


def _alone(nests, i: int, g, family: list, kind: str) -> bool:
    """Whether the copy at ``nests[i]`` may become a view: the parameter (``family``: it and
    its views) used by no other nest; for a read, no other nest before it uses ``g`` nor any
    writes it; for a write-back, none after it uses ``g``."""
    for j, nest in enumerate(nests):
        if j == i:
            continue
        reads, writes = _uses(nest)
        if any(_holds(reads + writes, x) for x in family):
            return False
        uses_g = _holds(reads + writes, g)
        if kind == "read" and (uses_g and j < i or _holds(writes, g)):
            return False
        if kind == "write" and uses_g and j > i:
            return False
    return True


def _holds(buffers: list, buf) -> bool:
    return any(b.same_as(buf) for b in buffers)


def _uses(stmt) -> tuple[list, list]:
    """(buffers ``stmt`` reads, buffers it writes), from its loads, stores and the regions its
    blocks declare (a tensorized block touches its buffers only through those)."""
    reads, writes = [], []
    tvm_ffi.structural_walk(stmt, [(TensorLoad, lambda n: reads.append(n.source)),
                                   (tirx.BufferStore, lambda n: writes.append(n.buffer))], order="pre")
    for blk in iter_blocks(stmt):
        reads.extend(r.source for r in blk.reads)
        writes.extend(w.source for w in blk.writes)
        reads.extend(m.source.source for m in blk.match_buffers)
    return reads, writes


def _flat(shape, indices):
    """The row-major flat index of ``indices`` in a compact buffer of ``shape``."""
    out = None
    for extent, index in zip(shape, indices):
        out = index if out is None else out * int(extent) + index
    return out


def _elements(shape) -> int | None:
    """How many elements ``shape`` holds, None when an extent is symbolic."""
    n = 1
    for extent in shape:
        if not isinstance(extent, int) and not hasattr(extent, "value"):
            return None
        n *= int(extent)
    return n


__all__ = ["InPlace", "identity_copies", "in_place_note", "read_in_place"]
