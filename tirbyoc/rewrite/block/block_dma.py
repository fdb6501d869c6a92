"""One DMA per scratchpad tile: a tile copy whose scratchpad layout is the window's, reshaped,
becomes one call of the template's `BlockDMA` (VTA's load and store instructions move a block
of rows at a stride), where the per-intrinsic-tile DMA would issue one transfer per row.

A copy qualifies when, over its loop nest, both its source and its destination index are
affine in the loops (after TVM's simplification under the loops' bounds), each window is
covered exactly once, and the two windows list their elements in the same row-major order -
then the DMA of two strided views copies it element for element. The copy's loop nest is
blockized and the block's body replaced by the call, its windows passed as match buffers
with symbolic strides (so TVM's later buffer compaction keeps them right). The replacement is
not a schedule primitive: a traced (MetaSchedule) rewrite keeps the per-tile DMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tirbyoc._tvm import TensorLoad, s_tir, sym, tirx, tvm, tvm_ffi
from tirbyoc.errors import RewriteError
from tirbyoc.ir.pattern import expr_vars
from tirbyoc.ir.tir_walk import always_true


def blockize_exact(sch, loop, traced: bool = False):
    """``sch.blockize(loop)`` with the outer block's bindings taken from the original block.

    TVM 0.27's blockize mis-divides a binding that adds two overlapping loops — a
    convolution window copied per tile, row = tile_row + kernel_row — into a fused one
    (``ax2_0 + ax1`` becomes ``ax2_0 * 12 + ax1`` under a predicate), which would copy the
    wrong rows. A binding that uses no loop inside ``loop`` belongs wholly to the outer block,
    so it is put back as it was, with the original predicate. That repair is not a schedule
    primitive, so with ``traced`` (a MetaSchedule trace must replay the same IR) a blockize
    that needs it is refused instead.
    """
    inner, node = set(), sch.get(loop)
    while isinstance(node, tirx.For):
        inner.add(str(node.loop_var.name))
        node = node.body
    if not isinstance(node, s_tir.SBlockRealize):
        raise RewriteError("blockize: the loop does not hold one block")
    original = node
    if expr_vars(original.predicate) & inner:
        raise RewriteError("blockize: the block's predicate depends on the blockized loops")
    outer_block = sch.blockize(loop)
    parents = sch.get_loops(outer_block)
    if not parents:
        return outer_block
    parent = sch.get(parents[-1])
    realize = parent.body
    if not isinstance(realize, s_tir.SBlockRealize) or \
            len(realize.iter_values) != len(original.iter_values):
        raise RewriteError("blockize: the outer block does not keep one iterator per original one")
    values = [orig if not expr_vars(orig) & inner else new
              for orig, new in zip(original.iter_values, realize.iter_values)]
    if all(v.same_as(n) or str(v) == str(n) for v, n in zip(values, realize.iter_values)) and \
            str(original.predicate) == str(realize.predicate):
        return outer_block  # TVM's own blockize was exact
    if traced:
        raise RewriteError("blockize of a window copy needs tirbyoc's repair, which a "
                           "MetaSchedule trace cannot replay")
    fixed = s_tir.SBlockRealize(values, original.predicate, realize.block)
    sch.state.replace(sch.get_sref(parents[-1]),
                      tirx.For(parent.loop_var, parent.min, parent.extent, parent.kind, fixed,
                               parent.thread_binding, parent.annotations),
                      {realize.block: realize.block})
    return outer_block


def affine_indices(indices, subst: dict, loop_vars: list, analyzer):
    """Per index: (coefficient per loop, base), or None when one is not affine with
    non-negative constant coefficients."""
    out = []
    for ix in indices:
        expr = tvm_ffi.structural_map(ix, [(tirx.Var, lambda v: subst.get(v, v))])
        expr = analyzer.simplify(expr)
        lin = sym.detect_linear_equation(expr, loop_vars)
        if len(lin) != len(loop_vars) + 1 or not all(isinstance(c, tirx.IntImm) for c in lin[:-1]):
            return None
        coefs = [int(c) for c in lin[:-1]]
        if any(c < 0 for c in coefs):
            return None
        out.append((coefs, lin[-1]))
    return out


def row_major(affine, extents: list[int]) -> tuple[list[int], list[int]] | None:
    """(window extent per dimension, each loop's step in the window's row-major order), or
    None when the loops do not cover the window exactly once."""
    window = [sum(c * (e - 1) for c, e in zip(coefs, extents)) + 1 for coefs, _ in affine]
    if prod(window) != prod(extents):
        return None
    steps = [0] * len(extents)
    inner = 1
    for (coefs, _), ext in reversed(list(zip(affine, window))):
        for k, c in enumerate(coefs):
            steps[k] += c * inner
        inner *= ext
    # a bijection onto the window: sorted by step, each step is the product of the extents
    # of the loops with smaller steps (mixed radix)
    radix = 1
    for step, ext in sorted((s, e) for s, e in zip(steps, extents) if e > 1):
        if step != radix:
            return None
        radix *= ext
    return window, steps


@dataclass(frozen=True)
class WindowCopy:
    """A copy nest that is a reshape: the windows it reads and writes, as buffer regions in
    the loops around the nest, and the destination window's extents."""

    read: object  # tirx.BufferRegion
    write: object
    window: tuple


