"""The default outer-loop schedule on CPUs: register-blocked accumulators and parallel tiles.

(The whole-buffer staging copies that feed the block - packed weights, transposes, padding -
are first turned to iterate in the order they write and run in parallel: `schedule_copies`.)

A tensorized loop nest is only fast if the accumulator stays in registers across the
reduction. Around the intrinsic this schedule keeps an ``mr x nr`` block of output tiles
(rows of the innermost loop around the intrinsic x tiles of its innermost spatial axis) in a
small accumulator buffer, runs the whole reduction over it, then writes it back once:

    parallel for (outer spatial tiles):           # fused, split over the cores
        acc[mr, nr x tile] = 0                    # the init intrinsic
        for (outer reductions, e.g. conv's kh, kw, and K / k_tile):
            for mr rows, nr tiles (unrolled):     # mr * nr independent accumulators
                intrinsic(acc[row, tile], A[row, k], B_packed[tile, k])
        write acc back (vectorised)

LLVM keeps ``acc`` in registers only if it is a stack slot, which TVM makes of buffers under
1 KiB (``kMaxStackAlloca``) and `tirbyoc.rewrite.cpu.stack` of every register block up to
`REGISTER_BLOCK_BYTES`; ``mr x nr`` is chosen within the register file (24 zmm accumulators
of the 32) as the block with the most multiply-adds per load whose sizes divide the loop
extents and whose weight panel (nr tiles over the whole reduction) stays in L2.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import SPATIAL, s_tir, tirx, vector_bytes, vector_registers
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import constant_divisors, divisor_split, loop_extent
from tirbyoc.rewrite.cpu.prefetch import mark_weight_prefetch, prefetches
from tirbyoc.rewrite.cpu.row_staging import rows_operands, stage_rows_per_block
from tirbyoc.rewrite.cpu.run_time_rows import mark_padded_row_blocks, padded_rows_note, rows_multiple
from tirbyoc.rewrite.cpu.static_rows import padded_rows
from tirbyoc.rewrite.cpu.stack import CALL_BLOCK_BYTES, REGISTER_BLOCK_BYTES, TILE_BLOCK_BYTES, WRITEBACK_ATTR
from tirbyoc.rewrite.cpu.weight_layout import operand_bytes, tiles_outermost, weight_operand, weights_first

MAX_ACCUMULATORS = 24  # leave registers for the operands (32 zmm on AVX-512)
SHORT_REDUCTION = 64  # steps below which the write-back, not the core, bounds the block
# ... and below it, or for an integer core (its write-back requantizes: ~20 vector operations an
# output), a fused epilogue beside 24 live accumulators spills
FEW_ACCUMULATORS = 15
L2_BYTES = 1024 * 1024  # a core's L2 (Zen 4/5, Cascade Lake; znver3 has half)
L1_WEIGHT_BYTES = 24 * 1024  # half a 48 KiB L1: a smaller panel stays in L1 beside the rows
CACHE_LINE = 64
L2_CYCLES_PER_LINE = 3  # a weight line from L2 per step costs about three cycles' worth of loads


def lanes_dividing(count: int, most: int, least: int = 2) -> int:
    """The most vector lanes, a power of two from ``most`` down to ``least``, that divide
    ``count`` (0: none does)."""
    lanes = most
    while lanes >= least and count % lanes:
        lanes //= 2
    return lanes if lanes >= least else 0


def _divisors(n: int | None, limit: int) -> list[int]:
    if not n:
        return [1]
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _reuse(mr: int, nr: int, panel_bytes: int, weight_tile_bytes: int, rows: int | None = None) -> float:
    """Multiply-adds per unit of the busiest port feeding them, for an ``mr x nr`` block: each
    step loads mr + nr operands from L1 (two a cycle) and, once the nr tiles' weight panel
    outgrows L1, nr weight tiles from L2 (`L2_CYCLES_PER_LINE` a 64-byte line). x86_vnni's
    ResNet-50 14x14 3x3 layer ran at 0.87 of the peak with 7 x 2 and 0.46 with 2 x 8: the
    same count of accumulators, four times the L2 lines per step."""
    # re-read from L2 by the next row block; with no other row block (a GEMV), read once anyway
    from_l2 = nr * panel_bytes > L1_WEIGHT_BYTES and (rows is None or rows > mr)
    # a tile narrower than a line (a ymm's 32 bytes) shares it with the next step's: a fraction
    l2 = L2_CYCLES_PER_LINE * nr * weight_tile_bytes / CACHE_LINE if from_l2 else 0
    return mr * nr / max(mr + nr, l2)


def panel_budget(input_bytes: int | None) -> int:
    """Bytes of L2 the weight panel of a register block's tiles may take: what the input
    leaves of it when the input fits in half of L2 (both stay there: ResNet-50's 7x7 3x3
    layers, 166 KB of input, keep two 295 KB tiles), else half of it (BERT's K = 3072 matmul,
    1.5 MB of input streaming beside the panel: 0.47 of the fma peak with a 1.2 MB panel, 0.87
    with 393 KB)."""
    if input_bytes is None or input_bytes > L2_BYTES // 2:
        return L2_BYTES // 2
    return L2_BYTES - input_bytes


def register_block(m_extent: int | None, n_extent: int | None, tile_bytes: int,
                   registers: int = 32, panel_bytes: int = 0, weight_tile_bytes: int = 0,
                   input_bytes: int | None = None, float_core: bool = True) -> tuple[int, int]:
    """(mr, nr): the ``mr x nr`` output tiles kept in registers across the reduction. Each
    step loads mr rows of A and nr tiles of B for mr * nr intrinsic calls, so the block with
    the most calls per load (`_reuse`) wins; among equals, more accumulators, then more rows.
    A block must divide the extents, fit `REGISTER_BLOCK_BYTES`, and leave, beside its
    accumulators, a register for each operand of the shorter side and one for the other: an
    AVX2 CPU has 16 vector registers, and a 4x4 block of ymm accumulators there spills every
    step. ``panel_bytes``: one weight tile's bytes over the whole reduction; the nr tiles'
    panel, which every row block re-reads, must fit `panel_budget` of ``input_bytes``. Under
    `SHORT_REDUCTION` steps, and for an integer core, the block keeps to `FEW_ACCUMULATORS`: MobileNetV2's int8 1x1
    convolution 112x112x16 -> 96 (4 steps) took 0.136 ms with 4 x 6 tiles and 0.096 with 4 x 3,
    its requantizing write-back spilling beside 24 accumulators."""
    widest = max(1, panel_budget(input_bytes) // panel_bytes) if panel_bytes else MAX_ACCUMULATORS
    short = bool(panel_bytes and weight_tile_bytes and panel_bytes // weight_tile_bytes < SHORT_REDUCTION)
    most = MAX_ACCUMULATORS if float_core and not short else FEW_ACCUMULATORS
    best = (1, 1)
    best_key = (0.0, 1, 1)
    for mr in _divisors(m_extent, most):
        for nr in _divisors(n_extent, min(most, widest)):
            count = mr * nr
            if (count > most or count * tile_bytes > REGISTER_BLOCK_BYTES
                    or count + min(mr, nr) + 1 > registers):
                continue
            key = (_reuse(mr, nr, panel_bytes, weight_tile_bytes, m_extent), count, mr)
            if key > best_key:
                best, best_key = (mr, nr), key
    return best


def _output_spec(match):
    """The intrinsic's declaration of the operand the match writes (the accumulator)."""
    return match.intrinsic.operand(next(o.operand for o in match.operands if o.is_output))


