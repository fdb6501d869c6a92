"""Rows known only at run time (a served model's tokens), made a register block can count on.

`tirbyoc.rewrite.cpu.register_blocks` keeps an ``mr x nr`` block of accumulators over rows
whose count divides by ``mr``; a row count known only when the function runs divides by
nothing, so the pad stage pads it to a multiple of `RUN_TIME_ROWS` (`run_time_row_factors`),
after folding the run-time dimensions in front of it into one row count
(`fuse_run_time_rows`), and the schedule proves the padded count divisible (`rows_multiple`).
Each row block runs on its real rows only (`mark_padded_row_blocks`, `skip_padded_row_blocks`:
a version of the core per count of real rows, chosen when the function runs): a decoding token
computes one row, not a block's worth.
"""

from __future__ import annotations

from tirbyoc._tvm import expr_dtype, s_tir, sym, tirx, tvm_ffi
from tirbyoc.rewrite.cpu.stack import WRITEBACK_ATTR
from tirbyoc.ir.tir_walk import always_true, uses_var


# A row count known only at run time is padded to a multiple of this: 12 leaves the heuristic
# its best blocks (4 x 3 and 3 x 4 ymm, 4 x 6 zmm), and each block runs on its real rows only
# (`skip_padded_row_blocks`), so the padding costs a decoding token nothing. With 4 a 1B-class
# decoder layer's projections (N a power of two) took 4 x 2 blocks: a batch of 8 tokens 32.2 ms
# (AVX2, one thread) against 24.0 with 3 x 4, its prefill's matmuls 66 GFLOP/s against 69.
RUN_TIME_ROWS = 12


def run_time_row_factors(sch, block, outer_spatial: list[bool], target) -> list[int] | None:
    """``pad_einsum``'s factors (one per iterator of ``block``, in canonical order: its outer
    iterators - ``outer_spatial`` says which are spatial - then the intrinsic's axes) that pad
    the rows - the last outer spatial iterator - to a multiple of `RUN_TIME_ROWS`, where their
    count is known only at run time (a served transformer's tokens) and the target is a CPU;
    None where there is nothing to pad. A register block needs rows it can count on: without
    them it is one row, a matrix-vector product that reads the whole weight panel for every
    token (BERT-base's layer at batch 2 x seq 128: 178 ms against the static build's 50).
    The padding is a copy of the input with zero rows added and the output's write-back
    predicated on the real rows (TVM folds that copy into it): a pass over the input beside a
    reduction hundreds of steps long; no padded row's sums are stored."""
    if target is None or str(target.kind.name) != "llvm":
        return None
    ivs = sch.get(block).iter_vars
    run = _run_time_run(ivs, outer_spatial)
    return [RUN_TIME_ROWS if i == run[-1] else 1 for i in range(len(ivs))] if run else None


def trailing_rows(ivs, outer_spatial: list[bool], wanted) -> list[int]:
    """Positions of the last outer spatial iterators (the rows and those just before them),
    outermost first, as far back as ``wanted(extent)`` holds for each."""
    if True not in outer_spatial:
        return []
    run = []
    for i in range(len(outer_spatial) - 1 - outer_spatial[::-1].index(True), -1, -1):
        if not outer_spatial[i] or i >= len(ivs) or not wanted(ivs[i].dom.extent):
            break
        run.insert(0, i)
    return run


def _run_time_run(ivs, outer_spatial: list[bool]) -> list[int]:
    """`trailing_rows` whose extents are known only at run time (a served transformer's batch
    and seq)."""
    return trailing_rows(ivs, outer_spatial, lambda extent: not isinstance(extent, tirx.IntImm))


