"""`RewriteState`: what the stages of a rewrite read and hand on.

One state per rewrite of one block: the schedule being built, the `Match` it carries out, the
template and target, the loops once tiled, the copies waiting to be tensorized and the steps
done so far (`RewriteState`'s docstring says which stage writes each field and which read it).
Stages (`tirbyoc.rewrite.foundation.pipeline`) take it and return it; helpers here answer
the questions every stage asks of the block (which region holds a buffer, which buffer feeds
an operand now).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from tirbyoc.errors import RewriteError, last_line, schedule_error_line
from tirbyoc.ir.pattern import Access, BlockPattern, read_block
from tirbyoc.matching.results import Match, OperandMap
from tirbyoc.rewrite.foundation.steps import Step, StepKind


@dataclass
class Loops:
    """Loop handles of the canonical nest, for the target's default schedule."""

    outer_spatial: list  # loops around the intrinsic that are not reductions
    outer_reduce: list  # reduction iterators left outside the intrinsic (conv's kh, kw)
    axis_spatial: list  # tile loops of the intrinsic's spatial axes
    axis_reduce: list  # tile loops of the intrinsic's reduction axes
    inner: list  # the intrinsic's own loops (tensorized)
    outer_names: list = field(default_factory=list)  # workload iterator of each outer loop


