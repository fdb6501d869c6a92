"""The rewrite engine's entry points: a `Match` in, a tensorized PrimFunc out.

`tensorize` carries a match out on an ``s_tir.Schedule`` of the function, through the stages
of `tirbyoc.rewrite.foundation.pipeline` (commute, canonicalize, stage, pad, tile, scratchpad or
fragments, schedule, copies, decompose, tensorize, init, link: see `tirbyoc.rewrite.block.stages`),
so the result comes with a replayable trace. `tensorize_in` does the same on a schedule the
caller holds (MetaSchedule's), with schedule primitives only.

Every step that TVM refuses becomes a `RewriteError` naming the step; `tirbyoc.offload`
turns it into a clean fallback to TVM's default lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from tirbyoc._tvm import Schedule, make_target
from tirbyoc.decl.registry import get_template
from tirbyoc.errors import RewriteError, last_line
from tirbyoc.ir.init_merge import merge_separate_init
from tirbyoc.ir.normalize import trivial_loops
from tirbyoc.matching.results import Match
from tirbyoc.rewrite.block.order import rewrite
from tirbyoc.rewrite.foundation.state import Loops, RewriteState, new_state
from tirbyoc.rewrite.foundation.steps import Step


@dataclass(frozen=True)
class Rewritten:
    """A tensorized PrimFunc and how it was made."""

    func: object  # tirx.PrimFunc
    match: Match
    trace: object  # s_tir.Trace
    steps: tuple[Step, ...]  # what was done (records that read as sentences)
    intrinsics: tuple[str, ...]  # the tensor intrinsics the result calls
    schedule: object = field(default=None, repr=False)  # the s_tir.Schedule that made it
    fused: tuple = ()  # (block, unit) of the blocks after it now run on its tiles (epilogue)

    def describe(self) -> str:
        return "; ".join(self.steps)


def resolve(match: Match, target, template):
    """(Target or None, Template or None) for a rewrite: the template registered under the
    match's name unless one is given, and its target unless one is given."""
    if template is None and match.template is not None:
        template = get_template(match.template)
    if target is None and template is not None:
        target = template.target
    return (make_target(target) if target is not None else None), template


def _carry_out(state: RewriteState) -> Rewritten:
    state = rewrite(state)
    return Rewritten(state.func, state.match, state.sch.trace, tuple(state.steps),
                     tuple(state.intrinsics + state.copy_intrinsics), state.sch, tuple(state.fused))


def tensorize(func, match: Match, *, target=None, schedule: bool | Callable = True,
              template=None) -> Rewritten:
    """Rewrite ``match.block`` of ``func`` to call ``match.intrinsic`` (and its group's init).

    ``target``: what the default outer-loop schedule optimises for (default: the match's
    template's target). ``schedule``: True for the target's default schedule, False for
    none (loops as tiled, useful to read the IR), or a callable
    ``(sch, block, loops, match, target) -> note`` of your own. ``template``: the Template
    the match came from (its scopes' capacities and DMA intrinsics), default: the one
    registered under ``match.template`` — pass it for an unregistered variant.
    """
    target, template = resolve(match, target, template)
    if match.init not in (None, "in-block"):
        # a separate init block makes the output two-writer, which staging cannot handle
        merged = merge_separate_init(func, match.init, match.block)
        if merged is not None:
            func, match = merged, replace(match, init="in-block")
    # a block whose loops a schedule split or fused: one loop per iterator again, so that
    # transform_block_layout can re-tile it for the intrinsic
    func = trivial_loops(func, match.block) or func
    try:
        sch = Schedule(func)
    except Exception as err:
        raise RewriteError(f"{match.function}/{match.block}: TVM cannot schedule the function "
                           f"({last_line(err)})") from err
    return _carry_out(new_state(sch, match, target, template, schedule=schedule))


def tensorize_in(sch, match: Match, *, target=None, schedule: bool | Callable = True,
                 template=None, plan: int = 0) -> Rewritten:
    """`tensorize` on a schedule you hold (MetaSchedule's), with schedule primitives only,
    so that ``sch``'s trace replays the rewrite. ``sch`` is left as it was; the result's
    ``schedule`` carries on from it. Steps that are not primitives (folding a separate init
    block, reordering a commuted product, repairing a window blockize) are refused with a
    `RewriteError`: `tirbyoc.tuning.prepare` does the first two on the workload beforehand.
    ``plan``: on a scratchpad template, which of the tilings that fit to use (0: the best)."""
    target, template = resolve(match, target, template)
    if match.init not in (None, "in-block"):
        raise RewriteError(f"{match.function}/{match.block}: the reduction's init is the separate "
                           f"block {match.init!r}; prepare the workload first "
                           "(tirbyoc.tuning.prepare folds it into the block)")
    return _carry_out(new_state(sch.copy(), match, target, template, schedule=schedule,
                                traced=True, plan=plan))


__all__ = ["Loops", "Rewritten", "resolve", "tensorize", "tensorize_in"]
