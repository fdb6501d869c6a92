"""Make a workload's IR ready for a traced rewrite, before MetaSchedule sees it.

MetaSchedule keeps a candidate as the trace of schedule primitives that made it and replays
that trace on the workload. Two of tirbyoc's rewrite steps are IR edits no primitive
expresses - folding a separate init block into the reduction (`tirbyoc.init_merge`) and
putting a commuted product in the intrinsic's operand order - so they are done here, on the
workload, once. Tuning and applying a database both call `prepare` with the same template,
so the workload a record is keyed by is the one the rule was applied to.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import RewriteError


def best_matches(func, template) -> dict:
    """block name -> the matcher's best compute match for ``template`` (blocks without one
    are left out)."""
    from ..intrinsic import Role
    from ..matcher import explain

    out = {}
    for result in explain(func, template):
        compute = [m for m in result.matches if m.intrinsic.role is Role.COMPUTE]
        if compute:
            out[result.block] = compute[0]
    return out


def prepare(func, template):
    """``func`` with every matched block's separate init folded in and its product in the
    intrinsic's operand order. Returns ``func`` itself when nothing needed changing."""
    from .._tvm import Schedule
    from ..init_merge import merge_separate_init
    from ..registry import as_template
    from ..rewrite import _resolve, _Tensorizer

    template = as_template(template)
    for block, m in best_matches(func, template).items():
        if m.init not in (None, "in-block"):
            merged = merge_separate_init(func, m.init, block)
            if merged is None:
                continue  # the rule will say why it cannot offload this block
            func, m = merged, replace(m, init="in-block")
        target, tmpl = _resolve(m, None, template)
        try:
            rw = _Tensorizer(Schedule(func), m, target, False, tmpl)
            rw.commute()
        except RewriteError:
            continue
        func = rw.sch.mod["main"]
    return func


def prepare_module(mod, template):
    """`prepare` on every PrimFunc of an IRModule (a new module; Relax functions untouched)."""
    from .._tvm import tirx

    out = mod.clone()
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc):
            new = prepare(func, template)
            if not new.same_as(func):
                out.update_func(gv, new)
    return out


__all__ = ["best_matches", "prepare", "prepare_module"]
