"""The CPU schedule of channel-wise reductions: depthwise convolutions and NHWC pooling.

A depthwise convolution (``group_conv2d_nhwc`` with one input channel per group), a pooling
window over NHWC, any reduction whose output's last index is a channel that every input reads
at its own last index, has no dot product for a GEMM intrinsic to take: each output channel
reduces its own window. Left to TVM's lowering it runs one scalar multiply-add at a time, on
one core (MobileNetV2's depthwise layers: 7% of its MACs, two thirds of its time). Its
parallelism is across channels, which NHWC keeps contiguous, so this schedule vectorizes over
them:

* the channel loop is split into vectors of `lanes` accumulators (one vector register of the
  accumulator's dtype) and moved innermost, under the reduction loops, so that each step is
  one vector load of the input, one of the weight and a vector multiply-add;
* `columns` neighbouring output columns share each weight vector: a register block of
  ``columns x lanes`` accumulators, written back once, after the whole window;
* a weight read with the channel in another position (ONNX's depthwise ``[C, 1, kh, kw]``
  weight, ``[C, kh, kw, 1]`` once in NHWC) gets a copy that moves the channel last: for a
  constant weight `tirbyoc.relax.prepack` runs that copy once, at compile time;
* a producer that only copies its input (a pad of zero width left by the layout change),
  widens it (an integer sum's 8-bit input) or pads it with a constant is inlined: each window load checks its bounds instead of a pass
  over the whole input into a padded workspace first (`bench/pad_inlining.py`, AMD Zen 4
  without AVX-512: ResNet's stem max pool 2-2.6x faster, MobileNetV2's depthwise layers
  0.24-0.93x the time but for one, int8 112x112x32 stride 1, 1.15x; whole built-in models
  unchanged within the noise);
* everything outside the register block runs in parallel (rows x column blocks x channel
  vectors);
* extents known only at run time (a served attention's zero-point sums over ``seq``, or of
  ``seq`` channels) keep the schedule: a run-time reduction or row loop as it is, run-time
  columns one a block, run-time channels in whole vectors with the last one predicated
  (`tirbyoc.rewrite.cpu.vector_tails` gives every vector of real lanes an unpredicated
  version) - int8 BERT's two such sums a layer (one thread, inside the model) 0.046 / 0.048 -> 0.004 / 0.005 ms a call;
* for an integer accumulator the elementwise chain after it (requantization, clip, the
  narrowing cast) is fused into the register block's write-back, exactly as for a core
  (`tirbyoc.rewrite.cpu.cpu_epilogue`: its float products fenced, so no value moves).

Only spatial loops move relative to the reduction loops, and those keep their order: every
output is summed in the same order as TVM's build, so float results are bit for bit the same
too. Each step is a schedule primitive that checks its own legality.
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc._tvm import REDUCE, SPATIAL, PrimCall, call_name, expr_dtype, prim_expr, sym, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import loop_extent, perfect_nest, uses_var
from tirbyoc.rewrite.cpu.register_blocks import WRITEBACK_ATTR, fusable_prefix, lanes_dividing
from tirbyoc.rewrite.cpu.cpu_epilogue import fuse_into_writeback, point_indices

MIN_LANES = 4  # a channel count no vector of at least this many lanes divides stays as it was


@dataclass(frozen=True)
class ChannelReduction:
    """What `schedule_channel_reduction` did to one block."""

    block: str
    parallel: int  # the parallel loop's extent
    lanes: int  # channels per vector
    columns: int  # output columns per register block
    packed: tuple  # weights given a channel-last copy (parameter names)
    epilogue: tuple  # the blocks fused into the write-back
    epilogue_stop: str | None  # why the chain after it stops, where it does

    def note(self) -> str:
        parts = [f"channel vectors of {self.lanes}, {self.columns}x{self.lanes} accumulator blocks"]
        if self.packed:
            parts.append(f"{', '.join(self.packed)} copied channel-last")
        if self.epilogue:
            parts.append(f"epilogue fused into the write-back ({len(self.epilogue)} blocks)")
        if self.epilogue_stop:
            parts.append(f"epilogue left: {self.epilogue_stop}")
        return "; ".join(parts)


def _unit_stride(index, var) -> bool:
    """``index`` is ``var`` plus something that does not use it."""
    linear = sym.detect_linear_equation(index, [var])
    return len(linear) == 2 and getattr(linear[0], "value", None) == 1 and not uses_var(linear[1], var)


def _channel_reads(stmt, channel, params, reductions) -> list | None:
    """For each read of ``stmt`` that uses ``channel`` anywhere but at its last index with a
    unit stride: (its buffer, the index position that holds the channel), when the read is a
    function parameter indexed there by exactly ``channel`` (a weight a copy can lay out
    channel-last). None when some read can be neither vectorized nor copied, or when no read
    that the reduction walks (through one of ``reductions``) has the channel last: a row
    reduction (a layer norm's variance reads its mean per row, its input across the row), a
    GEMM, is not channel-wise."""
    copies, contiguous = [], False
    for read in stmt.reads:
        indices = point_indices(read)
        if indices is None:
            return None
        using = [p for p, index in enumerate(indices) if uses_var(index, channel)]
        if not using:
            continue
        if using == [len(indices) - 1] and _unit_stride(indices[-1], channel):
            # the reduced operand (a window of the input), not a per-row statistic
            contiguous = contiguous or any(uses_var(i, r) for i in indices for r in reductions)
            continue
        if len(using) != 1 or not indices[using[0]].same_as(channel) or \
                not any(read.source.same_as(p) for p in params):
            return None
        copies.append((read.source, using[0]))
    return copies if contiguous else None


def _copy_or_pad(stmt) -> bool:
    """A block that stores one read of its one input unchanged (a zero-width pad), cast (an
    8-bit input widened for an integer sum) or, outside the input's bounds, a constant (a pad:
    ``if_then_else(in bounds, x[...], c)``)."""
    value = getattr(stmt.body, "value", None)
    if not (len(stmt.reads) == 1 and len(stmt.writes) == 1 and stmt.init is None and value is not None
            and all(int(iv.iter_type) == SPATIAL for iv in stmt.iter_vars)):
        return False

    def is_read(v) -> bool:
        return hasattr(v, "source") and v.source.same_as(stmt.reads[0].source)

    if isinstance(value, PrimCall) and call_name(value) == "prim.if_then_else":
        return is_read(value.args[1]) and isinstance(value.args[2], (prim_expr.IntImm, prim_expr.FloatImm))
    if isinstance(value, tirx.Cast):  # a widening (an integer sum's 8-bit input): each load converts
        return is_read(value.value)
    return is_read(value)


def _shape(sch, block):
    """(the block's loops, its iterators in loop order, the channel iterator, the column
    iterator or None) when its loops form a perfect nest binding its iterators one to one and
    its output is indexed by them, the last being a spatial channel; else None."""
    stmt = sch.get(block)
    if stmt.init is None or len(stmt.writes) != 1 or not stmt.iter_vars:
        return None
    loops = sch.get_loops(block)
    nest = perfect_nest(sch.get(loops[0])) if loops else None
    if nest is None or len(nest[0]) != len(loops) or len(loops) != len(stmt.iter_vars):
        return None
    binds = list(zip(stmt.iter_vars, nest[1].iter_values))
    order = []
    for loop in loops:
        var = sch.get(loop).loop_var
        bound = [iv for iv, value in binds if value.same_as(var)]
        if len(bound) != 1:
            return None
        order.append(bound[0])
    out = point_indices(stmt.writes[0])
    by_var = [(iv.var, iv) for iv in stmt.iter_vars]

    def iterator(index):
        return next((iv for var, iv in by_var if index.same_as(var) and int(iv.iter_type) == SPATIAL), None)

    if not out:
        return None
    channel = iterator(out[-1])
    if channel is None:
        return None
    column = iterator(out[-2]) if len(out) > 1 else None
    return loops, order, channel, column


def _permutation(perm: list, index_dtype: str):
    """The IndexMap taking index ``i`` of a buffer to position ``perm.index(i)``."""
    return tirx.IndexMap.from_func(lambda *idx: [idx[p] for p in perm], ndim=len(perm), index_dtype=index_dtype)


def _copy_channel_last(sch, block, copies) -> list[str]:
    """Give each (weight, channel position) of ``copies`` a copy with the channel moved last,
    read by ``block`` in its place; the weights' names."""
    packed = []
    for buffer, at in copies:
        i = next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(buffer))
        copy = sch.cache_read(block, i, "global")
        rank = len(buffer.shape)
        perm = [p for p in range(rank) if p != at] + [at]
        sch.transform_layout(copy, ("write", 0), _permutation(perm, expr_dtype(buffer.shape[0])))
        packed.append(str(buffer.name))
    return packed


