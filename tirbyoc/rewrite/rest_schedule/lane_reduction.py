"""Row reductions in vector lanes: a softmax's max and sum, a layer norm's two sums, a whole
tensor's max and min (a run-time quantizer's range).

`tirbyoc.rewrite.rest_schedule.nests` runs the rows of a reduction in parallel but each row's reduction in
order, one element after the other: a chain of dependent adds, each waiting three or four
cycles for the one before (BERT-base, fp32, 1 thread on Zen 5: 24 layer norms 3.2 ms and 12
softmaxes 4.6 ms of 105). Here the reduction loop is split into vectors of lanes and
``rfactor``'d: each lane keeps its own partial result across the row, one vector operation a
step, and a short serial pass sums the lanes at the end.

A max or a min, and an integer sum, come out the same whatever the order: always done. A float
sum's last bits move with its order, so it is split only where the caller allows
(``exact=False``: `tirbyoc.relax.rest` allows it in a float model, whose verification compares
within float rounding, not in a quantized one, where a moved rounding tie changes a whole
8-bit step).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tirbyoc._tvm import REDUCE, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import block_realize, loop_extent, spatial_prefix, uses_var


@dataclass(frozen=True)
class LaneReduction:
    """A reduction split into lanes: its block, the rows run in parallel (0: none), the lanes."""

    block: str
    parallel: int
    lanes: int


def combiner(block) -> str | None:
    """"max", "min" or "sum": what ``block``'s update combines its accumulator with; None for
    any other update (a tuple reduction, a product, a body that is not one store)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return None
    kinds = ((tirx.Max, "max"), (tirx.Min, "min"), (tirx.Add, "sum"))
    return next((name for cls, name in kinds if isinstance(store.value, cls)), None)


def order_free(block) -> bool:
    """Whether ``block``'s reduction gives the same bits in any order: a max, a min, or an
    integer sum."""
    kind = combiner(block)
    dtype = str(block.writes[0].source.dtype) if block.writes else ""
    return kind in ("max", "min") or (kind == "sum" and dtype.startswith(("int", "uint")))


def _lanes_axis(sch, block, lanes: int):
    """The innermost loop of ``block`` when it is the reduction's only loop - or the last of
    several, all inside the rows (a whole tensor's max: a run-time quantizer's range) -, steps
    contiguous elements of every read, and splits into at least two vectors of ``lanes``;
    else None."""
    loops = sch.get_loops(block)
    if not loops:
        return None
    realize = block_realize(sch.get(loops[0]), sch.get(block))
    var = sch.get(loops[-1]).loop_var
    bound = [(iv, v) for iv, v in zip(realize.block.iter_vars, realize.iter_values) if uses_var(v, var)]
    reductions = [iv for iv in realize.block.iter_vars if int(iv.iter_type) == REDUCE]
    if len(bound) != 1 or not reductions or not bound[0][0].same_as(reductions[-1]):
        return None
    if not bound[0][1].same_as(var) or any(int(sch.get(l).kind) != int(tirx.ForKind.SERIAL) for l in loops):
        return None
    if len(reductions) > 1 and _rows_of(sch, block) + len(reductions) != len(loops):
        return None  # a reduction loop between the rows: not a nest this splits
    ext = sch.get(loops[-1]).extent
    if not isinstance(ext, tirx.IntImm) or int(ext) % lanes or int(ext) < 2 * lanes:
        return None
    k = reductions[-1].var
    for region in realize.block.reads:
        if any(uses_var(r.min, k) for r in list(region.region)[:-1]):  # across rows: gathers
            return None
    return loops[-1]


def _rows_of(sch, block) -> int:
    """How many loops of ``block`` come before its first reduction loop (its rows)."""
    loops = sch.get_loops(block)
    return len(spatial_prefix(sch, loops, block_realize(sch.get(loops[0]), sch.get(block))))


def lane_reduction(sch, block, vector_bytes: int, exact: bool = True,
                   parallel_rows=None) -> LaneReduction | None:
    """Split ``block``'s row reduction into vectors of ``vector_bytes`` (the module docstring's
    schedule) and return what was done; None, with ``sch`` unchanged, where it does not
    apply. ``parallel_rows(sch, loops, work) -> iterations`` runs the rows ``loops`` (``work``
    elements in all) in parallel where worth it (iterations run in parallel, 0: none); it is
    called before the partial results' init is split off, while TVM still sees the nest as
    one reduction (it will not put a loop around a bare update in parallel)."""
    stmt = sch.get(block)
    if stmt.init is None or not stmt.writes or combiner(stmt) is None or (exact and not order_free(stmt)):
        return None
    lanes = vector_bytes // max(1, dtype_bytes(str(stmt.writes[0].source.dtype)))
    axis = _lanes_axis(sch, block, lanes) if lanes > 1 else None
    if axis is None:
        return None
    name, length = str(stmt.name_hint), int(sch.get(axis).extent)
    rows = _rows_of(sch, block)
    reduction_loops = len(sch.get_loops(block)) - rows
    _, inner = sch.split(axis, [None, lanes])
    partial = sch.rfactor(inner, factor_axis=rows)  # partial[rows..., lane]
    sch.vectorize(sch.get_loops(partial)[-1])
    # a row count known only at run time counts as one row (as `rest` counts it)
    work = length * prod(loop_extent(sch, l) or 1 for l in sch.get_loops(partial)[:rows])
    parallel = parallel_rows(sch, sch.get_loops(partial)[:rows], work) if parallel_rows and rows else 0
    # the outermost reduction loop (the rows before it may be fused by now): the lanes start once
    steps = sch.get_loops(partial)[-(reduction_loops + 1)]
    init = sch.decompose_reduction(partial, steps)
    if int(sch.get(sch.get_loops(init)[-1]).kind) != int(tirx.ForKind.VECTORIZED):
        sch.vectorize(sch.get_loops(init)[-1])
    return LaneReduction(name, parallel, lanes)


__all__ = ["LaneReduction", "combiner", "lane_reduction", "order_free"]
