"""Rows no good register block divides - a 7 x 7 or 14 x 14 output - padded at compile time the
way rows known only at run time are (`tirbyoc.rewrite.cpu.run_time_rows`).

A register block's ``mr`` rows must divide the rows loop, and a convolution's rows loop is its
output width: 7 or 14 divide by 7 or 2 only. On AVX2's 16 registers that leaves ResNet's
7 x 7 layers a 7 x 1 block (seven accumulators, fewer than the eight fused multiply-adds in
flight that hide the latency) and its 14 x 14 ones a 2 x 4 block (eight). Folding the output's
height and width into one row count (49, 196), padding it to a multiple of `RUN_TIME_ROWS` (60,
204) and running each block on its real rows only (`skip_padded_row_blocks`) gives them 6 x 2
and 3 x 4 blocks of twelve. The price is the rows' staging copy (an im2col for a window: one
element copied per row and reduction step), paid once for every output column: worth it from
`MIN_COLUMNS` columns. Measured on ResNet's layers, each built both ways and timed in turns
(AMD EPYC Zen 4, AVX2, x86_fp32_avx2, one thread): the 7 x 7 3x3 512 -> 512 convolution 4.01
-> 3.16 ms (7 x 1 -> 6 x 2), its stride-2 twin 2.24 -> 1.56, the 7 x 7 1x1 512 -> 2048 2.24 ->
1.49, 2048 -> 512 1.77 -> 1.26, the 14 x 14 3x3 256 -> 256 2.98 -> 2.75 (2 x 4 -> 3 x 4), the
14 x 14 1x1 256 -> 1024 1.42 -> 1.27; the same padding of the 56 x 56 64 -> 64 layers (64
columns) lost 4-10% and of the 7 x 7-kernel stem 2.5x.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import tirx
from tirbyoc.rewrite.cpu.run_time_rows import RUN_TIME_ROWS

MIN_COLUMNS = 256  # output columns over which the rows' staging copy is paid
# with 32 vector registers (AVX-512) a 7-row block holds 7 x 3 accumulators already
MOST_REGISTERS = 16
# a row count divisible by one of these already has a block of twelve (4 x 3, 3 x 4, 6 x 2)
GOOD_ROW_DIVISORS = (3, 4)
PADDED_ROWS_KEY = "tirbyoc.rows_padded"  # block annotation: its rows padded at compile time


def _static_run(ivs, outer_spatial: list[bool]) -> list[int]:
    """Positions of the trailing outer spatial iterators of known extent above one (a
    convolution's output height and width), outermost first."""
    if True not in outer_spatial:
        return []
    run = []
    for i in range(len(outer_spatial) - 1 - outer_spatial[::-1].index(True), -1, -1):
        extent = ivs[i].dom.extent if i < len(ivs) else None
        if not outer_spatial[i] or not isinstance(extent, tirx.IntImm) or int(extent) == 1:
            break
        run.insert(0, i)
    return run


def static_row_factors(sch, block, outer_spatial: list[bool], columns: int | None,
                       float_core: bool, registers: int) -> tuple[list[int], list[int]] | None:
    """(``pad_einsum``'s factors, the row iterators to fold into one) where ``block``'s rows -
    its trailing outer spatial iterators of known extent - are worth padding: a target of
    `MOST_REGISTERS` vector ``registers``, a float core (the int8 cores' requantizing
    write-back keeps them to fewer accumulators anyway), at least
    `MIN_COLUMNS` output ``columns``, a last row extent that `GOOD_ROW_DIVISORS` do not divide,
    and a folded count that is not already a multiple of `RUN_TIME_ROWS`. None otherwise."""
    if registers > MOST_REGISTERS or not float_core or columns is None or columns < MIN_COLUMNS:
        return None
    ivs = sch.get(block).iter_vars
    run = _static_run(ivs, outer_spatial)
    if not run:
        return None
    extents = [int(ivs[i].dom.extent) for i in run]
    if any(extents[-1] % d == 0 for d in GOOD_ROW_DIVISORS) or prod(extents) % RUN_TIME_ROWS == 0:
        return None
    return [RUN_TIME_ROWS if i == run[-1] else 1 for i in range(len(ivs))], run


def mark_static_rows(sch, block) -> None:
    """Tell the schedule (`padded_rows`) that ``block``'s rows were padded here."""
    sch.annotate(block, PADDED_ROWS_KEY, RUN_TIME_ROWS)


def padded_rows(sch, block) -> int | None:
    """What `static_row_factors` padded ``block``'s rows to a multiple of (None: not padded);
    the mark is taken off."""
    value = sch.get(block).annotations.get(PADDED_ROWS_KEY)
    if value is None:
        return None
    sch.unannotate(block, PADDED_ROWS_KEY)
    return int(value)


__all__ = ["MIN_COLUMNS", "PADDED_ROWS_KEY", "mark_static_rows", "padded_rows", "static_row_factors"]
