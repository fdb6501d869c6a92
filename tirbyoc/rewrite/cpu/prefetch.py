"""Software prefetch of the next weight tiles, for CPU cores that stream weights from memory.

A layer whose weights outgrow the caches (ResNet-50's last 3x3 convolutions: 2.3 MB of int8
weights for seven output rows) runs with its output-channel tiles outermost
(`tirbyoc.rewrite.cpu.weight_layout.weights_first`): each tile's weights are read from memory once, by
its first register block, then reused from L2 by the others. That first pass waits on memory:
in a whole model every layer's weights are cold (ResNet-50 holds 25 MB of them), and the
hardware prefetcher, which follows one 8 KB run per filter tap, does not run far enough ahead.
The core therefore prefetches the weights of the tiles it computes next (``tiles`` ahead along
the output-channel axis), one cache line per tile per reduction step, from the first row of
its register block, while the current tiles compute. Measured on that layer (Zen 5, one
thread, caches flushed but the input's): 0.30 -> 0.24 ms; with warm caches it costs the
prefetch instructions (0.21 -> 0.23 ms). The row blocks that share the current tiles (the
seven output rows of a 7x7 layer) take the next tiles' steps in turn (`_spread`: row block r
the steps r, r + 7, ...): each line is prefetched once, spread over the whole time the current
tiles compute, where every row block prefetching every step put the whole next panel's
memory traffic into the first row block's time, beside that row block's own first pass over
the current tiles. ResNet-18's fp32 res5 3x3 layer (9.4 MB of weights) 1.03 -> 0.83 ms a call,
ResNet-50 int8's prefetching layers 0.24-0.27 -> 0.21-0.22 ms each inside the model. Only a core
whose weight tile is one whole cache line per step (x86_vnni's 16 x 4 bytes) prefetches: a
smaller tile (x86_avx2's 16 bytes) would prefetch each line four times, or branch at every
step to prefetch it once, and either cost AVX2's core a fifth of its speed with warm caches;
such cores keep the loop order alone.

`mark_weight_prefetch` annotates the schedule's outermost loop; `insert_weight_prefetches`
(a pass run before TVM's lowering, blocks still there: `tirbyoc.offloading.lowering`) adds
the prefetches to the tensorized blocks under it that read the weight buffer.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import REDUCE, SPATIAL, expr_dtype, s_tir, tirx, tvm_ffi
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import uses_var

PREFETCH_KEY = "tirbyoc.prefetch_weights"  # loop annotation: the weight buffer's name
TILES_KEY = "tirbyoc.prefetch_tiles"  # loop annotation: how many tiles ahead
ROWS_KEY = "tirbyoc.prefetch_rows"  # loop annotation: the register block's rows
CACHE_LINE = 64


def mark_weight_prefetch(sch, loop, weight: str, tiles: int, rows: int) -> None:
    """Ask `insert_weight_prefetches` to prefetch ``weight`` ``tiles`` output-channel tiles
    ahead in the tensorized blocks under ``loop``, once per ``rows`` rows."""
    sch.annotate(loop, PREFETCH_KEY, weight)
    sch.annotate(loop, TILES_KEY, tiles)
    sch.annotate(loop, ROWS_KEY, rows)


def prefetches(tile_bytes: int) -> bool:
    """Whether a core whose weight tile has ``tile_bytes`` prefetches (see the module's
    docstring: one whole cache line per step)."""
    return tile_bytes == CACHE_LINE


def _prefetch_call(buffer, indices):
    address = tirx.call_intrin("handle", "tirx.address_of", tirx.BufferLoad(buffer, indices))
    # llvm.prefetch(address, read, locality 3 (keep in all levels), data cache)
    return tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, 0, 3, 1))


def _with_prefetch(realize, weight: str, tiles: int, rows: int):
    """``realize`` (a tensorized block) with the prefetch of its weight tile ``tiles`` ahead
    added after its body, or ``realize`` itself when it reads no such tile."""
    block = realize.block
    match = next((m for m in block.match_buffers if m.source.source.name == weight), None)
    if match is None:
        return realize
    region = match.source.region
    extents = [r.extent for r in region]
    if any(not isinstance(e, tirx.IntImm) for e in extents):
        return realize
    size = prod(int(e.value) for e in extents) * dtype_bytes(str(match.source.source.dtype))
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == SPATIAL]
    channel = [i for i, r in enumerate(region) if any(uses_var(r.min, v) for v in spatial)]
    mins = [r.min for r in region]
    others = [v for v in spatial if not any(uses_var(m, v) for m in mins)]
    if not prefetches(size) or len(channel) != 1 or not others:
        return realize
    axis = channel[0]
    step = int(extents[axis].value)
    ahead = mins[axis] + tirx.const(tiles * step, expr_dtype(mins[axis]))
    fetch = _prefetch_call(match.source.source, [ahead if i == axis else m for i, m in enumerate(mins)])
    row = others[-1]  # the register block's row iterator: the last spatial one the weight ignores
    cond = tirx.EQ(tirx.FloorMod(row, tirx.const(rows, expr_dtype(row))), tirx.const(0, expr_dtype(row)))
    spread = _spread(block, others)
    if spread is not None:
        cond = tirx.And(cond, spread)
    body = tirx.SeqStmt([block.body, tirx.IfThenElse(cond, fetch, None)])
    new = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                       block.alloc_buffers, block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(realize.iter_values, realize.predicate, new)


def _spread(block, others):
    """The condition that spreads the next tiles' prefetches over the row blocks that share
    the current tiles: with R such row blocks (the extent of the row-block iterator, the
    spatial one before the register block's row), row block r prefetches the steps whose
    index is r modulo R - each line once, at a seventh of the rate for seven row blocks,
    instead of every line by each row block and all of them while the first row block waits on
    the current tiles' own first pass. None when there is no such iterator."""
    if len(others) < 2:
        return None
    outer = others[-2]
    iv = next(iv for iv in block.iter_vars if iv.var.same_as(outer))
    if not isinstance(iv.dom.extent, tirx.IntImm) or int(iv.dom.extent) < 2:
        return None
    reductions = [iv for iv in block.iter_vars if int(iv.iter_type) == REDUCE]
    if not reductions or any(not isinstance(r.dom.extent, tirx.IntImm) for r in reductions):
        return None
    dtype = expr_dtype(outer)
    index = tirx.const(0, dtype)
    for r in reductions:  # the step's index, the last reduction iterator fastest
        index = index * tirx.const(int(r.dom.extent), dtype) + tirx.Cast(dtype, r.var)
    count = tirx.const(int(iv.dom.extent), dtype)
    return tirx.EQ(tirx.FloorMod(index, count), tirx.FloorMod(outer, count))


def _prefetching(loop):
    annotations = loop.annotations
    if PREFETCH_KEY not in annotations:
        return loop
    weight, tiles, rows = str(annotations[PREFETCH_KEY]), int(annotations[TILES_KEY]), int(annotations[ROWS_KEY])
    return tvm_ffi.structural_map(loop, [(s_tir.SBlockRealize, lambda r: _with_prefetch(r, weight, tiles, rows))])


def insert_weight_prefetches(func):
    """``func`` with the prefetches `mark_weight_prefetch` asked for (see the module's
    docstring); other functions come back unchanged."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.For, _prefetching)])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["PREFETCH_KEY", "insert_weight_prefetches", "mark_weight_prefetch", "prefetches"]