def _output_tile_bytes(match) -> int:
    """Bytes of one intrinsic call's output tile (the accumulator it updates)."""
    spec = _output_spec(match)
    return prod(spec.shape) * dtype_bytes(spec.dtype)


def _weight_tile_bytes(match) -> int:
    """Bytes of one intrinsic call's weight tile (0: no weight operand)."""
    op = weight_operand(match)
    return prod(op.tile) * dtype_bytes(match.intrinsic.operand(op.operand).dtype) if op is not None else 0


def _call_is_a_block(match, tile_bytes: int) -> bool:
    """Whether one call's output is a register block by itself (if it outgrows the vector
    registers): its accumulators live in the tile registers during the call (AMX: 2x2 tiles,
    4 KB; up to 32 rows x 512 columns for a kernel whose calls have a fixed tile the block is
    padded to), and the buffer it loads them from and stores them to is written back once, its
    epilogue fused there. A library call re-sized to the block (blas) writes in place instead."""
    group = match.group
    return tile_bytes <= (CALL_BLOCK_BYTES if group is not None and group.resize_pads else TILE_BLOCK_BYTES)


def _heuristic_block(sch, mloop, nloop, tile_bytes, registers=32):
    """`register_block`'s (mr, nr) for the loops' extents alone."""
    return register_block(loop_extent(sch, mloop) if mloop is not None else None,
                          loop_extent(sch, nloop) if nloop is not None else None, tile_bytes, registers)


