"""Where the CPU schedule puts a core's weights: which loop runs first, and in what layout.

A core whose weights outweigh its input runs its output-channel tiles outermost
(`weights_first`): each weight is read from memory once. A core that reads one vector of
output channels per reduction step (the fp32 core's B[lanes]) reads its weight panel by panel,
``[N/width, <reduction dims in step order>, width]`` with the register block's nr tiles side
by side (width = nr x lanes: each step one contiguous run, one stream from memory;
`tiles_outermost`), from a staging copy that `tirbyoc.relax.prepack` runs once for a constant
weight - the function's own staging copy, or one made for a parameter TVM's
``layout_free_buffers`` attribute names.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import iter_blocks, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import block_realize, uses_var


def weight_operand(match):
    """The intrinsic's weight operand: the input that shares an axis with the output
    (B[lanes, k] beside A[k] for C[lanes]); None if no input does."""
    out = next(o for o in match.operands if o.is_output)
    return next((o for o in match.operands if not o.is_output and set(o.view_axes) & set(out.view_axes)), None)


def operand_bytes(sch, block, mloop) -> tuple[int, dict]:
    """(bytes of the operands the rows loop ``mloop`` indexes - the input -, {name: bytes} of
    the others - the weights) that ``block`` reads, static shapes only."""
    realize = block_realize(sch.get(sch.get_loops(block)[0]), sch.get(block))
    var = sch.get(mloop).loop_var
    rows = [iv.var for iv, value in zip(realize.block.iter_vars, realize.iter_values) if uses_var(value, var)]
    out = {r.source.name for r in realize.block.writes}
    by_rows, weights = 0, {}
    for region in realize.block.reads:
        buf = region.source
        if buf.name in out or any(not isinstance(d, tirx.IntImm) for d in buf.shape):
            continue
        size = prod(int(d) for d in buf.shape) * dtype_bytes(str(buf.dtype))
        if any(uses_var(r.min, v) for r in region.region for v in rows):
            by_rows += size
        else:
            weights[buf.name] = size
    return by_rows, weights


def weights_first(by_rows: int, weights: dict) -> str | None:
    """The weight buffer's name when the output-channel tiles should be the outermost loop:
    when the operands the rows do not index (the weights) hold more bytes than those they do
    (the input), as `operand_bytes` counts them; else None. Rows outermost stream every weight once per row block, from L3 or
    memory once the weights outgrow L2 (ResNet-50's last 3x3 layers: 2.3 MB of weights,
    seven rows: 7 x 2.3 MB per call); channel tiles outermost stream them once and re-read
    the smaller input instead."""
    if not weights or sum(weights.values()) <= by_rows:
        return None
    return max(weights, key=weights.get)


LAYOUT_FREE_ATTR = "layout_free_buffers"  # TVM's PrimFunc attribute: parameters a caller passes as constants


def layout_free_params(sch) -> set[int]:
    """The parameter positions the function's ``layout_free_buffers`` attribute names: TVM's
    mark (MetaSchedule's layout rewrite reads it too) for the parameters every caller passes
    as a constant (`tirbyoc.relax.bridge` sets it from the Relax call sites), whose staging
    copies `tirbyoc.relax.prepack` runs once at compile time."""
    return layout_free_positions(sch.mod["main"])


def layout_free_positions(func) -> set[int]:
    """`layout_free_params` of a PrimFunc (no schedule needed)."""
    attrs = func.attrs
    value = attrs.get(LAYOUT_FREE_ATTR) if attrs is not None else None
    return {int(i) for i in value} if value is not None else set()


def _staged_copy(sch, block, idx: int) -> int | None:
    """The read ``idx`` of ``block`` staged through a copy of its whole buffer when the buffer
    is a layout-free parameter (its copy then runs once, at compile time); the read index of
    the copy, or None (a parameter read on every call stays in place: relaying it out on
    every call would cost a pass over the weights, as much as a small-M matmul itself)."""
    func = sch.mod["main"]
    buf = sch.get(block).reads[idx].source
    position = next((i for i, p in enumerate(func.params) if p.same_as(buf)), None)
    if position is None or position not in layout_free_params(sch):
        return None
    staged = sch.get(sch.cache_read(block, idx, "global")).writes[0].source
    return next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(staged))


def _dims_in_step_order(sch, block, idx: int, count: int) -> list[int]:
    """The first ``count`` dimensions of ``block``'s read ``idx`` in the order the reduction
    steps them: by the position of the outermost loop each one's index follows (a dimension
    no loop drives keeps its place, first). A conv whose loops run C, kh, kw over an HWIO
    weight steps 8 KB apart in ``[N/16, kh, kw, C, 16]`` (res3 3x3 at 0.4 of the peak) and
    64 bytes apart in ``[N/16, C, kh, kw, 16]``."""
    loops = [sch.get(l).loop_var for l in sch.get_loops(block)]
    realize = block_realize(sch.get(sch.get_loops(block)[0]), sch.get(block))
    region = realize.block.reads[idx].region

    def position(dim: int) -> int:
        values = [v for iv, v in zip(realize.block.iter_vars, realize.iter_values) if uses_var(region[dim].min, iv.var)]
        return min((i for i, lv in enumerate(loops) if any(uses_var(v, lv) for v in values)), default=-1)

    return sorted(range(count), key=lambda d: (position(d), d))


def tiles_outermost(sch, block, weight: str, match, panel: int = 1) -> str | None:
    """Lay the weight out panel by panel, ``[N/width, ..., width]`` with ``panel`` tiles of
    lanes side by side (width = panel x lanes where it divides N, else the lanes alone), when
    the core reads it one vector of output channels per reduction step (the fp32 core's
    B[lanes]); the name of the buffer the core now reads, or None. ``panel``: the register
    block's tiles, which each step reads together: as one run a step, a 201 MB weight streamed
    from memory by a 4 x 3 block came at 27 GB/s, as three runs 64 KB apart at 25 (AVX2,
    one thread). Staged as ``[kh, kw, C, N]`` (or read in place as a
    matmul's ``[K, N]``), each step of a tile is N elements after the last (1 KB for 256 fp32
    channels), and a 14x14x256 3x3 layer ran at half the core's speed on cache-set conflicts
    (BERT's 768x3072 matmuls at 0.6 of it); panel by panel, a panel's weights are one
    contiguous run. A buffer the function allocates (a staging copy, which `tirbyoc.relax.prepack` runs
    once for a constant weight) is laid out again, and a layout-free parameter is first
    staged (`_staged_copy`); any other parameter stays as it is."""
    op = weight_operand(match)
    lanes = op.tile[0] if op is not None and len(op.tile) == 1 else None
    stmt = sch.get(block)
    idx = next((i for i, r in enumerate(stmt.reads) if r.source.name == weight), None)
    if lanes is None or idx is None:
        return None
    buf = stmt.reads[idx].source
    shape = [int(d) for d in buf.shape] if all(isinstance(d, tirx.IntImm) for d in buf.shape) else None
    if not shape or len(shape) < 2 or shape[-1] % lanes or shape[-1] == lanes:
        return None
    width = lanes * panel if shape[-1] % (lanes * panel) == 0 else lanes
    allocated = any(b.same_as(buf) for blk in iter_blocks(sch.mod["main"].body) for b in blk.alloc_buffers)
    if not allocated:
        idx = _staged_copy(sch, block, idx)
        if idx is None:
            return None
    order = _dims_in_step_order(sch, block, idx, len(shape) - 1)
    layout = tirx.IndexMap.from_func(lambda *d: [d[-1] // width, *(d[i] for i in order), d[-1] % width],
                                     ndim=len(shape), index_dtype="int32")
    sch.transform_layout(block, ("read", idx), layout)
    return str(sch.get(block).reads[idx].source.name)


__all__ = ["LAYOUT_FREE_ATTR", "layout_free_params", "layout_free_positions", "operand_bytes", "tiles_outermost", "weight_operand", "weights_first"]
