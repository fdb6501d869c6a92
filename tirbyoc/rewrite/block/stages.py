"""The core stages of every rewrite, in the order they run (others register between them):

    commute -> canonicalize -> [stage -> pad] -> tile -> [scratchpad | fragments] -> schedule
    -> [dma copies | fragment copies] -> decompose -> tensorize -> init -> link

1. **commute**: the block's multiply-add operands in the intrinsic's order (TVM's tensorize
   compares expressions literally).
2. **canonicalize**: ``transform_block_layout`` so the block's iterators are the loops around
   the intrinsic followed by the intrinsic's own axes (`Match.block_index_map`).
3. **tile** each axis by the intrinsic's extent; spatial loops outside, reductions, then the
   intrinsic's loops in its own order.
4. **schedule**: the target's default arrangement of the outer loops (`tirbyoc.rewrite.cpu.register_blocks`
   on CPUs), or the caller's own.
5. **decompose** the reduction's init, **tensorize** compute and init with the template's
   intrinsics, **link** the extern libraries the intrinsics call.
"""

from __future__ import annotations

from tirbyoc._tvm import TensorLoad, expr_dtype, iter_blocks, s_tir, tirx
from tirbyoc.errors import RewriteError
from tirbyoc.ir.pattern import load_source
from tirbyoc.rewrite.block.addresses import address_merged_tiles
from tirbyoc.rewrite.cpu.register_blocks import default_schedule
from tirbyoc.rewrite.foundation.state import Loops, RewriteState
from tirbyoc.rewrite.foundation.steps import Step, StepKind

_COMMUTATIVE = (tirx.Add, tirx.Mul, tirx.Max, tirx.Min)


def _loads(expr, role_of) -> tuple:
    """The operand roles an expression loads, in order (what decides a commuted match)."""
    if isinstance(expr, TensorLoad):
        return (role_of(str(load_source(expr).name)),)
    if not isinstance(expr, _COMMUTATIVE + (tirx.Cast,)):
        return ()
    out = ()
    for name in ("value", "a", "b"):
        child = getattr(expr, name, None)
        if child is not None:
            out += _loads(child, role_of)
    return out


def commuted(w, d, w_role, d_role):
    """``w`` (a workload expression) with the operands of commutative nodes put in the
    order of ``d`` (the intrinsic's description): TVM's tensorize compares the two
    expressions literally, so ``B[j, k] * A[i, k]`` does not match ``A[i, k] * B[j, k]``."""
    if type(w) is not type(d):
        return w
    if isinstance(w, tirx.Cast):
        value = commuted(w.value, d.value, w_role, d_role)
        return w if value.same_as(w.value) else tirx.Cast(expr_dtype(w), value)
    if not isinstance(w, _COMMUTATIVE):
        return w
    a, b = w.a, w.b
    if _loads(a, w_role) != _loads(d.a, d_role) and _loads(a, w_role) == _loads(d.b, d_role):
        a, b = b, a
    new_a, new_b = commuted(a, d.a, w_role, d_role), commuted(b, d.b, w_role, d_role)
    if new_a.same_as(w.a) and new_b.same_as(w.b):
        return w
    return type(w)(new_a, new_b)


def commute(state: RewriteState) -> RewriteState | None:
    """Put the block's multiply-add operands (and its read regions) in the intrinsic's
    order. Done on the block itself (``ScheduleState.replace``): not in the trace."""
    sch, m = state.sch, state.match
    block = sch.get(state.block)
    desc_block = next((b for b in iter_blocks(m.intrinsic.desc.body)
                       if isinstance(b.body, tirx.BufferStore)), None)
    if desc_block is None or not isinstance(block.body, tirx.BufferStore):
        return None
    by_buffer = {op.buffer: op.operand for op in m.operands}
    value = commuted(block.body.value, desc_block.body.value, lambda n: by_buffer.get(n, n), lambda n: n)
    rank = {str(r.source.name): i for i, r in enumerate(desc_block.reads)}
    reads = sorted(block.reads, key=lambda r: rank.get(by_buffer.get(str(r.source.name)), len(rank)))
    if value.same_as(block.body.value) and all(a.same_as(b) for a, b in zip(reads, block.reads)):
        return None
    if state.traced:
        raise RewriteError(f"{state.where}: the block's operands are in another order than the "
                           "intrinsic's, which no schedule primitive changes; prepare the "
                           "workload first (tirbyoc.tuning.prepare)")
    with state.step(StepKind.COMMUTE, "order the block's operands as the intrinsic's (multiply-add, reads)"):
        replace_stored_value(sch, state.block, value, reads)
    return state


