"""Make a workload's IR ready for a traced rewrite, before MetaSchedule sees it.

MetaSchedule keeps a candidate as the trace of schedule primitives that made it and replays
that trace on the workload. Two of tirbyoc's rewrite steps are IR edits no primitive
expresses - folding a separate init block into the reduction (`tirbyoc.ir.init_merge`) and
putting a commuted product in the intrinsic's operand order - so they are done here, on the
workload, once. Tuning and applying a database both call `prepare` with the same template,
so the workload a record is keyed by is the one the rule was applied to.
"""

from __future__ import annotations

from dataclasses import replace

from tirbyoc._tvm import Schedule, tirx
from tirbyoc.decl.intrinsic import Role
from tirbyoc.decl.registry import as_template
from tirbyoc.errors import RewriteError
from tirbyoc.ir.init_merge import merge_separate_init
from tirbyoc.matching.matcher import explain
from tirbyoc.rewrite.block.stages import commute
from tirbyoc.rewrite.foundation.state import new_state
from tirbyoc.rewrite.block.tensorize import resolve


def best_matches(func, template) -> dict:
    """block name -> the matcher's best compute match for ``template`` (blocks without one
    are left out)."""

    out = {}
    for result in explain(func, template):
        # an axis of run-time size is a whole-function library call's or padded when the
        # function runs: the untuned rewrite's, not a schedule MetaSchedule measures at one size
        compute = [m for m in result.matches if m.intrinsic.role is Role.COMPUTE and not m.symbolic_axes]
        if compute:
            out[result.block] = compute[0]
    return out


def prepare(func, template):
    """``func`` with every matched block's separate init folded in and its product in the
    intrinsic's operand order. Returns ``func`` itself when nothing needed changing."""

    template = as_template(template)
    for block, m in best_matches(func, template).items():
        if m.init not in (None, "in-block"):
            merged = merge_separate_init(func, m.init, block)
            if merged is None:
                continue  # the rule will say why it cannot offload this block
            func, m = merged, replace(m, init="in-block")
        target, tmpl = resolve(m, None, template)
        try:
            state = new_state(Schedule(func), m, target, tmpl, schedule=False)
            commute(state)
        except RewriteError:
            continue
        func = state.sch.mod["main"]
    return func


def prepare_module(mod, template):
    """`prepare` on every PrimFunc of an IRModule (a new module; Relax functions untouched)."""

    out = mod.clone()
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc):
            new = prepare(func, template)
            if not new.same_as(func):
                out.update_func(gv, new)
    return out


__all__ = ["best_matches", "prepare", "prepare_module"]
