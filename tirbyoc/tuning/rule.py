"""A MetaSchedule schedule rule that offloads blocks with a template's intrinsics.

TVM's own ``MultiLevelTilingWithIntrin`` takes one intrinsic and tensorizes only a block
whose loops already line up with it. `TirbyocRule` runs tirbyoc's matcher on the block and
carries out the match with the rewrite engine (`tirbyoc.rewrite.block.tensorize.tensorize_in`): transposed
and tile-packed operands, implicit-GEMM convolutions, padding for odd extents, scratchpad
staging with DMA intrinsics - all as schedule primitives, so MetaSchedule's trace replays
them. What it leaves to the search:

* on CPUs, the register block around the intrinsic (rows x tiles kept as accumulators, as
  ``sample_perfect_tile`` decisions that MetaSchedule's tile-size mutator explores);
* on scratchpad templates, the scratchpad tiling: one design space per tiling among the
  best that fit (`tirbyoc.rewrite.block.scratchpad.rank_tiles`), measured rather than estimated.

A block the template cannot compute is returned unchanged (other rules may schedule it);
why not is kept in `TirbyocRule.refusals` (and logged) so a tuning report can say it.
"""

from __future__ import annotations

import logging

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule

from tirbyoc._tvm import structural_equal
from tirbyoc.decl.registry import as_template
from tirbyoc.errors import RewriteError, TirbyocError
from tirbyoc.rewrite.cpu.register_blocks import default_schedule, sampled_block
from tirbyoc.rewrite.block.tensorize import tensorize_in
from tirbyoc.tuning.preparation import best_matches

log = logging.getLogger("tirbyoc.tuning")

# the annotation MetaSchedule's other rules respect: leave an offloaded block alone
_DONE = ("schedule_rule", "None")


def _scratchpad_plans(template) -> int:
    """How many scratchpad tilings become design spaces (1 for templates without them)."""
    return 4 if any(s.bounded for s in template.scopes) else 1


@derived_object
class TirbyocRule(PyScheduleRule):
    """Offload each block ``template`` can compute (see the module docstring).

    ``template``: a Template or its registered name. ``tunable``: sample the CPU register
    block (True) or use the default schedule's heuristic (False: one fixed candidate).
    ``tilings``: scratchpad tilings tried as separate design spaces (default 4 where the
    template has bounded scratchpads)."""

    def __init__(self, template, *, tunable: bool = True, tilings: int | None = None) -> None:
        super().__init__()
        self.template = as_template(template)
        self.tunable = tunable
        self.tilings = tilings if tilings is not None else _scratchpad_plans(self.template)
        self.target = None
        self.refusals: dict[str, str] = {}  # block -> why it was not offloaded
        self.offloaded: dict[str, str] = {}  # block -> the intrinsic it calls

    def _initialize_with_tune_context(self, context) -> None:
        self.target = context.target

    def clone(self):
        return TirbyocRule(self.template, tunable=self.tunable, tilings=self.tilings)

    def apply(self, sch, block):

        name = str(sch.get(block).name_hint)
        if sch.get(block).annotations.get(_DONE[0]) is not None:
            return [sch]
        try:
            m = best_matches(sch.mod["main"], self.template).get(name)
        except TirbyocError as err:
            return self._refuse(sch, name, str(err))
        if m is None:
            return self._refuse(sch, name, "no compute intrinsic of the template matches")
        target = self.target if self.target is not None else self.template.target

        def schedule_with(choose):
            def schedule(s, blk, loops, match, tgt):
                return default_schedule(s, blk, loops, match, tgt, choose)
            return schedule

        # the default schedule's own choice is one design space (`tune` also measures it
        # first, so tuning never ends worse than the untuned rewrite); the sampled register
        # block is another
        choices = [None, sampled_block] if self.tunable else [None]
        spaces = []
        for plan in range(self.tilings):
            for choose in choices:
                try:
                    rw = tensorize_in(sch, m, target=target, schedule=schedule_with(choose),
                                      template=self.template, plan=plan)
                except RewriteError as err:
                    if not spaces and plan == 0:
                        return self._refuse(sch, name, str(err))
                    continue
                spaces.append(rw.schedule)
            if self.tilings > 1 and len(spaces) <= plan * len(choices):
                break  # fewer tilings fit than asked for
        spaces = _distinct(spaces)
        self.offloaded[name] = m.intrinsic.name
        return spaces

    def _refuse(self, sch, name: str, why: str):
        if name not in self.refusals:
            log.info("tirbyoc rule: %s not offloaded: %s", name, why)
        self.refusals[name] = why
        return [sch]


def _distinct(spaces: list) -> list:
    """Design spaces with different IR (a scratchpad template ignores the CPU register
    block, so both choices give the same schedule there)."""

    out = []
    for sp in spaces:
        has_sampling = any(str(i.kind.name).startswith("Sample") for i in sp.trace.insts)
        if has_sampling or not any(structural_equal(sp.mod, o.mod, False) for o in out):
            out.append(sp)
    return out


__all__ = ["TirbyocRule"]
