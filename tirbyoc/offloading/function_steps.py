"""The steps an offload takes on the whole rewritten function, after its blocks are rewritten:
staging copies that move nothing read in place, the nests a CUDA kernel left on the host
bound to GPU threads, a simulated template's scratchpads accounted
(and their tiles double-buffered), a note added to every offloaded block's steps. Each takes
the function, the template, the rewrites and the blocks' outcomes and returns the function
and the outcomes; `FUNCTION_STEPS` lists them in the order `finish` runs them - a new
function-level step is a function of that shape and a place in that list."""

from __future__ import annotations

from dataclasses import replace

from tirbyoc.rewrite.double_buffer import plan_double_buffering
from tirbyoc.rewrite.gpu_threads import THREADS, bind_unbound_nests
from tirbyoc.rewrite.in_place import in_place_note, read_in_place
from tirbyoc.rewrite.scratchpad import scratchpad_usage
from tirbyoc.rewrite.steps import Step, StepKind


def with_step(off, step):
    """``off`` (an `Offloaded`) with ``step`` among each offloaded block's steps."""
    blocks = tuple(replace(b, steps=tuple(b.steps) + (step,)) if b.offloaded else b for b in off.blocks)
    return replace(off, blocks=blocks)


def in_place(func, rewrites, outcomes):
    """(``func`` with the staging copies that move nothing replaced by views of its
    parameters (`tirbyoc.rewrite.in_place`), ``outcomes`` with that among the steps of the
    offloaded blocks whose operands they were)."""
    if not rewrites:
        return func, outcomes
    func, done = read_in_place(func)
    if not done:
        return func, outcomes
    operands = {rw.match.block: {op.buffer for op in rw.match.operands} for rw in rewrites}

    def noted(o):
        mine = [d for d in done if d.param in operands.get(o.block, ())]
        return replace(o, steps=tuple(o.steps) + (Step(StepKind.IN_PLACE, in_place_note(mine)),)) if mine else o

    return func, [noted(o) if o.offloaded else o for o in outcomes]


def account_scratchpads(func, template, rewrites, outcomes):
    """For a simulated template: (the function with the scratchpad tiles that have room for
    two versions marked for double buffering (`tirbyoc.rewrite.double_buffer`) and telling the
    simulator what it allocates, ``outcomes`` with that decision among the offloaded blocks'
    steps)."""
    sim = getattr(template, "simulator", None)
    if sim is None or not rewrites:
        return func, outcomes
    used = scratchpad_usage(func, list(sim.config.scopes))  # measured once: marking keeps it
    func, notes = plan_double_buffering(func, template, used)
    noted = [replace(o, steps=tuple(o.steps) + tuple(Step(StepKind.DOUBLE_BUFFER, n) for n in notes))
             if o.offloaded else o for o in outcomes]
    return sim.annotate(func, used), noted


def bind_to_gpu(func, template, rewrites, outcomes):
    """For a CUDA template: (the function with the loop nests its kernels left unbound - the
    padding and staging copies around them - bound to GPU threads (`tirbyoc.rewrite.gpu_threads`:
    unbound, they would run on the host over device memory), ``outcomes`` saying so)."""
    if str(template.target.get("kind")) != "cuda" or not rewrites:
        return func, outcomes
    func, bound = bind_unbound_nests(func)
    if not bound:
        return func, outcomes
    step = Step(StepKind.SCHEDULE, f"{', '.join(bound)} on the GPU ({THREADS} threads per block)")
    return func, [replace(o, steps=tuple(o.steps) + (step,)) if o.offloaded else o for o in outcomes]


def _in_place_step(func, template, rewrites, outcomes):
    return in_place(func, rewrites, outcomes)


FUNCTION_STEPS = (_in_place_step, bind_to_gpu, account_scratchpads)  # in order, each (func, template, rewrites, outcomes)


def finish(func, template, rewrites, outcomes):
    """(``func``, ``outcomes``) after every step of `FUNCTION_STEPS`, in order."""
    for step in FUNCTION_STEPS:
        func, outcomes = step(func, template, rewrites, outcomes)
    return func, outcomes


__all__ = ["FUNCTION_STEPS", "account_scratchpads", "bind_to_gpu", "finish", "in_place", "with_step"]