@dataclass(frozen=True)
class TileNest:
    """A loop nest holding one block: its loop variables and constant extents (each from 0),
    an analyzer bound to them, and the block's iterator bindings - what reading the block's
    accesses as affine windows of the loops takes."""

    realize: object  # s_tir.SBlockRealize of the block
    loop_vars: list
    extents: list
    analyzer: object
    subst: dict

    def affine(self, indices):
        """`affine_indices` of ``indices`` (the block's) in the nest's loops."""
        return affine_indices(indices, self.subst, self.loop_vars, self.analyzer)


def tile_nest(sch, loops: list) -> TileNest | None:
    """The nest ``loops`` (outermost first) around one block, or None when the innermost loop
    does not hold a block alone or an extent is not a constant from 0."""
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    fors = [sch.get(loop) for loop in loops]
    if not all(isinstance(f.extent, tirx.IntImm) and isinstance(f.min, tirx.IntImm) and int(f.min) == 0
               for f in fors):
        return None
    loop_vars, extents = [f.loop_var for f in fors], [int(f.extent) for f in fors]
    analyzer = sym.Analyzer()
    for v, e in zip(loop_vars, extents):
        analyzer.bind(v, tvm.ir.Range(0, e))
    subst = {iv.var: val for iv, val in zip(realize.block.iter_vars, realize.iter_values)}
    return TileNest(realize, loop_vars, extents, analyzer, subst)


def plain_window_copy(sch, loops: list) -> WindowCopy | None:
    """The copy under ``loops`` (its whole nest) when it is a reshape of one window into
    another (see the module's docstring), else None."""
    nest = tile_nest(sch, loops)
    if nest is None or not always_true(nest.realize.predicate):
        return None
    store = nest.realize.block.body
    if not isinstance(store, tirx.BufferStore):
        return None
    value = store.value
    if isinstance(value, tirx.Cast):
        value = value.value
    if not isinstance(value, TensorLoad):
        return None
    dst, src = nest.affine(store.indices), nest.affine(value.indices)
    if dst is None or src is None:
        return None
    d, s = row_major(dst, nest.extents), row_major(src, nest.extents)
    if d is None or s is None or d[1] != s[1]:
        return None
    return WindowCopy(window_region(value.source, src, s[0]), window_region(store.buffer, dst, d[0]), tuple(d[0]))


def window_region(buffer, affine, window):
    return tirx.BufferRegion(buffer, [tvm.ir.Range.from_min_extent(base, ext)
                                      for (_, base), ext in zip(affine, window)])


def strided_view(region, name: str):
    """A buffer over ``region`` (a BufferRegion) with symbolic strides and offset."""
    buf = region.source
    shape = [r.extent for r in region.region]
    strides = [tirx.Var(f"{name}_s{k}", "int32") for k in range(len(shape))]
    return tirx.decl_buffer(shape, str(buf.dtype), name, strides=strides,
                            elem_offset=tirx.Var(f"{name}_offset", "int32"),
                            scope=str(buf.scope()), offset_factor=1)


def replace_with_block_dma(sch, dma, loops: list, copy: WindowCopy, direction: str, scope: str) -> None:
    """Replace the copy nest rooted at ``loops[0]`` by one opaque block calling ``dma`` (a
    `BlockDMA`) on the two windows."""
    src, dst = strided_view(copy.read, "S"), strided_view(copy.write, "D")
    call = tirx.call_packed(dma.symbol(direction), dst, src, *dma.scope_args.get(scope, ()))
    old = sch.get(loops[-1]).body.block
    block = s_tir.SBlock([], [copy.read], [copy.write], old.name_hint + "_dma", tirx.Evaluate(call), None,
                         [], [s_tir.MatchBufferRegion(dst, copy.write), s_tir.MatchBufferRegion(src, copy.read)])
    # the copy's block reference (a BlockRV, the step records) now names the DMA block
    sch.state.replace(sch.get_sref(loops[0]), s_tir.SBlockRealize([], tirx.const(True, "bool"), block),
                      {old: block})


__all__ = ["TileNest", "WindowCopy", "affine_indices", "blockize_exact", "plain_window_copy",
           "replace_with_block_dma", "row_major", "strided_view", "tile_nest", "window_region"]
