"""The rows' staging copy made per row block: an im2col, or a padded copy of a GEMM's rows,
computed inside the parallel loop over row blocks, right before the intrinsic reads it.

A staging copy of the whole operand (ResNet-50's res2 3x3 im2col: 3136 rows x 576 bytes, 1.8
MB a call) passes through L2 once written and again once read, beside the weights and the
accumulators; per row block (32 rows: 18 KB) it is written into L1 and read from there. On an
Emerald Rapids Xeon at one thread that layer ran 0.14 ms with the whole copy, 0.095 per block
(x86_amx). Only where each parallel iteration is one row block: with column blocks fused into
the same loop, a copy per iteration would be repeated for each of them.
"""

from __future__ import annotations

from tirbyoc._tvm import s_tir
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import (block_realize, constant_divisors, divisor_split, loop_extent, padded_divisor_split,
                                 uses_var)
from tirbyoc.rewrite.functions.in_place import identity_copies


def rows_operands(sch, block, outer, columns) -> set:
    """The buffers ``block`` reads by row block, where the parallel loop the ``outer`` loops are
    fused into iterates over row blocks alone (one of them runs more than once, not
    ``columns``, the loop over output-channel tiles, and those buffers' regions move with it);
    else none. (A matrix-vector product's parallel loop runs over its columns: what moves with
    it is the weight, which stays whole, to be packed once.)"""
    many = [loop for loop in outer if loop_extent(sch, loop) != 1]
    if len(many) != 1 or (columns is not None and sch.get(many[0]).same_as(sch.get(columns))):
        return set()
    var = sch.get(many[0]).loop_var
    realize = block_realize(sch.get(sch.get_loops(block)[0]), sch.get(block))
    moved = [iv.var for iv, value in zip(realize.block.iter_vars, realize.iter_values) if uses_var(value, var)]
    writes = {r.source.name for r in realize.block.writes}
    return {r.source.name for r in realize.block.reads if r.source.name not in writes
            and any(uses_var(x.min, v) for x in r.region for v in moved)}


def stage_rows_per_block(sch, block, parallel, rows: set) -> str:
    """Move the staging copies of ``block``'s row operands (``rows``: an im2col, a padded copy
    of the rows) into ``parallel``, the loop over row blocks, so that each block copies the rows
    it reads right before reading them, into and from L1, instead of the whole operand passing
    through L2 first (ResNet-50's res2 3x3 im2col: 1.8 MB a call). A copy that moves nothing
(`tirbyoc.rewrite.functions.in_place`: it will be a view) stays where it is. Returns a note or ''."""
    moved = 0
    views = identity_copies(sch.mod["main"])  # they become views of the parameter: no copy left
    for copy in sch.get_producers(block):
        stmt = sch.get(copy)
        if (len(stmt.writes) != 1 or stmt.writes[0].source.name not in rows or stmt.init is not None
                or any(v.same_as(stmt.writes[0].source) for v in views)):
            continue
        try:
            sch.compute_at(copy, parallel, preserve_unit_loops=True)
        except s_tir.schedule.ScheduleError:
            continue
        _copy_runs_in_vectors(sch, copy)
        moved += 1
    return ", the rows' staging per row block" if moved else ""


def _copy_runs_in_vectors(sch, copy) -> None:
    """The innermost loop of a copy moved into a row block, split at the constants its indices
    divide it by (an im2col's ``k // 192``, ``k % 192 // 64``: after the split no element
    divides; a row padded past them, at the largest, `padded_divisor_split`) and its last piece
    vectorized, a register of elements (or 16) at a time. The bf16 ResNet stem's rows (7 x 7 x 3
    padded to 148), AMD Zen 4, one thread: 3.27 -> 1.51 ms for the layer."""
    stmt = sch.get(copy)
    inner = sch.get_loops(copy)[-1]
    var = sch.get(inner).loop_var
    realize = block_realize(sch.get(sch.get_loops(copy)[0]), stmt)
    bound = [iv.var for iv, value in zip(stmt.iter_vars, realize.iter_values) if uses_var(value, var)]
    extent = loop_extent(sch, inner) or 0
    divisors = constant_divisors(stmt.body, bound).get(bound[0], ()) if len(bound) == 1 else ()
    factors = divisor_split(extent, divisors) or padded_divisor_split(extent, divisors)
    if factors is not None:
        inner = sch.split(inner, factors=factors)[-1]
        extent = factors[-1]
    vector = 64 // dtype_bytes(str(stmt.writes[0].source.dtype))  # one zmm of elements
    lanes = next((n for n in (vector, 16) if n <= extent and extent % n == 0), 0)
    if lanes >= 16:
        sch.vectorize(sch.split(inner, [None, lanes])[1] if extent > lanes else inner)


__all__ = ["rows_operands", "stage_rows_per_block"]