def replace_stored_value(sch, block_rv, value, reads=None) -> None:
    """The block's store given ``value`` (and ``reads``, default its own), in place
    (``ScheduleState.replace``: not a primitive, so not in the trace) - for the IR edits no
    schedule primitive makes."""
    block = sch.get(block_rv)
    body = tirx.BufferStore(block.body.buffer, value, block.body.indices)
    new = s_tir.SBlock(block.iter_vars, block.reads if reads is None else reads, block.writes, block.name_hint,
                       body, block.init, block.alloc_buffers, block.match_buffers, block.annotations)
    sch.state.replace(sch.get_sref(block_rv), new, {block: new})


def canonicalize(state: RewriteState) -> RewriteState:
    with state.step(StepKind.CANONICALIZE, "transform_block_layout to (outer loops, intrinsic axes)"):
        state.sch.transform_block_layout(state.block, state.match.block_index_map())
    return state


def tile(state: RewriteState) -> RewriteState:
    m, sch = state.match, state.sch
    loops = sch.get_loops(state.block)
    n_outer = len(m.outer)
    if len(loops) < n_outer + len(m.axes):
        raise RewriteError(f"{state.where}: expected {n_outer + len(m.axes)} loops after "
                           f"canonicalisation, found {len(loops)}")
    loops = loops[-(n_outer + len(m.axes)):]
    kinds = state.iter_kinds
    out = Loops([], [], [], [], [])
    for name, loop in zip(m.outer, loops[:n_outer]):
        (out.outer_reduce if kinds[name] == "R" else out.outer_spatial).append(loop)
        if kinds[name] != "R":
            out.outer_names.append(name)
    with state.step(StepKind.TILE, "tile to " + "x".join(str(a.size) for a in m.axes)):
        for a, loop in zip(m.axes, loops[n_outer:]):
            o, i = sch.split(loop, [None, a.size])
            (out.axis_reduce if a.kind == "R" else out.axis_spatial).append(o)
            out.inner.append(i)
        sch.reorder(*out.outer_spatial, *out.axis_spatial, *out.outer_reduce, *out.axis_reduce,
                    *out.inner)
    state.loops = out
    return state


def schedule_outer_loops(state: RewriteState) -> RewriteState | None:
    """The target's default schedule (or the caller's), unless tiles are staged per tile
    (scratchpad, fragments: their stages already arranged the loops)."""
    if not state.schedule or state.tiled:
        return None
    fn = default_schedule if state.schedule is True else state.schedule
    with state.step(StepKind.LOOPS, "default schedule for the target"):
        note = fn(state.sch, state.block, state.loops, state.match, state.target)
    if note:
        state.steps[-1] = Step(StepKind.SCHEDULE, note)
    return state


def decompose(state: RewriteState) -> RewriteState | None:
    loops = state.loops
    reduce_loops = loops.outer_reduce + loops.axis_reduce
    if state.compute_tensorized or state.pattern.init_value is None or not reduce_loops:
        return None
    with state.step(StepKind.DECOMPOSE, "decompose_reduction (split off the init)"):
        state.init_block = state.sch.decompose_reduction(state.block, reduce_loops[0])
    return state


def tensorize_compute(state: RewriteState) -> RewriteState | None:
    if state.compute_tensorized:
        return None
    intrin = state.match.intrinsic
    intrin.register()
    with state.step(StepKind.TENSORIZE, f"tensorize with {intrin.name}"):
        state.sch.tensorize(state.loops.inner[0], intrin.name)
    state.intrinsics.append(intrin.name)
    return state


def tensorize_init(state: RewriteState) -> RewriteState | None:
    group = state.match.group
    if state.compute_tensorized or state.init_block is None or group is None or group.init is None:
        return None
    init_loops = state.sch.get_loops(state.init_block)
    n_spatial = sum(1 for a in state.match.axes if a.kind == "S")
    group.init.register()
    try:
        with state.step(StepKind.TENSORIZE, f"tensorize the init with {group.init.name}"):
            state.sch.tensorize(init_loops[-n_spatial], group.init.name)
        state.intrinsics.append(group.init.name)
    except RewriteError:
        state.record(StepKind.INIT_LEFT, "init left to TVM (its tile does not fit the init intrinsic)")
    return state


def link_libraries(state: RewriteState) -> RewriteState:
    """The result function (tiles that share a scratchpad addressed so that TVM's merging of
    their allocations keeps them apart, `tirbyoc.rewrite.block.addresses`); with the template's
    extern libraries loaded (RTLD_GLOBAL, so this process can JIT and run it) and their paths
    attached for export_library / Relax."""
    func = address_merged_tiles(state.sch.mod["main"])
    libraries = list(state.template.libraries) if state.template is not None else []
    if libraries:
        for lib in libraries:
            lib.load()
        func = func.with_attr("tirbyoc.libraries", [str(lib.path) for lib in libraries])
        state.record(StepKind.LINK, "links " + ", ".join(lib.name for lib in libraries))
    state.func = func
    return state


__all__ = ["canonicalize", "commute", "commuted", "decompose", "link_libraries", "schedule_outer_loops",
           "tensorize_compute", "tensorize_init", "tile"]
