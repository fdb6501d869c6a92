"""Which PrimFuncs of a model are worth tuning with a template, as MetaSchedule workloads.

A task is one distinct PrimFunc (LegalizeOps shares equal operators; equal PrimFuncs of
different names are one task) in which the template's matcher finds a compute block, after
`prepare`. Its weight is the number of ``call_tir`` sites that call it, so MetaSchedule's task
scheduler spends trials where the model spends time. Functions without a match are listed
with the matcher's reason, not tuned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirbyoc._tvm import structural_equal, tirx, tvm
from tirbyoc.matching.matcher import explain
from tirbyoc.relax.bridge import call_counts, mac_blocks
from tirbyoc.tuning.preparation import best_matches, prepare


@dataclass
class TuneTask:
    """One workload to tune: the prepared PrimFunc and where the model uses it."""

    name: str
    func: object  # the prepared PrimFunc (tirbyoc.tuning.prepare)
    weight: int  # call sites in the model
    macs: int  # multiply-accumulates of one call
    intrinsics: tuple[str, ...]  # the intrinsic the matcher chose per matched block
    functions: list[str] = field(default_factory=list)  # every PrimFunc this task stands for


def workload(func):
    """The IRModule MetaSchedule keys a PrimFunc's records by (what ``tune_tir`` makes)."""

    func = func.with_attr("global_symbol", "main").with_attr("tirx.noalias", True)
    return tvm.IRModule({"main": func})


def offloadable_tasks(mod, template) -> tuple[list[TuneTask], list[tuple[str, str]]]:
    """(tasks, skipped): the distinct PrimFuncs of ``mod`` (an IRModule, or one PrimFunc)
    that ``template`` can offload, and (name, why not) for those with multiply-accumulates it
    cannot."""

    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    counts = call_counts(mod)
    tasks: list[TuneTask] = []
    skipped = []
    for gv, func in sorted(mod.functions.items(), key=lambda p: p[0].name_hint):
        if not isinstance(func, tirx.PrimFunc):
            continue
        name = gv.name_hint
        macs = mac_blocks(func)
        prepared = prepare(func, template)
        matches = best_matches(prepared, template)
        if not matches:
            if macs:
                reasons = [r.reason for r in explain(func, template) if r.block in macs and r.reason]
                skipped.append((name, reasons[0] if reasons else "no compute intrinsic matches"))
            continue
        key = workload(prepared)
        same = next((t for t in tasks if structural_equal(workload(t.func), key, False)), None)
        if same is not None:
            same.weight += counts.get(name, 1)
            same.functions.append(name)
            continue
        tasks.append(TuneTask(name, prepared, counts.get(name, 1), sum(macs.values()),
                              tuple(m.intrinsic.name for m in matches.values()), [name]))
    return tasks, skipped


__all__ = ["TuneTask", "offloadable_tasks", "workload"]
