"""`offload`: apply every match of a template in a PrimFunc, verify, leave the rest to TVM.

For each block the matcher can compute, a policy picks one of its matches, the rewrite
engine applies it, and (by default) `tirbyoc.verify` proves the new function computes what
the old one did. A block whose rewrite TVM refuses, or whose result does not verify, stays
as it was - with the reason recorded - so the function always builds with TVM's default
lowering for whatever was not offloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Callable, Sequence

from tirbyoc._tvm import is_host_target, make_target
from tirbyoc.decl.intrinsic import Role
from tirbyoc.decl.registry import as_template
from tirbyoc.decl.template import Template
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.errors import RewriteError, TirbyocError
from tirbyoc.ir.normalize import simplify_indices, unique_buffer_names
from tirbyoc.matching.matcher import explain
from tirbyoc.matching.results import Match, Mismatch
from tirbyoc.offloading.channel_wise import left_to_channel_vectors
from tirbyoc.offloading.resizing import exact_size, split_for_cores, target_cores
from tirbyoc.offloading.table import render
from tirbyoc.offloading.verification import Verification, verify as run_verify
from tirbyoc.offloading.few_rows import with_few_rows_path
from tirbyoc.offloading.function_steps import finish, owners_of, plan_scratchpads, tuned_owners, with_step
from tirbyoc.rewrite.foundation.steps import DECISIONS, Step, StepKind
from tirbyoc.rewrite.block.tensorize import Rewritten, tensorize
from tirbyoc.rewrite.cpu.winograd import winograd_for
from tirbyoc.rewrite.rest_schedule.vector_math import vector_math_for, vector_math_step


@dataclass(frozen=True)
class BlockOutcome:
    """What happened to one block: offloaded with an intrinsic, or kept and why."""

    block: str
    macs: int | None
    intrinsic: str | None  # the intrinsic it now calls, None if it stayed
    reason: str | None  # why it stayed (no match, rewrite refused, verification failed)
    steps: tuple[str, ...] = ()
    mismatch: Mismatch | None = None  # when no intrinsic matched: the most specific reason
    refused: bool = False  # when TVM refused every rewrite that matched

    @property
    def offloaded(self) -> bool:
        return self.intrinsic is not None


@dataclass(frozen=True)
class Offloaded:
    """The result of `offload`: the new PrimFunc and one outcome per block."""

    func: object
    original: object
    template: str
    blocks: tuple[BlockOutcome, ...]
    verification: object = None  # tirbyoc.Verification of the whole function, if run
    rewrites: tuple[Rewritten, ...] = field(default=(), repr=False)

    @property
    def offloaded(self) -> tuple[BlockOutcome, ...]:
        return tuple(b for b in self.blocks if b.offloaded)

    @property
    def coverage(self) -> float:
        """Fraction of the function's multiply-accumulates now offloaded (0 without any)."""
        total = sum(b.macs or 0 for b in self.blocks)
        done = sum(b.macs or 0 for b in self.blocks if b.offloaded)
        return done / total if total else 0.0

    def table(self) -> str:

        rows = [(b.block, f"{b.macs:,}" if b.macs else "-", b.intrinsic or "-",
                 _how(b.steps) if b.offloaded else (b.reason or "")) for b in self.blocks]
        return render(("block", "MACs", "intrinsic", "how / why not"), rows)


def _how(steps) -> str:
    """The decisions among a rewrite's steps (padding, layouts, tiles, schedule), for a table
    cell; the full list stays in ``steps``."""
    picked = [s.split(" (")[0] if s.kind is StepKind.SCRATCHPAD_PLAN else str(s)
              for s in steps if s.kind in DECISIONS]
    return "; ".join(picked) or (str(steps[-1]) if steps else "")


# -------------------------------------------------------------------------- policies
Policy = Callable[[Sequence[Match]], Match]


def first_match(matches: Sequence[Match]) -> Match:
    """The matcher's own order: fewest operands to stage, least padding."""
    return matches[0]


def estimated_cycles(m: Match) -> float:
    """Calls x the intrinsic's declared cycles, plus the bytes staging copies move (at one
    64-byte line per cycle) - a cheap, monotone stand-in for measuring. A run-time extent
    counts as one tile (`Match.calls` and the staged bytes alike), so matches of one block
    compare at its smallest size."""
    compute = m.calls * m.intrinsic.cost.cycles
    staged = 0
    for op in m.operands:
        if op.direct:
            continue
        spec = next(o for o in m.intrinsic.operands if o.name == op.operand)
        staged += prod(e or t for e, t in zip(op.view_extents, op.tile)) * dtype_bytes(spec.dtype)
    return compute + staged / 64.0


def lowest_cost(matches: Sequence[Match]) -> Match:
    """The match with the lowest `estimated_cycles`."""
    return min(matches, key=estimated_cycles)


POLICIES: dict[str, Policy] = {"first": first_match, "cost": lowest_cost}


def _policy(policy) -> Policy:
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except KeyError:
        raise TirbyocError(f"unknown offload policy {policy!r}; use one of {sorted(POLICIES)} "
                           "or a callable(matches) -> match") from None