@dataclass
class RewriteState:
    """One rewrite of one block, handed from stage to stage (`tirbyoc.rewrite.block.order.STAGES`).

    Set when the rewrite starts (`new_state`), read by every stage:
      ``sch`` the `s_tir.Schedule` being built; ``block`` the compute block's handle in it;
      ``match`` the `Match` carried out; ``target`` (a TVM Target or None) and ``template``;
      ``schedule``: True (the target's default schedule), False (none) or a callable the
      "schedule" stage calls instead; ``traced``: every change must be a schedule primitive
      (MetaSchedule replays the trace); ``plan``: which of the scratchpad tilings that fit
      ("scratchpad", 0: the best ranked); ``pattern``: the block as read at the start.
    Filled in by the stages (writer -> readers):
      ``steps``: every stage, in order -> the report;
      ``loops``: "tile" (`Loops`), re-cut by "scratchpad" and "fragments" -> "schedule",
      "decompose";
      ``packs`` and ``reindexed``: "stage" -> "pad" (which copies to pack, which to fold);
      ``copies``: "scratchpad" (tile copies) -> "epilogue", "dma copies";
      ``fragment_copies``: "fragments" -> "fragment copies";
      ``copy_intrinsics`` and ``intrinsics``: the stages that tensorize -> the result's list;
      ``init_block``: "decompose" -> "init";
      ``compute_tensorized``: "fragments" (the tensor-core kernel) -> "decompose", "tensorize",
      "init", which then have nothing left to do;
      ``fused``: "epilogue" (the blocks it ran on the accumulator) -> the result;
      ``func``: "link" (the rewritten PrimFunc) -> `tirbyoc.rewrite.block.tensorize`.
    """

    sch: object
    block: object
    match: Match
    target: object
    template: object
    schedule: object
    traced: bool
    plan: int
    pattern: BlockPattern
    steps: list = field(default_factory=list)  # Step records, in order
    loops: Loops | None = None
    packs: list = field(default_factory=list)  # (op, kind, #leading dims): pack after padding
    row_factors: list | None = None  # "stage" -> "pad": pad_einsum's factors for run-time rows
    fused_rows: list = field(default_factory=list)  # "stage": outer iterators folded into the last (batch x seq rows)
    static_rows: bool = False  # "stage": the rows padded are of known extent (a 7 x 7 output)
    reindexed: list = field(default_factory=list)  # (stage block, kind): fold into the pad copy
    copies: list = field(default_factory=list)  # tile copies to tensorize once the compute is
    fragment_copies: list = field(default_factory=list)  # (block, intrinsic), CUDA
    copy_intrinsics: list = field(default_factory=list)  # DMA / fragment intrinsics used
    init_block: object = None
    intrinsics: list = field(default_factory=list)  # compute and init intrinsics used
    func: object = None  # the result, once the last stage ran
    fused: list = field(default_factory=list)  # (block, what runs it) fused after the core
    compute_tensorized: bool = False  # a kernel stage tensorized compute and init itself

    @property
    def where(self) -> str:
        m = self.match
        return f"{m.function}/{m.block} with {m.intrinsic.name}"

    @property
    def axes(self) -> dict:
        return {a.axis: a for a in self.match.axes}

    @property
    def iter_kinds(self) -> dict:
        """The workload iterator of each match name -> its kind ("S" or "R")."""
        return dict(zip(self.match.iters, (it.kind for it in self.pattern.iters)))

    @property
    def padded(self) -> bool:
        """Whether ``pad_einsum`` pads the block: an intrinsic axis, or rows known only at run
        time (``row_factors``)."""
        return any(a.pads for a in self.match.axes) or self.row_factors is not None

    def bounded(self, scope: str) -> bool:
        s = self.template.scope(scope, missing_ok=True) if self.template is not None else None
        return s is not None and s.bounded

    @property
    def scratchpad_operands(self) -> dict[str, OperandMap]:
        """Operands the intrinsic wants in a bounded scratchpad: staged per tile by DMA."""
        return {op.operand: op for op in self.match.operands
                if self.bounded(op.scope) and op.scope != op.workload_scope}

    @property
    def fragment_operands(self) -> dict[str, OperandMap]:
        """Operands the intrinsic wants in GPU fragments: staged per warp tile."""
        if self.target is None or str(self.target.kind.name) != "cuda":
            return {}
        spad = self.scratchpad_operands
        return {op.operand: op for op in self.match.operands
                if op.scope != op.workload_scope and op.operand not in spad}

    @property
    def tiled(self) -> dict[str, OperandMap]:
        """Operands staged per tile (scratchpad or fragment), not as a whole buffer."""
        return {**self.scratchpad_operands, **self.fragment_operands}

    # -- steps ------------------------------------------------------------------------
    def record(self, kind: StepKind, detail: str, operand: str | None = None) -> None:
        self.steps.append(Step(kind, detail, operand))

    @contextlib.contextmanager
    def step(self, kind: StepKind, detail: str, operand: str | None = None):
        """A named step: recorded when it succeeds; a TVM error inside it becomes a
        `RewriteError` that names it."""
        try:
            yield
        except RewriteError:
            raise
        except Exception as err:  # noqa: BLE001 - TVM's errors have no common base
            raise RewriteError(f"{self.where}: step '{detail}' failed: {schedule_error_line(err)}") from err
        self.record(kind, detail, operand)

    # -- questions about the block ----------------------------------------------------
    def access(self, op: OperandMap) -> Access:
        if op.is_output:
            return self.pattern.store
        for acc in self.pattern.loads:
            if acc.buffer == op.buffer:
                return acc
        raise RewriteError(f"{self.where}: operand {op.operand} reads {op.buffer}, which the block "
                           "no longer reads")

    def region(self, kind: str, buffer: str) -> int:
        block = self.sch.get(self.block)
        regions = block.writes if kind == "write" else block.reads
        hits = [i for i, r in enumerate(regions) if str(r.source.name) == buffer]
        if len(hits) != 1:
            raise RewriteError(f"{self.where}: the block {kind}s {buffer!r} {len(hits)} times; "
                               "staging needs exactly one region")
        return hits[0]

    def staged_buffer(self, stage_block, kind: str) -> str:
        """The buffer a staging block made (what the compute now reads or writes)."""
        block = self.sch.get(stage_block)
        regions = block.reads if kind == "write" else block.writes
        return str(regions[0].source.name)

    def feeding(self, op: OperandMap, kind: str) -> str:
        """The buffer the compute block now uses for ``op`` (the workload's, or its staged
        or padded copy)."""
        block = self.sch.get(self.block)
        regions = block.writes if kind == "write" else block.reads
        names = [str(r.source.name) for r in regions]
        hits = [n for n in names if n == op.buffer] or [n for n in names if n.startswith(op.buffer + "_")]
        if len(hits) != 1:
            raise RewriteError(f"{self.where}: cannot tell which buffer feeds operand {op.operand} "
                               f"(candidates {hits or names})")
        return hits[0]

    def view_dims(self, acc: Access, op: OperandMap) -> list[int]:
        """The buffer dimension each intrinsic axis of the operand indexes (in view order)."""
        axes = self.axes
        return [next(d for d, vs in enumerate(acc.index_vars) if axes[a].iters[0] in vs)
                for a in op.view_axes]

    def dims_of(self, buffer: str, kind: str, op: OperandMap) -> tuple[int, list[int]]:
        """(ndim, the dimension of ``buffer`` each of the operand's axes indexes), read off
        the canonical block."""
        block = self.sch.get(self.block)
        pat = read_block(block)
        acc = pat.store if kind == "write" else next(a for a in pat.loads if a.buffer == buffer)
        names = [str(iv.var.name) for iv in block.iter_vars]
        pos = {a.axis: len(self.match.outer) + i for i, a in enumerate(self.match.axes)}
        dims = []
        for a in op.view_axes:
            hits = [d for d, vs in enumerate(acc.index_vars) if names[pos[a]] in vs]
            if len(hits) != 1:
                raise RewriteError(f"{self.where}: axis {a} of {op.operand} does not index one "
                                   f"dimension of {buffer}")
            dims.append(hits[0])
        return len(acc.indices), dims


def new_state(sch, match: Match, target, template, *, schedule=True, traced: bool = False,
              plan: int = 0) -> RewriteState:
    """The state a rewrite of ``match`` on ``sch`` starts from (refused early when the match
    needs an axis no iterator plays)."""
    where = f"{match.function}/{match.block} with {match.intrinsic.name}"
    try:
        block = sch.get_sblock(match.block)
    except Exception as err:  # noqa: BLE001 - TVM raises its own error kinds
        raise RewriteError(f"{where}: block {match.block!r} not found in the function "
                           f"({last_line(err)})") from err
    absent = [a.axis for a in match.axes if not a.iters and a.size > 1]
    if absent:
        raise RewriteError(
            f"{where}: intrinsic axis {absent[0]} has no workload iterator (e.g. a GEMV under a "
            "GEMM intrinsic); the operands would need a broadcast dimension that TVM's reindex "
            "cannot add. Declare an intrinsic without that axis (a GEMV).")
    return RewriteState(sch=sch, block=block, match=match, target=target, template=template,
                        schedule=schedule, traced=traced, plan=plan, pattern=read_block(sch.get(block)))


__all__ = ["Loops", "RewriteState", "new_state"]
