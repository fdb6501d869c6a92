"""The CPU schedule of the loop nests no template took: parallel rows, vector lanes.

What tirbyoc does not offload, TVM builds as ``LegalizeOps`` wrote it: every loop serial, on
one core, vectorized only where LLVM manages it by itself. In a model whose cores are
offloaded that rest is what is left of its time (BERT-base on blas: GELU, softmax and layer
norms, a quarter of the run). This gives each such loop nest the parallel and vector steps of
MetaSchedule's default CPU rule (``ParallelizeVectorizeUnroll``), untuned, keeping every value
bit for bit:

* the fewest leading loops that only spatial block iterators use and that give `ROWS`
  iterations are fused and run in parallel (the rows of a softmax or a layer norm, the
  outer dimensions of an elementwise nest); the loops inside them stay as they are, so that
  indices need no division and LLVM still sees the inner loops it vectorizes;
* a nest with no reduction (elementwise, a transpose, a reshape) runs its innermost loop
  as vectors of its output's dtype, where the lanes divide that loop's extent (vectorizing
  a fused loop would index every lane through divisions: gathers);
* a nest of fewer than `MIN_PARALLEL` iterations is not worth waking the thread pool for;
  one whose extents are known only at run time (a served model's ``batch`` and ``seq``) runs
  its rows in parallel whatever their count (a few microseconds where they are few);
* first, a chain of elementwise nests is inlined into its last one
  (`tirbyoc.rewrite.rest_schedule.elementwise_chain`): one pass over the data, not one per operator.

A channel-wise reduction (a depthwise convolution, an NHWC pooling window: each output channel
reduces its own window) gets `tirbyoc.rewrite.rest_schedule.channel_reduction`'s schedule instead: vectors
across channels, register blocks of output columns, its epilogue fused into the write-back.

A row reduction (a softmax's max and sum, a layer norm's sums) runs each row in vector lanes
(`tirbyoc.rewrite.rest_schedule.lane_reduction`) where that keeps every bit: a max, a min, an integer sum;
a float sum that must keep TVM's order (or whose rows have a run-time length) runs a vector of
rows at a time, each row in order (`tirbyoc.rewrite.rest_schedule.row_lanes`).
A float sum moves its last bits in another order, and a float ``exp`` or ``erf`` as vector
arithmetic (`tirbyoc.rewrite.rest_schedule.vector_math`, within 2 units in the last place, instead of one
libm call per element) moves them too: both only with ``exact=False``, which
`tirbyoc.relax.rest` passes for a float model, never for a quantized one (a rounding tie
moved by a last bit changes a whole 8-bit step). Each step is one of TVM's schedule
primitives, which check their own legality; a nest a primitive refuses stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tirbyoc._tvm import SPATIAL, s_tir, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import loop_extent, perfect_nest, spatial_prefix
from tirbyoc.rewrite.rest_schedule.channel_reduction import schedule_channel_reduction
from tirbyoc.rewrite.rest_schedule.elementwise_chain import inline_elementwise_chains
from tirbyoc.rewrite.rest_schedule.lane_reduction import lane_reduction
from tirbyoc.rewrite.rest_schedule.row_lanes import row_lanes
from tirbyoc.rewrite.rest_schedule.vector_math import vectorizable_math

SCHEDULED_ATTR = "tirbyoc.rest"  # set on a function this schedule changed: what it did
MIN_PARALLEL = 4096  # iterations below which TVM's parallel launch costs more than it saves
ROWS = 64  # parallel iterations enough to share a nest evenly among the cores
ROW_LANES_NOTE = "a vector of rows, each summed in order"  # `row_lanes`' nests, as the report names them


@dataclass(frozen=True)
class NestSchedule:
    """What one loop nest got: its block, the fused parallel extent (0: none), the vector
    lanes (0: none) and, for a channel-wise reduction, what its schedule did."""

    block: str
    parallel: int
    lanes: int
    note: str = ""
    packed: tuple = ()  # weights (parameter names) given a layout-changing copy
    inlined: int = 0  # elementwise steps inlined into the next (`elementwise_chain`; no nest of its own)


def _lanes(sch, block, vector_bytes: int) -> int:
    """Elements of the block's (first) output in one vector register."""
    writes = sch.get(block).writes
    return vector_bytes // max(1, dtype_bytes(str(writes[0].source.dtype))) if writes else 0


