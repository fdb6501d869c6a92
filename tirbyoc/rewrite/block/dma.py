"""Stages for scratchpad templates (VTA-style): scratchpad tiles, DMA per tile, DMA intrinsics.

``scratchpad`` groups intrinsic tiles (and rows of the loops around the intrinsic) into
scratchpad tiles that fit (`tirbyoc.rewrite.block.scratchpad.rank_tiles`), loads each input's tile
into its scratchpad at the innermost loop around it, keeps the output tile in its scratchpad
across the reduction and stores it after, and lays every scratchpad tile out as dense
intrinsic tiles. The allocation TVM will make is measured (`scratchpad_usage`); a plan whose
real windows overflow a scope gives way to the next. ``dma copies`` then tensorizes each tile
copy with the template's DMA intrinsics where one fits (the rest stay copy loops): last,
because a tensorized window copy ends TVM's stage-pipeline analysis of the scope, which
``compute_at`` on the other operands needs.
"""

from __future__ import annotations

from tirbyoc.errors import RewriteError
from tirbyoc.matching.results import OperandMap
from tirbyoc.rewrite.block.block_dma import blockize_exact, plain_window_copy, replace_with_block_dma
from tirbyoc.ir.tir_walk import loop_extent
from tirbyoc.rewrite.block.scratchpad import TileAxis, TileOperand, rank_tiles, scratchpad_usage
from tirbyoc.rewrite.block.staging import index_map, relayout
from tirbyoc.rewrite.foundation.state import Loops, RewriteState
from tirbyoc.rewrite.foundation.steps import Step, StepKind