def fuse_run_time_rows(sch, block, outer_spatial: list[bool], rows_buffers: set[str],
                       run: list[int] | None = None) -> list[int]:
    """Fold the trailing outer spatial iterators of run-time extent (`_run_time_run`) into
    the last one (``batch x seq`` rows), the others left of extent 1, where only the buffers
    ``rows_buffers`` (the output and the rows' input, not the weight) are indexed by them:
    padded as one row count, a batch of 8 decoding tokens is 8 rows, not 8 x 4 (its rows
    would be padded sequence by sequence). Returns the fused iterators' positions ([] if
    none were: fewer than two, or a weight indexed by them). ``run``: the iterators to fold in
    place of those (`tirbyoc.rewrite.cpu.static_rows`' rows of known extent)."""
    stmt = sch.get(block)
    ivs = stmt.iter_vars
    run = _run_time_run(ivs, outer_spatial) if run is None else run
    if len(run) < 2:
        return []
    fused = {ivs[i].var for i in run}
    used = {str(r.source.name) for r in [*stmt.reads, *stmt.writes]
            if any(uses_var(rng.min, v) for rng in r.region for v in fused)}
    if not used <= rows_buffers:
        return []
    extents = [ivs[i].dom.extent for i in run]

    def remap(*vs):
        row = vs[run[0]]
        for i, extent in zip(run[1:], extents[1:]):
            row = row * extent + vs[i]
        return [tirx.const(0, expr_dtype(vs[i])) if i in run[:-1] else (row if i == run[-1] else v)
                for i, v in enumerate(vs)]

    sch.transform_block_layout(block, tirx.IndexMap.from_func(remap, ndim=len(ivs),
                                                             index_dtype=expr_dtype(ivs[run[-1]].var)))
    return run


SKIP_ROWS_KEY = "tirbyoc.skip_padded_rows"  # loop annotation: the register block's rows
ROWS_LOOP_KEY = "tirbyoc.block_rows"  # loop annotation: the register block's rows loop in the core


def mark_padded_row_blocks(sch, loop, rows_loop, padded_to: int | None, rows: int) -> bool:
    """Ask `skip_padded_row_blocks` to run each iteration of ``loop`` (the parallel loop over
    register blocks of ``rows`` rows; ``rows_loop``: the block's loop over them around the
    core) on its real rows only, where the rows were padded at run time to a multiple of
    ``padded_to`` (`rows_multiple`; None: not padded). Whether it asked."""
    if not padded_to:
        return False
    sch.annotate(loop, SKIP_ROWS_KEY, rows)
    sch.annotate(rows_loop, ROWS_LOOP_KEY, 1)
    return True


def _row_is_real(loop, rows: int):
    """``row -> `` the condition, on ``loop``'s variable and the function's sizes, that row
    ``row`` of an iteration's register block is a real row: the predicate of its write-back
    (which stores real rows only) at that row and the block's first column - its outermost
    loop of ``rows`` iterations (the rows) at ``row``, every other loop inside ``loop`` at its
    start. None where the loop holds no predicated write-back."""
    realizes, loops = [], []
    tvm_ffi.structural_walk(loop.body, (s_tir.SBlockRealize, realizes.append), order="pre")
    tvm_ffi.structural_walk(loop.body, (tirx.For, loops.append), order="pre")
    writeback = next((r for r in realizes if WRITEBACK_ATTR in r.block.annotations), None)
    if writeback is None or always_true(writeback.predicate):
        return None
    around = [l for l in loops if _encloses(l, writeback)]
    row_loop = next((l for l in around if isinstance(l.extent, tirx.IntImm) and int(l.extent) == rows), None)
    if row_loop is None:
        return None

    def at(row):
        def value(var):
            if var.same_as(row_loop.loop_var):
                return tirx.const(row, expr_dtype(var))
            return next((l.min for l in loops if l.loop_var.same_as(var)), var)
        return tvm_ffi.structural_map(writeback.predicate, [(tirx.Var, value)])

    return at


def _encloses(loop, realize) -> bool:
    found = []
    tvm_ffi.structural_walk(loop.body, (s_tir.SBlockRealize, lambda r: found.append(r.same_as(realize))),
                            order="pre")
    return any(found)