def _schedule_nest(sch, block, vector_bytes: int) -> NestSchedule | None:
    lanes = _lanes(sch, block, vector_bytes)
    loops = sch.get_loops(block)
    nest = perfect_nest(sch.get(loops[0])) if loops else None
    if nest is None or len(nest[0]) != len(loops):  # something between the loops a fuse would move
        return None
    if any(int(sch.get(l).kind) != 0 for l in loops):  # 0: ForKind.SERIAL; scheduled already
        return None
    prefix = spatial_prefix(sch, loops, nest[1])
    if not prefix:
        return None
    # a run-time extent (a served model's batch, seq): its rows run in parallel whatever their
    # count, a static innermost loop in vectors as ever
    work = None if any(loop_extent(sch, l) is None for l in loops) else _iterations(sch, loops)
    elementwise = len(prefix) == len(loops) and all(int(iv.iter_type) == SPATIAL for iv in sch.get(block).iter_vars)
    vector = lanes if elementwise and lanes > 1 and _iterations(sch, loops[-1:]) % lanes == 0 else 0
    if vector:  # indices stay a ramp over the lanes, outer operands a broadcast
        outer, inner = sch.split(loops[-1], [None, vector])
        sch.vectorize(inner)
        prefix = [outer] if len(prefix) == 1 else prefix[:-1]
    elif len(prefix) == len(loops) > 1:
        prefix = prefix[:-1]  # the innermost loop stays whole, for LLVM's vectorizer
    rows = _rows(sch, prefix)
    fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    run_time = loop_extent(sch, fused) is None
    parallel = _iterations(sch, [fused]) if work is None or work >= MIN_PARALLEL else 0
    if parallel > 1 or (run_time and parallel):
        sch.parallel(fused)
    else:
        parallel = 0
    name = str(sch.get(block).name_hint)
    return NestSchedule(name, parallel, vector) if parallel or vector else None


def _iterations(sch, loops) -> int:
    """The iterations of ``loops`` (a loop of symbolic extent counts as one)."""
    return prod(loop_extent(sch, loop) or 1 for loop in loops)


def _rows(sch, prefix) -> list:
    """The fewest leading loops of ``prefix`` with at least `ROWS` iterations (all of them if
    fewer): the loops fused into the parallel one. Fusing more would cost a division per
    iteration for every index, and take the loop nest LLVM vectorizes away from it."""
    for n in range(1, len(prefix) + 1):
        if _iterations(sch, prefix[:n]) >= ROWS:
            return prefix[:n]
    return prefix


def _parallel_rows(sch, loops, work: int | None) -> int:
    """Fuse the fewest of the rows ``loops`` that give `ROWS` iterations and run them in
    parallel when the nest does ``work`` >= `MIN_PARALLEL` (None: known only at run time, run
    in parallel whatever the count); the parallel iterations (0: none)."""
    rows = _rows(sch, loops)
    if not rows or (work is not None and work < MIN_PARALLEL):
        return 0
    fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    if loop_extent(sch, fused) is not None and _iterations(sch, [fused]) < 2:
        return 0
    sch.parallel(fused)
    return _iterations(sch, [fused])