def is_channel_reduction(sch, block) -> bool:
    """Whether ``block`` is a channel-wise reduction `schedule_channel_reduction` takes (before
    its vector width is known) with nothing shared between channels: each output channel
    reduces its own window, the channel last in the output and in the reduced input, and every
    operand the reduction walks is indexed by the channel (a depthwise convolution, an NHWC
    pooling; not a GEMM, whose rows are a dot product every channel shares)."""
    shape = _shape(sch, block)
    if shape is None:
        return False
    _, order, channel, _ = shape
    stmt = sch.get(block)
    reduce_vars = [iv.var for iv in order if int(iv.iter_type) == REDUCE]
    if not reduce_vars or _channel_reads(stmt, channel.var, list(sch.mod["main"].params), reduce_vars) is None:
        return False
    # no operand shared by the channels along the reduction (a GEMM's A[i, k]: a dot product)
    walked = [point_indices(r) for r in stmt.reads]
    return all(any(uses_var(i, channel.var) for i in idx) for idx in walked
               if any(uses_var(i, r) for i in idx for r in reduce_vars))


def _channel_lanes(channels: int | None, most: int) -> int:
    """Channels a vector: ``most`` where their count is known only at run time (an attention's
    seq: whole vectors, the last predicated - `tirbyoc.rewrite.cpu.vector_tails` runs every
    vector of real lanes unpredicated), else the most that divide it (0: none of `MIN_LANES`
    or more)."""
    return most if channels is None else lanes_dividing(channels, most, MIN_LANES)


