"""What a rewrite did, as records: each `Step` has a kind, the operand it concerns (if any)
and a sentence.

Reports decide what to show by `StepKind` (a padding, a packing, a tiling plan are decisions a
user reads; a `transform_block_layout` is plumbing), never by parsing the sentence. A `Step`
is also its sentence (a ``str``), so printing steps, joining them or searching them for words
works as it did when steps were plain text.
"""

from __future__ import annotations

import enum


class StepKind(enum.Enum):
    COMMUTE = "commute"  # operands put in the intrinsic's order
    CANONICALIZE = "canonicalize"  # transform_block_layout to (outer loops, intrinsic axes)
    STAGE = "stage"  # a staging copy (cache_read / cache_write / reindex)
    CAST = "cast"  # a staging copy in the dtype the intrinsic reads (the block cast the operand)
    TRANSPOSE = "transpose"  # a staged copy re-laid-out
    PACK = "pack"  # a staged copy packed into intrinsic tiles
    PAD = "pad"  # pad_einsum
    TILE = "tile"  # split by the intrinsic's extents
    SCRATCHPAD_PLAN = "scratchpad plan"  # the chosen scratchpad tiling and its usage
    SPLIT = "split"  # loops cut into scratchpad or warp tiles
    DMA = "dma"  # a tile copy staged into / out of a scratchpad, or tensorized
    COPY_LOOP = "copy loop"  # a tile copy no DMA intrinsic fits: left as a loop
    LOOPS = "loops"  # the outer loops arranged, nothing to report
    SCHEDULE = "schedule"  # the target's schedule of the outer loops, as it describes itself
    DECOMPOSE = "decompose"  # decompose_reduction
    TENSORIZE = "tensorize"  # compute, init or copy replaced by an intrinsic
    INIT_LEFT = "init left"  # the init stayed TVM's loop
    LINK = "link"  # extern libraries the result calls
    TUNED = "tuned"  # a schedule taken from a MetaSchedule database
    CALL = "call"  # a whole function replaced by a library call
    DOUBLE_BUFFER = "double buffer"  # scratchpad tiles marked for two versions (or why not)
    EPILOGUE = "epilogue"  # elementwise blocks fused onto the accumulator tile
    EPILOGUE_LEFT = "epilogue left"  # elementwise blocks after the core left to the host, and why
    IN_PLACE = "in place"  # a staging copy that moved nothing removed: the parameter is read as it is
    VECTOR_MATH = "vector math"  # a libm call (erf) as arithmetic LLVM vectorizes
    WINOGRAD = "winograd"  # a 3x3 convolution computed in Winograd's form


# The kinds a report shows as "how" an offload was done.
DECISIONS = frozenset({StepKind.TUNED, StepKind.CAST, StepKind.PAD, StepKind.PACK, StepKind.TRANSPOSE,
                       StepKind.SCRATCHPAD_PLAN, StepKind.SCHEDULE, StepKind.CALL,
                       StepKind.COPY_LOOP, StepKind.INIT_LEFT, StepKind.LINK, StepKind.DOUBLE_BUFFER,
                       StepKind.EPILOGUE, StepKind.EPILOGUE_LEFT, StepKind.IN_PLACE,
                       StepKind.VECTOR_MATH, StepKind.WINOGRAD})


class Step(str):
    """One rewrite step: ``kind``, ``operand`` (an intrinsic operand's name, or None) and the
    sentence that describes it (the string itself)."""

    kind: StepKind
    operand: str | None

    def __new__(cls, kind: StepKind, detail: str, operand: str | None = None) -> "Step":
        step = super().__new__(cls, detail)
        step.kind = kind
        step.operand = operand
        return step

    @property
    def detail(self) -> str:
        return str.__str__(self)

    def __getnewargs__(self):  # pickles (MetaSchedule ships results to workers)
        return (self.kind, self.detail, self.operand)

    def __repr__(self) -> str:
        return f"Step({self.kind.value}, {self.detail!r}" + (f", {self.operand})" if self.operand else ")")

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "operand": self.operand, "detail": self.detail}


def decisions(steps) -> list[str]:
    """The sentences of the steps a report shows (see `DECISIONS`); plain strings from older
    records count when nothing says otherwise."""
    return [str(s) for s in steps if getattr(s, "kind", None) in DECISIONS]


__all__ = ["DECISIONS", "Step", "StepKind", "decisions"]
