"""What matching gives: `Match` (with its `AxisMap`s and `OperandMap`s), `Mismatch` (why
not, as fields a report, the fuzzer's grouping and ``tirbyoc match --json`` read), and
`BlockResult` (one block's matches or mismatches). Plain data; nothing here reads IR.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from math import prod

from tirbyoc._tvm import tirx
from tirbyoc.decl.intrinsic import Intrinsic, IntrinsicGroup


class MatchStage(enum.IntEnum):
    """How far a comparison got before failing; a report shows the mismatch that got furthest
    (an operation that differs is less specific than a dtype that differs)."""

    NONE = 0
    STRUCTURE = 1
    OPERATION = 2
    DTYPE = 3
    ITERATORS = 4
    EXTENT = 5
    LAYOUT = 6


@dataclass(frozen=True)
class Mismatch:
    """Why an intrinsic does not match a block: the stage it failed at, what it concerns
    (the intrinsic operand, the workload iterator, what was expected and found, where known)
    and the sentence a person reads."""

    stage: MatchStage
    message: str
    operand: str | None = None  # the intrinsic operand concerned
    iterator: str | None = None  # the workload iterator or intrinsic axis concerned
    expected: str | None = None
    found: str | None = None
    intrinsic: str | None = None  # set by `explain`
    compute: bool = False  # whether the intrinsic is a compute one (its reasons rank first)

    def __str__(self) -> str:
        return self.message

    @property
    def kind(self) -> str:
        """A short, stable name of the reason (the stage, refined by what was compared):
        what groups mismatches in a summary."""
        what = "dtype" if self.stage is MatchStage.DTYPE else (
            "operand" if self.operand else "iterator" if self.iterator else "")
        return self.stage.name.lower() + (f":{what}" if what and what != "dtype" else "")

    def to_json(self) -> dict:
        return {"stage": self.stage.name.lower(), "kind": self.kind, "message": self.message,
                "intrinsic": self.intrinsic, "operand": self.operand, "iterator": self.iterator,
                "expected": self.expected, "found": self.found}


class Refused(Exception):
    """The matcher's one failure protocol: a check that fails raises `Refused` with its reason
    (a `Mismatch`) where it fails; the loop over alternatives (operand orders, sub-bindings,
    bindings) records it in `Refusals` and tries the next; `match_block` answers with the best
    match or the most specific reason recorded."""

    def __init__(self, mismatch: Mismatch):
        super().__init__(mismatch.message)
        self.mismatch = mismatch


def refuse(stage: MatchStage, message: str, **fields) -> Refused:
    """The exception a failed check raises (``raise refuse(stage, message, ...)``)."""
    return Refused(Mismatch(stage, message, **fields))


class Refusals:
    """The reasons the alternatives tried so far failed."""

    def __init__(self):
        self.reasons: list[Mismatch] = []

    def record(self, err: Refused) -> None:
        self.reasons.append(err.mismatch)

    def most_specific(self, default: Mismatch) -> Mismatch:
        """The reason from the latest stage (a dtype that differs says more than an
        operation), the first of equals; ``default`` when nothing was recorded."""
        return max(self.reasons, key=lambda f: f.stage) if self.reasons else default


class Staging(str, enum.Enum):
    """What the rewrite must do to an operand before the intrinsic can read it (besides a
    copy into the intrinsic's scope, recorded as ``copy to SCOPE``)."""

    PAD = "pad"
    REINDEX = "reindex"
    TRANSPOSE = "transpose"
    PACK = "pack"
    CAST = "cast"  # a copy in the dtype the intrinsic reads (`tirbyoc.matching.casts`)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AxisMap:
    """One intrinsic axis and the workload iterators that play its role."""

    axis: str
    kind: str  # "S" or "R"
    size: int  # the intrinsic's extent
    iters: tuple[str, ...]  # workload iterators fused into it, outer to inner; () if absent
    extent: int | None  # their combined extent (1 when absent; None: known only at run time)
    kernel_sized: bool = False  # a run-time extent the kernel takes whole (an any-size library
    #                             kernel); any other run-time extent is padded at run time

    @property
    def padded(self) -> int | None:
        return None if self.extent is None else -(-self.extent // self.size) * self.size

    @property
    def padding(self) -> int:
        """Elements of padding, for a static extent (0 for a run-time one: see `pads`)."""
        return 0 if self.extent is None else self.padded - self.extent

    @property
    def pads(self) -> bool:
        """Whether the rewrite pads this axis to a multiple of ``size``: a static extent that
        is not one, or a run-time extent (rounded up when the function runs) that no kernel
        takes whole."""
        return self.padding > 0 or (self.extent is None and not self.kernel_sized and self.size > 1)

    @property
    def pad_text(self) -> str:
        """The padding in words: ``j 20->32``, or ``j n->a multiple of 16 at run time``."""
        if self.extent is None:
            return f"{self.axis} {'*'.join(self.iters)}->a multiple of {self.size} at run time"
        return f"{self.axis} {self.extent}->{self.padded}"

    @property
    def fused(self) -> bool:
        return len(self.iters) > 1

    def describe(self) -> str:
        src = "*".join(self.iters) if self.iters else "(none)"
        if self.extent is None:
            return f"{self.axis}={src}" + (" (size at run time)" if self.kernel_sized else
                                           f" (size at run time, padded to a multiple of {self.size})")
        pad = f" pad {self.extent}->{self.padded}" if self.padding else ""
        return f"{self.axis}={src}{pad}"


@dataclass(frozen=True)
class OperandMap:
    """How one intrinsic operand is fed from the workload.

    ``direct``: the implementation can address the workload's window in place (shape,
    order, strides and alignment all fit its declared layout). Otherwise ``staging`` lists
    what the rewrite must do first, ``reason`` says why, and ``pack`` tells whether the
    operand must be packed into intrinsic-sized tiles (`layout_map` gives the IndexMap).
    """

    operand: str
    buffer: str
    access: str
    is_output: bool
    view_axes: tuple[str, ...]  # the intrinsic axes of this operand, in its dimension order
    view_extents: tuple[int | None, ...]  # their padded extents (None: known at run time)
    tile: tuple[int, ...]  # the intrinsic's extents for those axes
    direct: bool
    staging: tuple[str, ...] = ()
    reason: str | None = None
    pack: bool = False
    scope: str = "global"  # the intrinsic's scope for it
    workload_scope: str = "global"
    keeps_order: bool = True  # its axes index the workload's dimensions outermost first
    pack_tile: tuple[int, ...] | None = None  # the tiles its layout declares (`Layout.packed`)

    @property
    def packing_tile(self) -> tuple[int, ...]:
        """The tiles a packed copy is laid out in: the layout's own (AMX's weights: 16 x 4
        within a 32 x k window) or, by default, the intrinsic's extents."""
        return self.pack_tile or self.tile

    def layout_map(self):
        """IndexMap from the operand's view (its axes in intrinsic order, padded extents) to
        the layout the implementation reads: identity, or tile-packed
        ``(x, y) -> (x // tx, y // ty, x % tx, y % ty)`` (VNNI's [N/16, K/4, 16, 4])."""

        tiles = self.packing_tile

        def fn(*xs):
            if not self.pack:
                return list(xs)
            return [x // t for x, t in zip(xs, tiles)] + [x % t for x, t in zip(xs, tiles)]

        return tirx.IndexMap.from_func(fn, ndim=len(tiles), index_dtype="int32")

    def describe(self) -> str:
        how = "in place" if self.direct else "+".join(self.staging)
        return f"{self.operand}<-{self.access} ({how})"


@dataclass(frozen=True)
class Match:
    """A block that an intrinsic (or a group led by it) can compute: plain data."""

    function: str
    block: str
    intrinsic: Intrinsic
    group: IntrinsicGroup | None
    template: str | None
    iters: tuple[str, ...]  # the block's iterators, in order
    iter_extents: tuple[int | None, ...]
    axes: tuple[AxisMap, ...]
    outer: tuple[str, ...]  # workload iterators left as loops around the intrinsic
    operands: tuple[OperandMap, ...]
    macs: int | None  # multiply-accumulates (compute) or elements (others) the block performs
    init: str | None = None  # "in-block", the name of a separate init block, or None
    chain: tuple[str, ...] = ()  # for a multi-block match: the blocks after this one

    @property
    def padding(self) -> dict[str, tuple]:
        """axis -> (extent, padded extent); a run-time extent's: (its iterator, "a multiple
        of SIZE")."""
        return {a.axis: ((a.extent, a.padded) if a.extent is not None else
                         ("*".join(a.iters), f"a multiple of {a.size}")) for a in self.axes if a.pads}

    @property
    def direct(self) -> bool:
        return all(o.direct for o in self.operands)

    @property
    def runtime_axes(self) -> tuple[str, ...]:
        """The intrinsic axes whose size is known only at run time (an any-size library
        kernel's, which takes it from its arguments)."""
        return tuple(a.axis for a in self.axes if a.kernel_sized)

    @property
    def symbolic_axes(self) -> tuple[str, ...]:
        """The intrinsic axes whose extent is known only at run time: taken whole by a kernel
        (`runtime_axes`) or padded to the intrinsic's width when the function runs."""
        return tuple(a.axis for a in self.axes if a.extent is None)

    @property
    def calls(self) -> int:
        """Intrinsic calls (an axis of run-time size counts once: a kernel takes it whole, a
        tile intrinsic's count is known only when the function runs)."""
        outer = prod(e for n, e in zip(self.iters, self.iter_extents) if n in self.outer and e)
        return outer * prod(a.padded // a.size for a in self.axes if a.extent is not None)

    @property
    def padded_macs(self) -> int:
        return self.calls * prod(a.size for a in self.axes)

    @property
    def mapping(self) -> dict[str, tuple[str, ...]]:
        return {a.axis: a.iters for a in self.axes}

    def operand(self, name: str) -> OperandMap:
        for o in self.operands:
            if o.operand == name:
                return o
        raise KeyError(name)

    def score(self) -> tuple:
        """Smaller is better: fewer operands to stage, fewer heavy staging steps (transpose,
        pack, reindex) than mere padding, less padding waste, fewer loops around the call.
        A group re-declared for any size (``resize``: a library call) needs no padding, so
        its padding costs nothing here, and the number of loops around the call comes first:
        one large GEMM (after an im2col copy) beats thousands of small calls - but an axis the
        workload lacks counts first, as the exact-size call would have a unit extent there."""
        resizable = self.group is not None and self.group.resize is not None
        waste = 1.0 if resizable or not self.macs else self.padded_macs / self.macs
        staged = sum(1 for o in self.operands
                     if not o.direct and not (resizable and set(o.staging) <= {Staging.PAD}))
        heavy = sum(1 for o in self.operands for s in o.staging if s in (Staging.TRANSPOSE, Staging.PACK, Staging.REINDEX))
        if resizable:  # a staging copy that transposes costs more than one along the rows
            absent = sum(1 for a in self.axes if not a.iters)
            reordered = sum(1 for o in self.operands if not o.direct and not o.keeps_order)
            return (absent + len(self.outer), staged, heavy, reordered, round(waste, 6))
        return (staged, heavy, round(waste, 6), len(self.outer))

    def block_index_map(self):
        """IndexMap from the block's iterators to ``(outer..., axis values...)``: the view
        in which the block is one loop nest of intrinsic calls (for
        ``Schedule.transform_block_layout``). Fused axes are row-major over their iterators."""

        extents = dict(zip(self.iters, self.iter_extents))

        def fn(*vs):
            env = dict(zip(self.iters, vs))
            out = [env[n] for n in self.outer]
            for a in self.axes:
                value = None  # row-major over the fused iterators (one of run-time extent is alone)
                for it in a.iters:
                    value = env[it] if value is None else value * extents[it] + env[it]
                out.append(tirx.const(0, "int32") if value is None else value)
            return out

        return tirx.IndexMap.from_func(fn, ndim=len(self.iters), index_dtype="int32")

    def describe(self) -> str:
        parts = [", ".join(a.describe() for a in self.axes)]
        if self.outer:
            parts.append("outer " + ",".join(self.outer))
        staged = [o.describe() for o in self.operands if not o.direct]
        if staged:
            parts.append("; ".join(staged))
        return " | ".join(parts)


@dataclass(frozen=True)
class BlockResult:
    """What the matcher found for one block: its matches (best first) or the reasons."""

    function: str
    block: str
    macs: int  # multiply-accumulates (`tirbyoc.ir.pattern.block_macs`; 0 for other blocks)
    matches: tuple[Match, ...]
    mismatches: tuple[Mismatch, ...]  # one per candidate that did not match

    @property
    def reasons(self) -> tuple[tuple[str, str, int, bool], ...]:
        """(intrinsic, reason, stage, is compute) per mismatch."""
        return tuple((m.intrinsic, m.message, int(m.stage), m.compute) for m in self.mismatches)

    @property
    def mismatch(self) -> Mismatch | None:
        """The most specific mismatch (None if a candidate matched)."""
        if self.matches or not self.mismatches:
            return None
        return max(self.mismatches, key=lambda m: (m.stage, m.compute))

    @property
    def best(self) -> Match | None:
        return self.matches[0] if self.matches else None

    @property
    def reason(self) -> str | None:
        """The most specific reason no candidate matched (None if one did)."""
        top = self.mismatch
        return None if top is None else f"{top.intrinsic}: {top.message}"


__all__ = ["AxisMap", "BlockResult", "Match", "MatchStage", "Mismatch", "OperandMap", "Refusals", "Refused",
           "Staging", "refuse"]
