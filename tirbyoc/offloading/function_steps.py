"""The steps an offload takes on the whole rewritten function, after its blocks are rewritten:
staging copies that move nothing read in place, the nests a CUDA kernel left on the host
bound to GPU threads, a simulated template's scratchpads accounted
(and their tiles double-buffered), a note added to every offloaded block's steps. Each takes
the function, the template, the offloaded blocks' operands and the blocks' outcomes and
returns the function and the outcomes; `FUNCTION_STEPS` lists them in the order `finish` runs
them, for the rewrite engine's result and a tuned schedule's alike - a new function-level step
is a function of that shape and a place in that list."""

from __future__ import annotations

from dataclasses import replace

from tirbyoc.offloading.devices import CUDA, device_of
from tirbyoc.rewrite.functions.double_buffer import plan_double_buffering
from tirbyoc.rewrite.functions.gpu_threads import THREADS, bind_unbound_nests
from tirbyoc.rewrite.functions.in_place import in_place_note, read_in_place
from tirbyoc.rewrite.block.scratchpad import scratchpad_usage
from tirbyoc.rewrite.foundation.pipeline import Stage, run_in_order
from tirbyoc.rewrite.foundation.steps import Step, StepKind


def with_step(off, step, replaces=None):
    """``off`` (an `Offloaded`) with ``step`` among each offloaded block's steps, in place of
    its steps of kind ``replaces`` (a Winograd form's output transform is where the epilogue
    the core's write-back did not take runs)."""
    def kept(steps):
        return tuple(s for s in steps if replaces is None or getattr(s, "kind", None) is not replaces)

    blocks = tuple(replace(b, steps=kept(b.steps) + (step,)) if b.offloaded else b for b in off.blocks)
    return replace(off, blocks=blocks)


def owners_of(rewrites) -> dict:
    """Each rewritten block -> the buffers its intrinsic's operands read and write (what a
    function step attributes its changes by)."""
    return {rw.match.block: frozenset(op.buffer for op in rw.match.operands) for rw in rewrites}


def tuned_owners(blocks) -> dict:
    """Each block a tuned schedule offloads -> None: which buffers it reads is not known."""
    return dict.fromkeys(blocks)


def _noted(outcomes, owners, step_of):
    """``outcomes`` with ``step_of(operand buffers or None)`` (a Step or None) added to each
    offloaded block's steps that ``owners`` names."""
    def note(o):
        step = step_of(owners[o.block]) if o.offloaded and o.block in owners else None
        return replace(o, steps=tuple(o.steps) + (step,)) if step is not None else o
    return [note(o) for o in outcomes]


def in_place(func, template, owners, outcomes):
    """(``func`` with the staging copies that move nothing replaced by views of its
    parameters (`tirbyoc.rewrite.functions.in_place`), ``outcomes`` with that among the steps of the
    offloaded blocks whose operands they were)."""
    if not owners:
        return func, outcomes
    func, done = read_in_place(func)
    if not done:
        return func, outcomes

    def step_of(buffers):
        # a chain of views (an identity pad, then its staging) names the parameter once
        params = {d.param for d in done if buffers is None or d.param in buffers or d.copy in buffers}
        mine = [d for d in done if d.param in params]
        return Step(StepKind.IN_PLACE, in_place_note(mine)) if mine else None

    return func, _noted(outcomes, owners, step_of)


def bind_to_gpu(func, template, owners, outcomes):
    """For a CUDA template: (the function with the loop nests its kernels left unbound - the
    padding and staging copies around them - bound to GPU threads (`tirbyoc.rewrite.functions.gpu_threads`:
    unbound, they would run on the host over device memory), ``outcomes`` saying so)."""
    if device_of(dict(template.target)) is not CUDA or not owners:
        return func, outcomes
    func, bound = bind_unbound_nests(func)
    if not bound:
        return func, outcomes
    step = Step(StepKind.SCHEDULE, f"{', '.join(bound)} on the GPU ({THREADS} threads per block)")
    return func, _noted(outcomes, owners, lambda _: step)


def plan_scratchpads(func, template):
    """For a simulated template: (``func`` with the scratchpad tiles that have room for two
    versions marked for double buffering (`tirbyoc.rewrite.functions.double_buffer`) and telling the
    simulator what it allocates, the decisions as sentences); ``func`` and none otherwise.
    MetaSchedule's candidates go through it too (`offloader.prepare_for_simulator`)."""
    sim = getattr(template, "simulator", None)
    if sim is None:
        return func, []
    used = scratchpad_usage(func, list(sim.config.scopes))  # measured once: marking keeps it
    func, notes = plan_double_buffering(func, template, used)
    return sim.annotate(func, used), notes


def account_scratchpads(func, template, owners, outcomes):
    """`plan_scratchpads` on an offloaded function, its decisions among the offloaded blocks' steps."""
    if not owners:
        return func, outcomes
    func, notes = plan_scratchpads(func, template)
    noted = [replace(o, steps=tuple(o.steps) + tuple(Step(StepKind.DOUBLE_BUFFER, n) for n in notes))
             if o.offloaded else o for o in outcomes]
    return func, noted


# in order, each (func, template, owners, outcomes) -> (func, outcomes); owners: each offloaded
# block -> its operand buffers (`owners_of`), or None where not known (`tuned_owners`)
FUNCTION_STEPS = (
    Stage("in place", in_place, "staging copies that move nothing replaced by views of the parameters"),
    Stage("bind to gpu", bind_to_gpu, "the nests a CUDA kernel left on the host bound to GPU threads"),
    Stage("scratchpads", account_scratchpads, "a simulated template's scratchpads accounted and double-buffered"),
)


def finish(func, template, owners, outcomes):
    """(``func``, ``outcomes``) after every step of `FUNCTION_STEPS`, in order (dumped as every
    pipeline's stages are, `tirbyoc.rewrite.foundation.pipeline`)."""
    def apply(step, done):
        out = step.fn(done[0], template, owners, done[1])
        return None if out[0] is done[0] and out[1] is done[1] else out

    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"
    func, outcomes = run_in_order(FUNCTION_STEPS, (func, outcomes), apply, label=f"function.{name}",
                                  script=lambda done: done[0].script())
    return func, list(outcomes)


__all__ = ["FUNCTION_STEPS", "account_scratchpads", "bind_to_gpu", "finish", "in_place", "owners_of",
           "plan_scratchpads", "tuned_owners", "with_step"]