def _with_rows(body, count: int):
    """``body`` with the core's rows loop (`ROWS_LOOP_KEY`, unrolled) running its first
    ``count`` rows: the rest behind a condition the unrolling makes constant (a loop of a
    shorter extent would bound its variable differently in each version, which TVM's
    analyzer refuses)."""
    def cut(loop):
        if ROWS_LOOP_KEY not in loop.annotations:
            return loop
        var = loop.loop_var
        kept = tirx.IfThenElse(var < tirx.const(count, expr_dtype(var)), loop.body, None)
        return tirx.For(var, loop.min, loop.extent, loop.kind, kept, loop.thread_binding, loop.annotations)
    return tvm_ffi.structural_map(body, [(tirx.For, cut)])


def _skipping(loop):
    rows = loop.annotations.get(SKIP_ROWS_KEY)
    if rows is None:
        return loop
    rows = int(rows)
    real = _row_is_real(loop, rows)
    body = loop.body
    if real is not None:
        # the block's real rows r: the core runs r rows (if row r - 1 is real and row r is not)
        body, flags = None, []
        for count in range(1, rows + 1):  # innermost: one real row; outermost: all of them
            version = loop.body if count == rows else _with_rows(loop.body, count)
            # each condition as a flag: TVM's CompactBufferAllocation, which narrows buffers by
            # the conditions around their uses, overflows on these
            flags.append(tirx.Var(f"row_{count - 1}_is_real", "bool"))
            body = tirx.IfThenElse(flags[-1], version, body)
        body = tirx.SeqStmt([*(tirx.Bind(flag, real(count)) for count, flag in enumerate(flags)), body])
    annotations = {k: v for k, v in loop.annotations.items() if k != SKIP_ROWS_KEY}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations)


def skip_padded_row_blocks(func):
    """``func`` with each register block `mark_padded_row_blocks` marked run on its real rows
    only: a version of the core per count of real rows, the block's padding rows' sums never
    computed (they would never be stored: the write-back is predicated on the real rows) and
    a block of padding only skipped. A decoding token (one real row of 12) computes one row: a
    1B-class decoder layer's step 8.3 ms (AVX2, one thread), where computing the padded rows
    took 33.6."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.For, _skipping)])
    return func if body.same_as(func.body) else func.with_body(body)


def rows_multiple(sch, mloop, padded: int | None = None) -> int | None:
    """`RUN_TIME_ROWS` where ``mloop``'s extent, known only at run time, is a multiple of it
    (`run_time_row_factors` padded it), else None; ``padded``: what a known extent was padded
    to a multiple of at compile time (`tirbyoc.rewrite.cpu.static_rows`), if it was."""
    extent = sch.get(mloop).extent
    if isinstance(extent, tirx.IntImm):
        return padded if padded and int(extent) % padded == 0 else None
    return RUN_TIME_ROWS if sym.Analyzer().can_prove(
        tirx.FloorMod(extent, tirx.const(RUN_TIME_ROWS, expr_dtype(extent))) == 0) else None


def padded_rows_note(rows: int | None, skipped: bool = False, static: bool = False) -> str:
    """The schedule note's words for rows padded at run time (``static``: at compile time) to a
    multiple of ``rows`` ("" for None), and for the row blocks of padding only skipped
    (``skipped``)."""
    if not rows:
        return ""
    when = "(no block of twelve divided them)" if static else "at run time"
    return f", rows padded to a multiple of {rows} {when}" + (
        ", each row block run on its real rows only" if skipped else "")


__all__ = ["RUN_TIME_ROWS", "SKIP_ROWS_KEY", "fuse_run_time_rows", "mark_padded_row_blocks", "padded_rows_note", "rows_multiple", "run_time_row_factors", "skip_padded_row_blocks", "trailing_rows"]