# --------------------------------------------------------------------------- offload
def offload(func, template, policy="first", *, verify: bool = True, target=None,
            schedule=True, tuned=None, inputs: dict | None = None) -> Offloaded:
    """Offload every block of ``func`` that ``template`` can compute.

    ``template``: a Template or its name. ``policy``: ``"first"`` (the matcher's best),
    ``"cost"`` (lowest estimated cycles) or a callable choosing among a block's matches.
    ``verify``: build and compare the result with ``func`` (blocks are rewritten one by one;
    if the whole does not verify, each block is re-checked and the culprit dropped).
    ``tuned``: a lookup of tuned schedules (`tirbyoc.tuning.apply.tuned_schedules`); on a
    simulated template a tuned schedule the simulator finds slower than the untuned rewrite
    gives way to it, and the outcome says so. ``inputs``: arrays by parameter buffer name the
    check runs on (a model's constants), the others drawn.
    """

    tmpl = as_template(template)
    target = target if target is not None else tmpl.target
    simplified, steps = _matched_form(func, tmpl, make_target(target))
    plan = _Plan(func, simplified, explain(simplified, tmpl), _policy(policy), target, schedule, tmpl,
                 getattr(tmpl, "name", str(template)), verify, inputs)

    def untuned():
        off = _untuned(plan)
        for step in steps if off.rewrites else ():
            off = with_step(off, step, StepKind.EPILOGUE_LEFT if step.kind is StepKind.WINOGRAD else None)
        return off

    if tuned is not None:
        hit = _from_tuned(plan, tuned)
        if hit is not None:
            return _faster_in_simulator(hit, untuned, tmpl)
    return untuned()


def _matched_form(func, tmpl, target) -> tuple:
    """(``func`` as it is matched and rewritten: every buffer named apart, indices simplified,
    float32 erf as vector arithmetic, 3x3 convolutions in the template's Winograd form; the
    steps an offload of it reports for the last two)."""
    simplified, erfs = vector_math_for(simplify_indices(unique_buffer_names(func)), target)
    simplified, steps = winograd_for(simplified, getattr(tmpl, "winograd", 0), target)
    return simplified, ((vector_math_step(erfs),) if erfs else ()) + steps


@dataclass(frozen=True)
class _Plan:
    """What one `offload` works from, shared by its tuned and untuned paths: the function as
    given (``func``, what the result is verified against) and as matched (``simplified``), the
    matcher's ``results`` per block, the policy's ``choose``, where it runs (``target``), whether
    the target's schedule applies (``schedule``), the ``template`` and its ``name``, and
    whether to ``verify`` (on ``inputs`` where given)."""

    func: object
    simplified: object
    results: tuple
    choose: Callable
    target: object
    schedule: object
    template: object
    name: str
    verify: bool
    inputs: dict | None = None  # arrays the check runs on, by parameter buffer name

    def runtime_missing(self) -> str | None:
        """Why the template's code cannot run where verification would run it (this CPU), or
        None. Device code (CUDA) is left to verify, which still builds what it cannot run."""
        missing = self.template.unavailable_reason() if isinstance(self.template, Template) else None
        return missing if missing and is_host_target(self.target) else None


def _faster_in_simulator(tuned: Offloaded, untuned, template) -> Offloaded:
    """``tuned``, or for a simulated template whose two results both ran verified in the
    simulator, the untuned rewrite when it takes fewer cycles (a search can lose a mapping
    the rewrite makes, e.g. a replayed trace without the block DMA)."""
    sim = getattr(template, "simulator", None)
    if sim is None or tuned.verification is None or tuned.verification.passed is not True:
        return tuned
    tuned_cycles = sim.stats().cycles  # the verification's run of the tuned function
    other = untuned()
    if other.verification is None or other.verification.passed is not True:
        return tuned
    untuned_cycles = sim.stats().cycles
    if untuned_cycles >= tuned_cycles:
        return tuned
    note = Step(StepKind.TUNED, f"tuned schedule not used: {tuned_cycles:,} simulated cycles against "
                                f"{untuned_cycles:,} for the untuned rewrite")
    return with_step(other, note)


def _untuned(plan: _Plan) -> Offloaded:
    """`offload`'s result from the rewrite engine (no tuned schedule)."""
    current, outcomes, rewrites = _rewritten(plan, check_each=False)
    verification = None
    missing = plan.runtime_missing()
    if plan.verify and rewrites and missing:
        # the IR is the result: verify would run it on the CPU without the template's runtime
        # (e.g. a simulator not there yet)
        verification = Verification(None, float("nan"), reason=f"template {plan.name} cannot run here: {missing}")
    elif plan.verify and rewrites:
        verification = _verify_on(plan, plan.func, current)
        if verification.passed is False:
            # Find the culprit: redo block by block, keeping only rewrites that verify.
            current, outcomes, rewrites = _rewritten(plan, check_each=True)
            verification = _verify_on(plan, plan.func, current) if rewrites else None
    return Offloaded(current, plan.func, plan.name, tuple(outcomes), verification, tuple(rewrites))