def sampled_block(sch, mloop, nloop, tile_bytes):
    """(mr, nr) as MetaSchedule decisions (``sample_perfect_tile``), bounded so the block
    can stay within the register budget: what `tirbyoc.tuning` searches over."""
    rows = max(1, min(MAX_ACCUMULATORS, REGISTER_BLOCK_BYTES // max(tile_bytes, 1) - 1))
    mr = sch.sample_perfect_tile(mloop, n=2, max_innermost_factor=rows)[1] if mloop is not None else 1
    nr = sch.sample_perfect_tile(nloop, n=2, max_innermost_factor=max(1, min(8, rows)))[1] \
        if nloop is not None else 1
    return mr, nr


PARALLEL_COPY_ELEMENTS = 4096  # a smaller staging copy is not worth a parallel launch


def _whole_buffer_copy(sch, blk, main_loops) -> bool:
    """Whether ``blk`` is a whole-buffer copy outside ``block``'s loops: one write, no init,
    spatial iterators only, loops of its own, none of them scheduled already (a Winograd
    transform's unrolled positions and vector lanes stay as they are)."""
    stmt = sch.get(blk)
    loops = sch.get_loops(blk)
    return (len(stmt.writes) == 1 and stmt.init is None and bool(loops)
            and all(int(iv.iter_type) == SPATIAL for iv in stmt.iter_vars)
            and all(sch.get(l).kind == tirx.ForKind.SERIAL for l in loops)
            and not any(sch.get(l).same_as(m) for l in loops for m in main_loops))


def _in_write_order_and_parallel(sch, blk) -> bool:
    """Make ``blk`` iterate in the order of the buffer it writes where TVM can prove the
    bijection, and run its outer loops in parallel when it is large enough."""
    stmt = sch.get(blk)
    ivars = [iv.var for iv in stmt.iter_vars]
    indices = [r.min for r in stmt.writes[0].region]
    loops = sch.get_loops(blk)
    if len(indices) != len(ivars) or not all(i.same_as(v) for i, v in zip(indices, ivars)):
        try:
            sch.transform_block_layout(blk, tirx.IndexMap(ivars, indices, None))
            loops = sch.get_loops(blk)
        except s_tir.schedule.ScheduleError:
            pass  # not a bijection TVM can prove: keep the source order
    # an extent known only at run time counts as large: a served model's tokens
    if prod(loop_extent(sch, loop) or PARALLEL_COPY_ELEMENTS for loop in loops) < PARALLEL_COPY_ELEMENTS:
        return False
    if _split_by_divisors(sch, blk):
        sch.parallel(sch.get_loops(blk)[0])  # fusing the split loops would bring the divisions back
        return True
    outer = _fused_outer(sch, loops)
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True


def _fused_outer(sch, loops) -> list:
    """The loops of a copy to fuse into its parallel loop: all but the innermost, and none from
    the first extent known only at run time past the outermost on. Fused, such a loop divides
    every iteration's index by that size (a 64-bit division with no constant to
    strength-reduce, which LLVM does not hoist out of a padded copy's inner loop, its load
    being conditional): packing the attention's K at run-time seq ran 4x slower than at a
    fixed one. What is fused then divides by constants only."""
    return list(loops[:max(1, min(len(loops) - 1, fusable_prefix(sch, loops)))])


def fusable_prefix(sch, loops) -> int:
    """How many of the leading ``loops`` fuse into one without an index divided by a size
    known only at run time: those before the first loop past the outermost whose extent is
    known only at run time (all of them where none is)."""
    return next((i for i in range(1, len(loops)) if loop_extent(sch, loops[i]) is None), len(loops))


def _split_by_divisors(sch, blk) -> bool:
    """Split each loop of ``blk`` whose iterator its indices divide by constants (an im2col
    copy's ``k // 9``, ``k % 9 // 3``, ``p // 56``) at those constants, when they form a chain
    dividing the extent: after the split TVM's simplifier drops the division and modulo of
    every element (they cost more than the copy itself). Returns whether it split any."""
    stmt = sch.get(blk)
    loops = sch.get_loops(blk)
    if len(loops) != len(stmt.iter_vars):
        return False
    divisors = constant_divisors(stmt.body, [iv.var for iv in stmt.iter_vars])
    split = False
    for loop, iv in zip(loops, stmt.iter_vars):
        factors = divisor_split(loop_extent(sch, loop), divisors.get(iv.var, ()))
        if factors is None:
            continue
        sch.split(loop, factors=factors)
        split = True
    return split


def schedule_copies(sch, block) -> int:
    """Schedule the whole-buffer copies around ``block``: the staging copies that feed it
    (packing, transposes, padding, im2col) and the write-backs it feeds (a reindexed output
    stored in the workload's layout). Each is made to iterate in the order of the buffer it
    writes (``transform_block_layout``: a packed weight is then written contiguously, instead
    of scattered bytes that LLVM may even turn into per-lane extracts), its loops are split
    where its indices divide by constants (`_split_by_divisors`), and its outer loops run in
    parallel. A copy computed inside ``block``'s loops (a scratchpad tile) is left alone. Returns how many
    copies it scheduled."""

    main_loops = [sch.get(l) for l in sch.get_loops(block)]
    done = 0
    for copy in [*sch.get_producers(block), *sch.get_consumers(block)]:
        if _whole_buffer_copy(sch, copy, main_loops):
            done += _in_write_order_and_parallel(sch, copy)
    return done


def _writeback(sch, block, parallel, lanes: int) -> None:
    """The register block's write-back (`WRITEBACK_ATTR`), inside ``parallel``: its last loop
    in vectors of at most ``lanes`` (one register of 32-bit values: LLVM turned BERT's
    48-lane epilogue, 3 registers wide, into element inserts and ran it 5x slower) and its
    rows and vectors unrolled, so that LLVM interleaves their epilogues once `cpu_epilogue`
    fuses them (10% on ResNet-50's 1x1 expansions, whose requantize, add and requantize
    cost as much as their K = 64 core)."""
    acc = sch.cache_write(block, 0, "global")  # the block's one output
    sch.annotate(acc, WRITEBACK_ATTR, 1)
    if parallel is not None:
        # unit loops kept: a trace replayed with other sampled factors sees the same loops
        sch.reverse_compute_at(acc, parallel, preserve_unit_loops=True)
    acc_loops = sch.get_loops(acc)
    extent = loop_extent(sch, acc_loops[-1]) or 0
    if extent > lanes and extent % lanes == 0:  # any width: 6 tiles of 16 lanes left scalar ran 10x slower
        acc_loops = [*acc_loops[:-1], *sch.split(acc_loops[-1], [None, lanes])]
    elif extent * 4 > 256:
        return
    sch.vectorize(acc_loops[-1])
    rows = [l for l in acc_loops[:-1] if sch.get(l).kind == tirx.ForKind.SERIAL and (loop_extent(sch, l) or 0) > 1]
    if prod(loop_extent(sch, l) for l in rows) <= MAX_ACCUMULATORS:
        for loop in rows:
            sch.unroll(loop)


def _block_for(sch, loops, match, target, choose, input_bytes: int | None,
               rows: int | None) -> tuple[int, int]:
    """(mr, nr) for the rows loop, the channel-tiles loop and the reduction loops ``loops``:
    ``choose``'s, or `register_block`'s for the target's registers, the weight panel and the
    input (``input_bytes``, None where unknown); ``rows``: what a row count known only at run
    time is a multiple of (`rows_multiple`), standing in for it."""
    mloop, nloop, reductions = loops
    tile_bytes = _output_tile_bytes(match)
    if choose is not None:
        return choose(sch, mloop, nloop, tile_bytes)
    steps, weight = prod(loop_extent(sch, l) or 1 for l in reductions), _weight_tile_bytes(match)
    m_extent = loop_extent(sch, mloop) if mloop is not None else None
    return register_block(rows if m_extent is None else m_extent,
                          loop_extent(sch, nloop) if nloop is not None else None, tile_bytes,
                          vector_registers(target), steps * weight, weight, input_bytes,
                          _output_spec(match).dtype.startswith("float"))


def default_schedule(sch, block, loops, match, target, choose=None) -> str | None:
    """Arrange the loops around the intrinsic for ``target`` (CPU targets only; others are
    left as tiled). ``choose(sch, mloop, nloop, tile_bytes) -> (mr, nr)`` picks the
    register block: `register_block`'s heuristic by default, `sampled_block` when tuning.
    Returns a one-line note of what it did."""
    if target is None or str(target.kind.name) != "llvm":
        return None
    tile_bytes, padded = _output_tile_bytes(match), padded_rows(sch, block)  # rows padded at compile time
    mloop, nloop = (l[-1] if l else None for l in (loops.outer_spatial, loops.axis_spatial))
    reductions = loops.outer_reduce + loops.axis_reduce
    # A block that accumulates into values a separate init block wrote has no T.init: its
    # accumulator cannot start from zero in registers, and TVM will not parallelise it.
    has_init = sch.get(block).init is not None
    blocked = reductions and _call_is_a_block(match, tile_bytes) and has_init
    run_time_rows = rows_multiple(sch, mloop, padded) if blocked and mloop is not None else None
    operands = operand_bytes(sch, block, mloop) if blocked and mloop is not None else None
    mr, nr = (_block_for(sch, (mloop, nloop, reductions), match, target, choose, operands and operands[0],
                         run_time_rows) if blocked else (1, 1))
    head = list(loops.outer_spatial[:-1] if mloop is not None else loops.outer_spatial)
    others = [l for l in loops.axis_spatial if l is not nloop]
    first = weights_first(*operands) if operands and (others or nloop is not None) else None
    relaid = tiles_outermost(sch, block, first, match, _weight_panel(match, nr)) if first else None
    first = relaid or first
    copies = schedule_copies(sch, block)  # after the relayout: it may add a copy
    inner_block = []
    if blocked:
        if mloop is not None:
            mo, mi = sch.split(mloop, [None, mr])
        if nloop is not None:
            no, ni = sch.split(nloop, [None, nr])
        tiles = others + ([no] if nloop is not None else [])
        outer, serial = _parallel_and_serial(head, tiles, mo if mloop is not None else None, first, padded)
        inner_block = ([mi] if mloop is not None else []) + ([ni] if nloop is not None else [])
        if len(inner_block) == 2 and isinstance(mr, int) and isinstance(nr, int) and mr < nr:
            inner_block.reverse()  # rows innermost: their operands held, each weight tile loaded once
        sch.reorder(*outer, *serial, *reductions, *inner_block, *loops.inner)
        rows = rows_operands(sch, block, outer, no if nloop is not None else None)
    else:
        rows = set()
        outer = head + ([mloop] if mloop is not None else []) + others + ([nloop] if nloop is not None else [])
    parallel, prefetched, skipped = None, False, False
    if outer and has_init:
        parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(parallel)
        skipped = bool(blocked) and mloop is not None and mark_padded_row_blocks(sch, parallel, mi, run_time_rows, mr)
        prefetched = first and nloop is not None and prefetches(_weight_tile_bytes(match))
        if prefetched:
            mark_weight_prefetch(sch, parallel, first, nr, mr)
    staged = _copies_note(copies) + padded_rows_note(run_time_rows, skipped, padded is not None)
    if rows and parallel is not None:
        staged += stage_rows_per_block(sch, block, parallel, rows)
    if not blocked:
        return ("parallel outer tiles" + staged) if parallel is not None else (staged[2:] or None)
    for loop in inner_block:
        sch.unroll(loop)
    _writeback(sch, block, parallel, max(4, vector_bytes(target) // 4))
    if choose is not None and choose is not _heuristic_block:
        return "register-blocked accumulator tiles (sampled), parallel outer loops" + staged
    return (f"register-blocked {mr}x{nr} accumulator tiles ({mr * nr * tile_bytes} B), "
            f"parallel outer loops{_order_note(first, relaid, prefetched)}" + staged)


def _parallel_and_serial(head: list, tiles: list, mo, first, padded) -> tuple[list, list]:
    """(the loops fused into the parallel loop, the loops left serial inside it), outermost
    first: the output-channel tiles and the head before the row blocks ``mo``, the tiles first
    where the weight is larger than the input (``first``, `weights_first`). Where the rows were
    padded at compile time (``padded``, `tirbyoc.rewrite.cpu.static_rows`) and the input comes
    first, the row blocks alone run in parallel and the tiles inside each: a block copies its
    rows once (`stage_rows_per_block`) for every column block after it."""
    rows = [mo] if mo is not None else []
    if padded and not first and mo is not None:
        return head + rows, tiles
    return (tiles + head if first else head + tiles) + rows, []


def _weight_panel(match, nr: int) -> int:
    """The tiles `tiles_outermost` lays side by side: the register block's ``nr``, or 1 for a
    core that prefetches its next tiles (a whole cache line a step, AVX-512's fp32 core):
    `insert_weight_prefetches` reads the weight tile by tile."""
    return 1 if prefetches(_weight_tile_bytes(match)) else nr


def _copies_note(copies: int) -> str:
    return f", {copies} staging cop{'y' if copies == 1 else 'ies'} in parallel" if copies else ""


def _order_note(first, relaid, prefetched) -> str:
    """The schedule note's words for the weights' loop order, layout and prefetches."""
    order = ", output-channel tiles outermost (weights larger than the input)" if first else ""
    order += ", the weight laid out panel by panel" if first and relaid else ""
    return order + (", the next tiles' weights prefetched" if prefetched else "")


__all__ = ["WRITEBACK_ATTR", "default_schedule", "lanes_dividing", "register_block", "sampled_block", "schedule_copies"]