def stage_scratchpads(state: RewriteState) -> RewriteState | None:
    spad = state.scratchpad_operands
    if not spad:
        return None
    m = state.match
    dtypes = {o.name: o.dtype for o in m.intrinsic.operands}
    scopes = {op.scope: state.template.scope(op.scope) for op in spad.values()}
    kinds = {it.name: it.kind for it in state.pattern.iters}
    # keyed "loop NAME": a workload iterator may share its name with an intrinsic axis
    extents = [loop_extent(state.sch, loop) for loop in _outer_loops(state)]
    outer = [(f"loop {name}", loop, e or 1, kinds[name] == "R")
             for name, loop, e in zip(m.outer, _outer_loops(state), extents)]
    axes = [TileAxis(n, 1, e, r) for n, _, e, r in outer]
    # an axis of run-time extent: one intrinsic tile per scratchpad tile, which fits at every size
    axes += [TileAxis(a.axis, a.size, (a.padded or a.size) // a.size, a.kind == "R") for a in m.axes]
    run_time = [n for n, e in zip(m.outer, extents) if e is None] + list(m.symbolic_axes)
    note = (f"; one tile along {', '.join(run_time)} (extent known at run time), so it fits at "
            "every size") if run_time else ""
    tile_ops = []
    for op in spad.values():
        uses = {f"loop {v}" for v in state.access(op).vars}
        tile_ops.append(TileOperand(op.operand, op.scope,
                                    tuple(n for n, *_ in outer if n in uses) + op.view_axes,
                                    dtypes[op.operand], op.is_output))
    capacity = {s: sc.capacity for s, sc in scopes.items()}
    alignment = {s: sc.alignment for s, sc in scopes.items()}
    halved = _double_buffer_budget(state.template, capacity)
    if halved != capacity:
        saved = (state.sch, list(state.steps), state.loops, list(state.copies))
        try:
            return _first_fitting(state, rank_tiles(axes, tile_ops, halved, alignment, state.where),
                                  outer, halved, note)
        except RewriteError:  # no tile fits half the scratchpad: single tiles in all of it
            state.sch, state.steps, state.loops, state.copies = saved
    plans = rank_tiles(axes, tile_ops, capacity, alignment, state.where)
    return _first_fitting(state, plans, outer, capacity, note)


def _double_buffer_budget(template, capacity: dict) -> dict:
    """Bytes per scope the tile planner may use: half the capacity of a scope whose tiles the
    template double-buffers (`BlockDMA.double_buffer`), so that two versions fit."""
    dma = getattr(template, "block_dma", None)
    halves = set(getattr(dma, "double_buffer", ()))
    return {s: (c // 2 if s in halves else c) for s, c in capacity.items()}


def _first_fitting(state: RewriteState, plans, outer: list, capacity: dict, note: str = "") -> RewriteState:
    """Carry out the ranked plans on copies of the schedule until ``state.plan + 1`` of them
    fit once TVM has allocated their windows; the last of those is the result (its step
    says so, with ``note`` appended)."""
    base, steps, loops = state.sch, list(state.steps), state.loops
    tried, fitting = [], 0
    for plan in plans[:8 + state.plan]:
        state.sch, state.steps, state.copies = base.copy(), list(steps), []
        state.loops = _split_for(state, plan, outer, loops)
        used = scratchpad_usage(state.sch.mod["main"], list(capacity))
        if all(used[s] <= capacity[s] for s in capacity):
            fitting += 1
            if fitting > state.plan:
                state.steps.insert(len(steps), Step(StepKind.SCRATCHPAD_PLAN, plan.describe(used) + note))
                return state
            continue
        tried.append(", ".join(f"{s} {used[s]} > {capacity[s]} B" for s in capacity if used[s] > capacity[s]))
    if fitting:
        raise RewriteError(f"{state.where}: only {fitting} scratchpad tilings fit "
                           f"(asked for tiling {state.plan})")
    raise RewriteError(f"{state.where}: the {len(tried)} best scratchpad tilings overflow once "
                       f"TVM allocates their windows ({'; '.join(tried)})")


def _outer_loops(state: RewriteState) -> list:
    """The loops around the intrinsic in the order of ``Match.outer``."""
    kinds = {it.name: it.kind for it in state.pattern.iters}
    spatial, reduce = iter(state.loops.outer_spatial), iter(state.loops.outer_reduce)
    return [next(reduce) if kinds[n] == "R" else next(spatial) for n in state.match.outer]


def _split_for(state: RewriteState, plan, outer: list, loops: Loops) -> Loops:
    """Cut every loop by the plan, order tile loops outside, then stage each operand."""
    sch, m = state.sch, state.match
    so, ro, si, ri = [], [], [], []
    with state.step(StepKind.SPLIT, "split into scratchpad tiles"):
        cut = [(n, loop, r) for n, loop, _, r in outer]
        tile_loops = iter(loops.axis_spatial), iter(loops.axis_reduce)
        cut += [(a.axis, next(tile_loops[a.kind == "R"]), a.kind == "R") for a in m.axes]
        for name, loop, reduce in cut:
            o, i = sch.split(loop, [None, plan.factors[name]])
            (ro if reduce else so).append(o)
            (ri if reduce else si).append(i)
        sch.reorder(*so, *ro, *si, *ri, *loops.inner)
    load_at = (so + ro)[-1:] or [None]
    store_at = so[-1:] or [None]
    for op in state.scratchpad_operands.values():
        _dma(state, op, store_at[0] if op.is_output else load_at[0])
    n_out_s = sum(1 for *_, r in outer if not r)
    n_out_r = len(outer) - n_out_s
    return Loops(so + si[:n_out_s], ro + ri[:n_out_r], si[n_out_s:], ri[n_out_r:], loops.inner,
                 loops.outer_names)


def _dma(state: RewriteState, op: OperandMap, at) -> None:
    """Stage one operand's scratchpad tile at loop ``at``; its copy is tensorized later."""
    sch, blk = state.sch, state.block
    kind = "write" if op.is_output else "read"
    src = state.feeding(op, kind)
    ndim, view = state.dims_of(src, kind, op)
    rest = [d for d in range(ndim) if d not in view]
    verb = "store" if op.is_output else "load"
    with state.step(StepKind.DMA, f"DMA {verb} {op.operand} tiles of {src} in {op.scope}", op.operand):
        idx = state.region(kind, src)
        if op.is_output:
            copy = sch.cache_write(blk, idx, op.scope)
            if at is not None:
                sch.reverse_compute_at(copy, at, preserve_unit_loops=True)
        else:
            copy = sch.cache_read(blk, idx, op.scope)
            if at is not None:
                sch.compute_at(copy, at, preserve_unit_loops=True)
        staged = state.staged_buffer(copy, kind)
        # dense intrinsic tiles for an implementation that reads them dense; else the window's
        # own layout, the intrinsic's dimensions innermost (one block DMA moves it)
        dense = state.match.intrinsic.operand(op.operand).layout.dense
        sch.transform_layout(blk, (kind, state.region(kind, staged)),
                             index_map(relayout(rest + view, len(rest), op.tile if dense else None), ndim))
        # the copy's own loops run over the source region: cut them into intrinsic tiles
        copy_loops = sch.get_loops(copy)[-ndim:]
        outs, ins = [], []
        for d, t in zip(view, op.tile):
            o, i = sch.split(copy_loops[d], [None, t])
            outs.append(o)
            ins.append(i)
        sch.reorder(*[copy_loops[d] for d in rest], *outs, *ins)
    state.copies.append((op, copy, ins, kind, len(rest) + 2 * len(view)))


def tensorize_dma_copies(state: RewriteState) -> RewriteState | None:
    if not state.copies:
        return None
    for copy in state.copies:
        _tensorize_copy(state, *copy)
    return state


def _tensorize_copy(state: RewriteState, op: OperandMap, copy, loops: list, kind: str, nest: int) -> None:
    block = state.sch.get(copy)
    read, write = block.reads[0].source, block.writes[0].source
    role = "store" if kind == "write" else "load"
    if state.template.block_dma is not None and not state.traced and _block_dma(state, op, copy, role, nest):
        return
    candidates = [i for i in state.template.intrinsics()
                  if i.role.value == role and len(i.operands) == 2
                  and (i.operands[0].scope, i.operands[1].scope) == (str(read.scope()), str(write.scope()))
                  and (i.operands[0].dtype, i.operands[1].dtype) == (str(read.dtype), str(write.dtype))]
    for intrin in candidates:
        intrin.register()
        for loop in loops:
            trial = state.sch.copy()
            try:
                trial.tensorize(blockize_exact(trial, loop, state.traced), intrin.name)
            except Exception:  # noqa: BLE001 - the next candidate may fit
                continue
            with state.step(StepKind.DMA, f"tensorize the {role} of {op.operand} with {intrin.name}",
                            op.operand):
                state.sch.tensorize(blockize_exact(state.sch, loop, state.traced), intrin.name)
            state.copy_intrinsics.append(intrin.name)
            return
    tile = "x".join(map(str, op.tile))
    state.record(StepKind.COPY_LOOP,
                 f"{role} of {op.operand} ({read.dtype} {read.scope()} -> {write.dtype} "
                 f"{write.scope()}, {tile} tiles) left as a copy loop: no DMA intrinsic of "
                 f"the template fits ({len(candidates)} tried)", op.operand)


def _block_dma(state: RewriteState, op: OperandMap, copy, role: str, nest: int) -> bool:
    """Copy the whole scratchpad tile of operand ``op`` with the template's `BlockDMA` when
    the copy is a plain window; False (nothing changed) otherwise."""
    loops = state.sch.get_loops(copy)[-nest:]
    return copy_by_block_dma(state, loops, role, op.scope, op.operand, op.operand)


def copy_by_block_dma(state: RewriteState, loops: list, role: str, scope: str, what: str,
                      operand: str | None = None) -> bool:
    """Replace the copy nest ``loops`` by one call of the template's `BlockDMA` (``role``:
    load or store; ``scope``: the scratchpad side) when it is a plain window
    (`plain_window_copy`), recording a step about ``what``; False (nothing changed)
    otherwise."""
    window = plain_window_copy(state.sch, loops) if loops else None
    if window is None:
        return False
    shape = "x".join(map(str, window.window))
    with state.step(StepKind.DMA, f"{role} {what}'s {shape} scratchpad tiles with one block "
                                  "DMA each", operand):
        replace_with_block_dma(state.sch, state.template.block_dma, loops, window, role, scope)
    state.copy_intrinsics.append(f"{state.template.name}.block_dma_{role}")
    return True


__all__ = ["blockize_exact", "copy_by_block_dma", "stage_scratchpads", "tensorize_dma_copies"]