def _reductions_tried(sch, taken: set, attempt, note: str = "") -> tuple:
    """(the schedule with each reduction not in ``taken`` scheduled by ``attempt(sch, block)``
    where it applies - it returns what it did, or None with ``sch`` unchanged - each on a copy
    kept only where it applied; the nests so scheduled, with ``note``)."""
    done = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if str(sch.get(block).name_hint) in taken or sch.get(block).init is None:
            continue
        trial = sch.copy()
        try:
            found = attempt(trial, block)
        except s_tir.ScheduleError:  # a primitive refused: the block is scheduled as any other
            continue
        if found is not None:
            sch = trial
            done.append(NestSchedule(found.block, found.parallel, found.lanes, note))
    return sch, done


def _row_reductions(sch, vector_bytes: int, exact: bool, taken: set) -> tuple:
    """(the schedule with the row reductions not in ``taken`` split into vector lanes where
    that keeps every bit (`lane_reduction`), else, for a float sum, run a vector of rows at a
    time, each row in order (`row_lanes`); the nests so scheduled)."""
    sch, lanes = _reductions_tried(sch, taken, lambda trial, block: lane_reduction(
        trial, block, vector_bytes, exact, _parallel_rows))
    sch, rows = _reductions_tried(sch, taken | {n.block for n in lanes}, lambda trial, block: row_lanes(
        trial, block, vector_bytes, _parallel_rows), ROW_LANES_NOTE)
    return sch, lanes + rows


def schedule_rest(func, vector_bytes: int, registers: int = 32, channel_reductions: bool = True,
                  exact: bool = True):
    """(``func`` with each top-level loop nest scheduled as the module docstring says, with
    vectors of ``vector_bytes`` and ``registers`` vector registers; the nests scheduled).
    ``channel_reductions=False``: the elementwise and row nests only (what an offloaded
    function left serial: an epilogue its core's write-back could not take). ``exact=False``:
    float sums in vector lanes and float32 exp / erf as vector arithmetic too. A function that
    is not schedulable TIR, or whose loops were scheduled already, comes back unchanged with
    no nests."""
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - not schedulable TIR (no root block): TVM's lowering as is
        return func, ()
    if not exact and channel_reductions:
        vectorized, replaced = vectorizable_math(func, ("erf", "exp"))
        if replaced and not any(int(sch.get(l).kind) != int(tirx.ForKind.SERIAL) for b in blocks for l in sch.get_loops(b)):
            sch = s_tir.Schedule(vectorized)
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
    inlined = inline_elementwise_chains(sch) if channel_reductions else 0
    if inlined:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    done = []
    for name in [str(sch.get(b).name_hint) for b in blocks] if channel_reductions else []:
        # first: a copy feeding one is inlined before it is scheduled
        current = {str(sch.get(b).name_hint): b for b in sch.get_child_blocks(sch.get_sblock("root"))}
        if name not in current:  # inlined into one scheduled before it
            continue
        block = current[name]
        if sch.get(block).init is None:  # not a reduction: nothing to try, no copy to make
            continue
        trial = sch.copy()
        try:
            reduction = schedule_channel_reduction(trial, block, vector_bytes, registers)
        except s_tir.ScheduleError:  # a primitive refused: the block is scheduled as any other
            continue
        if reduction is not None:
            sch = trial
            done.append(NestSchedule(reduction.block, reduction.parallel, reduction.lanes, reduction.note(),
                                     reduction.packed))
    if channel_reductions:
        sch, rows = _row_reductions(sch, vector_bytes, exact, {n.block for n in done})
        done += rows
    taken = {n.block for n in done}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if str(sch.get(block).name_hint) in taken:
            continue
        try:
            nest = _schedule_nest(sch, block, vector_bytes)
        except s_tir.ScheduleError:  # a primitive refused: the nest keeps the steps before it
            continue
        if nest is not None:
            done.append(nest)
    if inlined:  # a change by itself, even where no nest can be parallel (symbolic extents)
        done.append(NestSchedule("", 0, 0, inlined=inlined))
    return (sch.mod["main"], tuple(done)) if done else (func, ())


__all__ = ["MIN_PARALLEL", "NestSchedule", "SCHEDULED_ATTR", "schedule_rest"]
