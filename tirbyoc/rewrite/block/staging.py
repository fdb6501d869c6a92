"""Stages that move operands into the layout the intrinsic reads: staging copies, padding,
packing.

The matcher decided per operand whether the implementation can read the workload in place
or what must happen first (`OperandMap.staging`). A transposed or tile-packed operand is
copied whole (``cache_read`` / ``cache_write``) and its copy re-laid-out with
``transform_layout`` (the intrinsic's dimensions innermost, packed into tiles where the
implementation reads a dense tile: VNNI's weights become [N/16, K/4, 16, 4] once per call,
not per tile). An operand seen through a fused axis (implicit GEMM) gets a
``reindex_cache_read`` / ``reindex_cache_write`` copy laid out by the intrinsic's axes.
Padding (``pad_einsum``) comes after staging, which it needs plain iterator indices for, and
packing of reindexed copies after padding.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import PrimCall, call_name, tirx, vector_registers
from tirbyoc.errors import RewriteError
from tirbyoc.ir.pattern import Access
from tirbyoc.matching.results import OperandMap, Staging
from tirbyoc.rewrite.cpu.run_time_rows import fuse_run_time_rows, run_time_row_factors
from tirbyoc.rewrite.cpu.static_rows import mark_static_rows, static_row_factors
from tirbyoc.rewrite.cpu.weight_layout import weight_operand
from tirbyoc.rewrite.foundation.state import RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind


def pure(acc: Access) -> bool:
    """Every index is a plain iterator or a constant (``pad_einsum``'s requirement)."""
    for form in acc.indices:
        if form is None:
            return False
        if form.terms and (len(form.terms) != 1 or form.terms[0][1] != 1 or form.const):
            return False
    return True


def packing(lead: int, tiles: tuple[int, ...]):
    """(lead dims..., view dims...) -> (lead..., view // tile..., view % tile...)."""

    def layout(*xs):
        head, tail = list(xs[:lead]), list(xs[lead:])
        return head + [x // t for x, t in zip(tail, tiles)] + [x % t for x, t in zip(tail, tiles)]

    return layout


def relayout(order: list[int], lead: int, tiles: tuple[int, ...] | None):
    """Dimensions permuted to ``order``, then the last ones packed into ``tiles``."""
    pack = packing(lead, tiles) if tiles else None

    def layout(*xs):
        xs = [xs[d] for d in order]
        return pack(*xs) if pack else xs

    return layout


def index_map(fn, ndim: int):
    return tirx.IndexMap.from_func(fn, ndim=ndim, index_dtype="int32")


def _dma_ready(state: RewriteState, acc: Access, op: OperandMap) -> bool:
    """A DMA copies a tile as rows with a stride: the operand's axes must index the buffer's
    dimensions in order, the last one its innermost (contiguous) dimension."""
    try:
        view = state.view_dims(acc, op)
    except StopIteration:
        return False
    return view == sorted(view) and view[-1] == len(acc.indices) - 1


def _packs(state: RewriteState, op: OperandMap) -> bool:
    return op.pack and op.operand not in state.tiled


def stage_operands(state: RewriteState) -> RewriteState | None:
    """Copy every operand that cannot be read in place (whole, or reindexed by the
    intrinsic's axes). A block whose rows are padded at run time (`_run_time_rows`) stages as a
    padded one: reindexed, packed after the padding."""
    state.row_factors = _run_time_rows(state)
    tiled, axes, changed = state.tiled, state.axes, False
    for op in state.match.operands:
        acc = state.access(op)
        scope = op.scope
        staged = not op.direct or scope != op.workload_scope
        if op.operand in tiled:
            # Only re-order it in its own memory here; DMA (or the warp's copies) move tiles
            # later (and lay them out, so no packing now).
            scope = op.workload_scope
            staged = Staging.REINDEX in op.staging or Staging.TRANSPOSE in op.staging or \
                not _dma_ready(state, acc, op)
        if state.padded and (not pure(acc) or set(state.fused_rows) & set(acc.vars)):
            staged = True  # padded through a reindexed copy (fused rows index it by division)
        if not staged:
            continue
        kind = "write" if op.is_output else "read"
        # A padded block stages through reindex and packs after padding.
        whole = not state.padded and Staging.REINDEX not in op.staging and \
            all(len(axes[a].iters) == 1 for a in op.view_axes)
        (_stage_whole if whole else _stage_reindex)(state, op, kind, scope)
        changed = True
    if changed:
        fold_pads_into_copies(state)
    return state if changed else None


def _is_pad(stmt) -> bool:
    """Whether a block is a zero-padding copy (``if_then_else(inside, x[...], 0)``, as TVM's
    legalization writes a convolution's padding) of one buffer."""
    value = getattr(stmt.body, "value", None)
    return (len(stmt.reads) == 1 and len(stmt.writes) == 1 and isinstance(value, PrimCall)
            and call_name(value).endswith("if_then_else"))


def fold_pads_into_copies(state: RewriteState) -> None:
    """Compute a padded input inside the staging copy that reads it (the pad block inlined):
    one pass over the input instead of two, and no padded intermediate left beside the
    staged buffers - TVM's StorageRewrite gives such a buffer's memory to a staged buffer of
    another dtype, whose pointer the implementation then takes with a type that contradicts
    the allocation, and the function does not build (a uint8 convolution's padding beside
    x86_amx's int8 packed weight). A pad TVM cannot inline is kept."""
    sch = state.sch
    for copy in sch.get_producers(state.block):
        for producer in sch.get_producers(copy):
            if len(sch.get_consumers(producer)) != 1 or not _is_pad(sch.get(producer)):
                continue
            try:
                sch.compute_inline(producer)
            except Exception:  # noqa: BLE001 - TVM's errors have no common base; the pad stays
                continue


def _stage_whole(state: RewriteState, op: OperandMap, kind: str, scope: str) -> None:
    """Copy the whole buffer and move the intrinsic's dimensions innermost (transpose),
    packed into tiles if the implementation reads dense tiles."""
    sch, blk = state.sch, state.block
    acc = state.access(op)
    view = state.view_dims(acc, op)
    ndim = len(acc.indices)
    rest = [d for d in range(ndim) if d not in view]
    order = rest + view
    what = f"stage {op.operand}: {'cache_write' if kind == 'write' else 'cache_read'} " \
           f"{op.buffer} into {scope}"
    with state.step(StepKind.STAGE, what, op.operand):
        idx = state.region(kind, op.buffer)
        copy = sch.cache_write(blk, idx, scope) if kind == "write" else sch.cache_read(blk, idx, scope)
    pack = _packs(state, op)
    if order != list(range(ndim)) or pack:
        desc = "pack " + "x".join(map(str, op.packing_tile)) + " tiles" if pack else "transpose"
        with state.step(StepKind.PACK if pack else StepKind.TRANSPOSE,
                        f"{desc} {op.operand} ({op.buffer}) with transform_layout", op.operand):
            region = state.region(kind, state.staged_buffer(copy, kind))
            sch.transform_layout(blk, (kind, region),
                                 index_map(relayout(order, len(rest), op.packing_tile if pack else None), ndim))


def _stage_reindex(state: RewriteState, op: OperandMap, kind: str, scope: str) -> None:
    """Copy the operand into a buffer indexed by the canonical iterators (im2col for an
    implicit GEMM): [loops around the intrinsic that the access uses..., the operand's
    intrinsic axes]."""
    m, sch = state.match, state.sch
    acc = state.access(op)
    # positions in the canonical iterators (workload and intrinsic names may clash)
    # an iterator folded into the rows (extent 1 now) indexes nothing
    others = [i for i, it in enumerate(m.outer) if it in acc.vars and it not in state.fused_rows[:-1]]
    axis_pos = {a.axis: len(m.outer) + i for i, a in enumerate(m.axes)}
    ndim = len(m.outer) + len(m.axes)

    def by_axes(*vs):
        return [vs[i] for i in others] + [vs[axis_pos[a]] for a in op.view_axes]

    fn = sch.reindex_cache_write if kind == "write" else sch.reindex_cache_read
    with state.step(StepKind.STAGE, f"stage {op.operand}: reindex {op.buffer} by the intrinsic's "
                                     f"axes into {scope}", op.operand):
        copy = fn(state.block, state.region(kind, op.buffer), scope, index_map(by_axes, ndim))
    state.reindexed.append((copy, kind))
    if _packs(state, op):
        state.packs.append((op, kind, len(others)))


def pad_and_pack(state: RewriteState) -> RewriteState | None:
    """``pad_einsum`` to multiples of the intrinsic's widths, then pack the reindexed copies
    that the implementation reads as dense tiles."""
    if not state.padded and not state.packs:
        return None
    m, sch, rows = state.match, state.sch, state.row_factors
    if state.padded:
        factors = [1] * len(m.outer) + [a.size if a.pads else 1 for a in m.axes]
        pads = [a.pad_text for a in m.axes if a.pads]
        if rows is not None:
            factors = [max(f, r) for f, r in zip(factors, rows)]
            kind, when = ("", "") if state.static_rows else (" of run-time extent", " at run time")
            folded = f" ({len(state.fused_rows)} dimensions{kind} folded into one)" if state.fused_rows else ""
            pads.append(f"the rows{folded} to a multiple of {max(rows)}{when}, for a register block")
        with state.step(StepKind.PAD, f"pad_einsum ({', '.join(pads)})"):
            sch.pad_einsum(state.block, factors)
        _fold_reindex_copies(state)
    for op, kind, lead in state.packs:
        block = sch.get(state.block)
        regions = block.writes if kind == "write" else block.reads
        idx = _staged_region(state, regions, op)
        with state.step(StepKind.PACK, f"pack {op.operand} into {'x'.join(map(str, op.packing_tile))} tiles",
                        op.operand):
            ndim = len(regions[idx].region)
            sch.transform_layout(state.block, (kind, idx), index_map(packing(lead, op.packing_tile), ndim))
    fold_pads_into_copies(state)
    return state


def _run_time_rows(state: RewriteState) -> list[int] | None:
    """`run_time_row_factors` for a block the target's default CPU schedule will register-block
    (not one staged per tile, nor one the caller schedules), before its operands are packed."""
    group = state.match.group
    if state.schedule is not True or state.tiled or (group is not None and (group.resize is not None
                                                                             or group.resize_pads)) \
            or (state.template is not None and state.template.libraries):
        return None  # a library's kernel (its GEMV takes rows one by one) or one padded to its own call shape
    kinds = state.iter_kinds
    outer_spatial = [kinds[name] != "R" for name in state.match.outer]
    factors, run = run_time_row_factors(state.sch, state.block, outer_spatial, state.target), None
    if factors is None and state.target is not None and str(state.target.kind.name) == "llvm":
        factors, run = static_row_factors(state.sch, state.block, outer_spatial, *_columns_and_float(state.match),
                                           vector_registers(state.target)) \
            or (None, None)
    if factors is not None:
        holder = _rows_operand(state)
        rows = {op.buffer for op in state.match.operands if op.is_output or op.operand == holder}
        fused = fuse_run_time_rows(state.sch, state.block, outer_spatial, rows, run)
        if run is not None:
            if len(fused) != len(run) and len(run) > 1:
                return None  # the rows could not be folded into one count: leave them as they are
            state.static_rows = True
            mark_static_rows(state.sch, state.block)
        state.fused_rows = [state.match.outer[i] for i in fused]
    return factors


def _columns_and_float(match) -> tuple[int | None, bool]:
    """(the output's columns - the extents of the intrinsic's spatial axes -, whether the core
    accumulates in a float type)."""
    spatial = [a.extent for a in match.axes if a.kind == "S"]
    columns = None if None in spatial else prod(spatial)
    out = next(op for op in match.operands if op.is_output)
    return columns, match.intrinsic.operand(out.operand).dtype.startswith("float")


def _rows_operand(state: RewriteState) -> str | None:
    """The intrinsic operand that holds the rows: the input the output's rows come from (not
    the weight, which the register block streams)."""
    weight = weight_operand(state.match)
    inputs = [op.operand for op in state.match.operands if not op.is_output]
    rest = [o for o in inputs if weight is None or o != weight.operand]
    return rest[0] if len(rest) == 1 else None


def _fold_reindex_copies(state: RewriteState) -> None:
    """Fold each reindex copy into the pad copy that now reads it: one staging pass, not two."""
    sch = state.sch
    block = sch.get(state.block)
    touched = {str(r.source.name) for r in list(block.reads) + list(block.writes)}
    for copy, kind in state.reindexed:
        if state.staged_buffer(copy, kind) in touched:
            continue  # not padded: the compute still reads this copy itself
        try:
            if kind == "read":
                sch.compute_inline(copy)
            else:
                sch.reverse_compute_inline(copy)
        except Exception:  # noqa: BLE001 - keeping both copies is still correct
            pass


def _staged_region(state: RewriteState, regions, op: OperandMap) -> int:
    hits = [i for i, r in enumerate(regions) if str(r.source.name).startswith(op.buffer + "_")]
    if len(hits) != 1:
        raise RewriteError(f"{state.where}: cannot find the staged copy of {op.buffer}")
    return hits[0]


__all__ = ["fold_pads_into_copies", "index_map", "packing", "pad_and_pack", "pure", "relayout", "stage_operands"]