def _parallel_outer(sch, loops: list) -> tuple:
    """(the parallel loop, the loop whose iterations are the register blocks): ``loops`` fused
    and run in parallel, but from the first inner one of run-time extent on left nested
    (`fusable_prefix`): an iteration is a few dozen vector adds, which a fused index divided by
    a run-time size would cost as much as."""
    n = fusable_prefix(sch, loops)
    parallel = sch.fuse(*loops[:n]) if n > 1 else loops[0]
    sch.parallel(parallel)
    return parallel, loops[-1] if n < len(loops) else parallel


def schedule_channel_reduction(sch, block, vector_bytes: int, registers: int = 32) -> ChannelReduction | None:
    """Schedule ``block`` as the module's docstring says, or return None (``sch`` untouched)
    when it is not a channel-wise reduction: no init, loops not one per iterator, an output
    not ending in a spatial channel, a read that uses the channel other than at its last
    index (and is no weight a copy can lay out channel-last), or a channel count no vector of
    `MIN_LANES` or more divides."""
    shape = _shape(sch, block)
    if shape is None:
        return None
    loops, order, channel, column = shape
    stmt = sch.get(block)
    func = sch.mod["main"]
    reduce_vars = [iv.var for iv in order if int(iv.iter_type) == REDUCE]
    copies = _channel_reads(stmt, channel.var, list(func.params), reduce_vars)
    if copies is None:
        return None
    acc_dtype = str(stmt.writes[0].source.dtype)
    position = {iv.var: i for i, iv in enumerate(order)}
    cloop, wloop = loops[position[channel.var]], loops[position[column.var]] if column is not None else None
    if wloop is not None and loop_extent(sch, wloop) is None:
        wloop = None  # columns known only at run time: one a block, an outer loop like the rows
    lanes = _channel_lanes(loop_extent(sch, cloop), vector_bytes // max(1, dtype_bytes(acc_dtype)))
    if not lanes:
        return None
    name = str(stmt.name_hint)
    for producer in sch.get_producers(block):
        if _copy_or_pad(sch.get(producer)):
            sch.compute_inline(producer)
    packed = _copy_channel_last(sch, block, copies)
    columns = 1
    if wloop is not None:
        width = loop_extent(sch, wloop)
        columns = max(d for d in range(1, max(1, registers // 4) + 1) if width % d == 0)
    spatial = [l for l, iv in zip(loops, order) if int(iv.iter_type) == SPATIAL and l not in (cloop, wloop)]
    reductions = [l for l, iv in zip(loops, order) if int(iv.iter_type) != SPATIAL]
    co, ci = sch.split(cloop, [None, lanes])
    outer, inner = spatial, [ci]
    if wloop is not None:
        wo, wi = sch.split(wloop, [None, columns])
        outer, inner = spatial + [wo], [wi, ci]
    sch.reorder(*outer, co, *reductions, *inner)
    parallel, block_loop = _parallel_outer(sch, [*outer, co])
    acc = sch.cache_write(block, 0, "global")
    integer = acc_dtype.startswith(("int", "uint"))
    if integer:  # a float core's products stay unfenced, as TVM's build leaves them
        sch.annotate(acc, WRITEBACK_ATTR, 1)
    sch.reverse_compute_at(acc, block_loop, preserve_unit_loops=True)
    if wloop is not None:
        sch.unroll(inner[0])
    sch.vectorize(ci)  # before the init is split off: TVM vectorizes a reduction block only
    init = sch.decompose_reduction(block, reductions[0])
    sch.vectorize(sch.get_loops(init)[-1])
    fused, stop = fuse_into_writeback(sch, acc) if integer else ((), None)
    acc_loops = sch.get_loops(acc)
    sch.vectorize(acc_loops[-1])
    if wloop is not None and len(acc_loops) > 1:
        sch.unroll(acc_loops[-2])
    return ChannelReduction(name, loop_extent(sch, parallel) or 0, lanes, columns, tuple(packed), tuple(fused), stop)


__all__ = ["ChannelReduction", "is_channel_reduction", "schedule_channel_reduction"]
