"""Rows no good register block divides - a 7 x 7 or 14 x 14 output - padded at compile time the
way rows known only at run time are (`tirbyoc.rewrite.cpu.run_time_rows`); and a 1x1
convolution's plain rows, copied block by block (`_plain_rows_worth_padding`).

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

from tirbyoc._tvm import REDUCE, tirx
from tirbyoc.rewrite.cpu.run_time_rows import RUN_TIME_ROWS, trailing_rows

MIN_COLUMNS = 256  # output columns over which the rows' staging copy is paid
MIN_PLAIN = 128  # reduction steps and columns from which plain rows are worth padding
# with 32 vector registers (AVX-512) a 7-row block holds 7 x 3 accumulators already
MOST_REGISTERS = 16
# a row count divisible by one of these already has a block of twelve (4 x 3, 3 x 4, 6 x 2)
GOOD_ROW_DIVISORS = (3, 4)
PADDED_ROWS_KEY = "tirbyoc.rows_padded"  # block annotation: its rows padded at compile time


def _static_run(ivs, outer_spatial: list[bool]) -> list[int]:
    """`trailing_rows` of known extent above one (a convolution's output height and width)."""
    return trailing_rows(ivs, outer_spatial, lambda extent: isinstance(extent, tirx.IntImm) and int(extent) > 1)


def static_row_factors(sch, block, outer_spatial: list[bool], columns: int | None,
                       float_core: bool, registers: int) -> tuple[list[int], list[int]] | None:
    """(``pad_einsum``'s factors, the row iterators to fold into one) where ``block``'s rows -
    its trailing outer spatial iterators of known extent - are worth padding: a target of
    `MOST_REGISTERS` vector ``registers`` and a float core (the int8 cores' requantizing
    write-back keeps them to fewer accumulators anyway), rows folded from two or more
    iterators into a count not already a multiple of `RUN_TIME_ROWS`, and either a last row
    extent that `GOOD_ROW_DIVISORS` do not divide with at least `MIN_COLUMNS` output
    ``columns``, or plain rows (`_plain_rows_worth_padding`). None otherwise."""
    if registers > MOST_REGISTERS or not float_core or columns is None:
        return None
    ivs = sch.get(block).iter_vars
    run = _static_run(ivs, outer_spatial)
    if len(run) < 2:
        return None
    extents = [int(ivs[i].dom.extent) for i in run]
    if prod(extents) % RUN_TIME_ROWS == 0:
        return None
    awkward = columns >= MIN_COLUMNS and not any(extents[-1] % d == 0 for d in GOOD_ROW_DIVISORS)
    if not awkward and not _plain_rows_worth_padding(ivs, columns):
        return None
    return [RUN_TIME_ROWS if i == run[-1] else 1 for i in range(len(ivs))], run


def _plain_rows_worth_padding(ivs, columns: int) -> bool:
    """Whether a block of even widths gains from padding too: its rows' staging is a plain
    copy of them (one reduction iterator: a 1x1 convolution, no window to unfold) of at least
    `MIN_PLAIN` steps, over at least `MIN_PLAIN` columns, so that, copied row block by row
    block into L1 (`tirbyoc.rewrite.cpu.row_staging`), they feed 3 x 4 blocks where 4 x 2 were.
    ResNet-50's 28 x 28 1x1 512 -> 128 1.60 -> 1.43 ms, 128 -> 512 1.44 -> 1.29; its 56 x 56
    64 -> 256 (64 steps) and 256 -> 64 (64 columns) gained nothing."""
    reductions = [iv for iv in ivs if int(iv.iter_type) == REDUCE and not (
        isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == 1)]
    return (columns >= MIN_PLAIN and len(reductions) == 1 and isinstance(reductions[0].dom.extent, tirx.IntImm)
            and int(reductions[0].dom.extent) >= MIN_PLAIN)


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
