"""Row reductions in order, a vector of rows at a time: a layer norm's sums, a softmax's max
and sum where `lane_reduction` may not reorder them.

A reduction whose rows each run in order is a chain of dependent operations per row, each
waiting for the one before (a float add: three or four cycles). `lane_reduction` splits a
row into lanes, which moves a float sum's last bits, so a quantized model - verified bit for
bit against TVM's build - keeps its sums serial: BERT-base's int8 layer norm spent 0.2 ms a
call on its two sums of 128 x 768, its softmax's sum of 1,536 x 128 most of the rest of its
time outside ``exp``.

Here the rows go into the lanes instead: the rows are fused and split into vectors of
``lanes`` rows, the reduction loop is moved outside the lanes, and each lane reduces its own
row in the order TVM's build does - the same bits, ``lanes`` independent chains at once. The
reads become strided (one element from each of ``lanes`` rows: TVM's vectorizer loads them
one by one), which costs less than the chain's latency. A row count known only at run time
(a served model's tokens) is split with a predicate: the rows past the end are not computed,
and `tirbyoc.rewrite.cpu.vector_tails` gives the loop a whole-vector version where every lane
is a real row. Layer norm 0.2 -> 0.05 ms a call (Zen 4, one thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc._tvm import REDUCE, SPATIAL, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import block_realize, loop_extent, uses_var
from tirbyoc.rewrite.rest_schedule.lane_reduction import combiner


@dataclass(frozen=True)
class RowLanes:
    """A reduction run a vector of rows at a time: its block, the row vectors run in parallel
    (their count, 0: none; a count known only at run time counts its constant factors), the
    lanes (rows per vector)."""

    block: str
    parallel: int
    lanes: int
    run_time: bool = False  # the parallel extent is known only at run time


def _row_loops(sch, block):
    """(the loops of ``block``'s rows, its reduction loop) when its innermost loop is its only
    reduction loop, bound to its one reduction iterator, and every loop outside it is bound
    to spatial iterators only and runs serially; else None."""
    loops = sch.get_loops(block)
    if len(loops) < 2 or any(int(sch.get(l).kind) != int(tirx.ForKind.SERIAL) for l in loops):
        return None
    realize = block_realize(sch.get(loops[0]), sch.get(block))
    binds = list(zip(realize.block.iter_vars, realize.iter_values))
    reductions = [iv for iv in realize.block.iter_vars if int(iv.iter_type) == REDUCE]
    k = sch.get(loops[-1]).loop_var
    if len(reductions) != 1 or not any(iv.same_as(reductions[0]) and v.same_as(k) for iv, v in binds):
        return None
    for loop in loops[:-1]:
        var = sch.get(loop).loop_var
        if any(int(iv.iter_type) != SPATIAL for iv, v in binds if uses_var(v, var)):
            return None
    return loops[:-1], loops[-1]


def row_lanes(sch, block, vector_bytes: int, parallel_rows) -> RowLanes | None:
    """Run ``block``'s rows ``lanes`` at a time, each in order (the module docstring), and say
    what was done; None, with ``sch`` unchanged, where it does not apply: not a max, min or
    sum over its innermost loop, or fewer than two vectors of rows known at compile time.
    ``parallel_rows(sch, loops, work) -> iterations`` runs the row vectors in parallel where
    worth it (``work`` None: known only at run time)."""
    stmt = sch.get(block)
    if stmt.init is None or len(stmt.writes) != 1 or combiner(stmt) is None:
        return None
    lanes = vector_bytes // max(1, dtype_bytes(str(stmt.writes[0].source.dtype)))
    found = _row_loops(sch, block) if lanes > 1 else None
    if found is None:
        return None
    rows, k = found
    extents = [loop_extent(sch, l) for l in rows + [k]]
    known = None not in extents
    count = 1
    for e in extents[:-1]:
        count *= e or 1
    if known and count < 2 * lanes:
        return None
    fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    outer, lane = sch.split(fused, [None, lanes])
    sch.reorder(k, lane)
    work = count * extents[-1] if known else None
    parallel = parallel_rows(sch, [outer], work)
    sch.vectorize(lane)  # while the block is a reduction still: TVM refuses a bare update
    init = sch.decompose_reduction(block, k)
    if int(sch.get(sch.get_loops(init)[-1]).kind) != int(tirx.ForKind.VECTORIZED):
        sch.vectorize(sch.get_loops(init)[-1])
    return RowLanes(str(stmt.name_hint), parallel, lanes, run_time=parallel > 0 and not known)


__all__ = ["RowLanes", "row_lanes"]