def _rewritten(plan: _Plan, *, check_each: bool):
    """(the function with every chosen rewrite applied, `FUNCTION_STEPS` run on it and its few-rows
    path added - the function as given when nothing was rewritten -, the outcomes, the rewrites)."""
    current, outcomes, rewrites = _apply(plan, check_each=check_each)
    current = current if rewrites else plan.func  # verified against the function as given
    current, outcomes = finish(current, plan.template, owners_of(rewrites), outcomes)
    current, outcomes = with_few_rows_path(plan.simplified, current, outcomes, rewrites, plan.target)
    return current, outcomes, rewrites


def _verify_on(plan: _Plan, original, new):
    """`tirbyoc.verify` on the plan's target and ``inputs``, with its template's runtime active
    (its simulator configured with its own capacities), so the outcome does not depend on what
    ran before in the process."""
    template = plan.template
    if isinstance(template, Template):
        template.activate()
        return run_verify(original, new, plan.target, plan.inputs,
                          capacities={s.name: s.capacity for s in template.scopes if s.capacity})
    return run_verify(original, new, plan.target, plan.inputs)


TUNED_STEP = Step(StepKind.TUNED, "tuned schedule (MetaSchedule database)")


def _from_tuned(plan: _Plan, tuned):
    """`offload`'s result from a tuned schedule, or None (no record, or it did not verify)."""

    found = tuned(plan.func, plan.template)
    if found is None or not found[1]:
        return None
    new, blocks = found
    outcomes = [BlockOutcome(r.block, r.macs, blocks.get(r.block),
                             None if r.block in blocks else (r.reason or "not in the tuned schedule"),
                             (TUNED_STEP,) if r.block in blocks else ())
                for r in plan.results]
    new, outcomes = finish(new, plan.template, tuned_owners(blocks), outcomes)
    verification = None
    if plan.verify and not plan.runtime_missing():
        verification = _verify_on(plan, plan.func, new)
        if verification.passed is False:
            return None
    return Offloaded(new, plan.func, plan.name, tuple(outcomes), verification)


def prepare_for_simulator(func, template):
    """``func`` (rewritten for a simulated ``template``) as `offload` hands it over: its tiles
    marked for double buffering where they fit twice, its scratchpad footprint reported to the
    simulator. MetaSchedule's candidates go through it too, so the cycles a tuning measures are
    those of the code `offload` gives."""
    return plan_scratchpads(func, template)[0]


MAX_FALLBACK_MATCHES = 3


def _apply(plan: _Plan, *, check_each: bool):
    """(the function with each block's chosen rewrite applied, one outcome per block, the rewrites)."""
    current, target, template = plan.simplified, plan.target, plan.template
    outcomes: list[BlockOutcome] = []
    rewrites: list[Rewritten] = []
    fused_into: dict[str, tuple] = {}  # epilogue block -> (core whose tiles it runs on, unit)
    for result in plan.results:
        if result.block in fused_into:
            core, unit = fused_into[result.block]
            outcomes.append(BlockOutcome(
                result.block, result.macs, f"{template.name}.{unit}", None,
                (Step(StepKind.EPILOGUE, f"epilogue of {core}: on its accumulator tile"),)))
            continue
        compute = [m for m in result.matches if m.intrinsic.role is Role.COMPUTE]
        channel_wise = left_to_channel_vectors(current, result.block, template, target) if compute else None
        if not compute or channel_wise:
            outcomes.append(BlockOutcome(result.block, result.macs, None, channel_wise or result.reason
                                         or "no compute intrinsic matches", mismatch=result.mismatch))
            continue
        chosen = plan.choose(compute)
        rw, failures = None, []
        # the policy's choice first; if TVM refuses that rewrite, the next candidates in the
        # matcher's order (a GEMV where a batched GEMM lacks an axis), a few at most
        for candidate in [chosen] + [m for m in compute if m is not chosen][:MAX_FALLBACK_MATCHES]:
            try:
                candidate = exact_size(current, candidate, target_cores(target))
                rw = tensorize(current, candidate, target=target, schedule=plan.schedule,
                               template=template if isinstance(template, Template) else None)
                chosen = candidate
                break
            except RewriteError as err:
                failures.append(str(err))
        if rw is None:
            outcomes.append(BlockOutcome(result.block, result.macs, None, failures[0], refused=True))
            continue
        if check_each:  # this block's rewrite alone, as finish() would hand it over
            check = _verify_on(plan, current, finish(rw.func, template, owners_of([rw]), [])[0])
            if check.passed is False:
                outcomes.append(BlockOutcome(
                    result.block, result.macs, None,
                    f"rewrite with {chosen.intrinsic.name} did not verify ({check.describe()}); kept"))
                continue
        current = rw.func
        rewrites.append(rw)
        fused_into.update({block: (result.block, unit) for block, unit in rw.fused})
        outcomes.append(BlockOutcome(result.block, result.macs, ", ".join(dict.fromkeys(rw.intrinsics)), None,
                                     rw.steps))
    return current, outcomes, rewrites


__all__ = ["BlockOutcome", "Offloaded", "POLICIES", "estimated_cycles", "exact_size", "split_for_cores", "target_cores",
           "first_match", "lowest_cost", "offload", "prepare_for_simulator"]
