"""`tirbyoc sweep`: run one model on a grid of template variants and compare them.

    tirbyoc sweep --template vta --param BLOCK_OUT=8,16,32 --param ACC_KIB=64,128 \\
                  --model builtin:cnn_int8 [--json] [--plot out.png]

Each grid point re-declares the template with `Template.variant` (its factory validates the
parameters; an invalid point becomes a row saying why), offloads the legalized model, builds
and runs it once - simulated templates report cycles and utilization - and compares it with
TVM's default build, which runs once per activation dtype for the whole grid. With
``jobs > 1`` the points run in that many worker processes, each point in a process of its own
(its own reference build, simulator and TVM state; the threads per process divided among
them): the same rows as a serial sweep, in grid order, sooner.
"""

from __future__ import annotations

import time
from dataclasses import replace

from tirbyoc.app.model_in.preparation import activation_dtype, preparation
from tirbyoc.app.running.run import (
    UNSTABLE,
    OffloadRun,
    build_and_time,
    build_reference,
    check_target,
    check_templates_on_target,
    compare,
    run_offloaded,
)
from tirbyoc.app.model_in.legalize import legalized_model
from tirbyoc.app.sweeping.objectives import scratchpad_kib
from tirbyoc.app.running.model_call import ModelCall
from tirbyoc.app.options import RunOptions, options_of
from tirbyoc.app.sweeping.search import SearchPlan, SearchResult, Workers, search
from tirbyoc.app.sweeping.search_space import SearchSpace, point_key
from tirbyoc.app.sweeping.sweep_point import SweepPoint
from tirbyoc.app.sweeping.sweep_results import ResultsFile
from tirbyoc.app.run_target import run_target
from tirbyoc.app.running.targets import model_target
from tirbyoc.decl.registry import as_template, get_template, template_names
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.table import render


def parse_params(specs) -> dict[str, list]:
    """``["BLOCK_OUT=8,16,32", "acc_kib=32..256:x2"]`` -> ``{"block_out": [8, 16, 32],
    "acc_kib": [32, 64, 128, 256]}`` (`SearchSpace.parse`)."""
    return SearchSpace.parse(specs).params


def sweep(model: str | None, template, grid: dict[str, list], options: RunOptions | None = None, *,
          progress=None, **changes) -> list[SweepPoint]:
    """One `SweepPoint` per grid point (in grid order), the model loaded and targeted as
    `RunOptions` says (``options``, or its fields as keywords: target, seed, obj,
    input_shapes); ``jobs=N``: worker processes (a `SearchPlan` field, as keywords too)."""
    result = search_model(model, template, SearchSpace(grid), options, progress=progress, **changes)
    return result.points


def _split_changes(changes: dict) -> tuple[dict, dict]:
    """(the keywords that are `SearchPlan` fields, the rest: `RunOptions` fields)."""
    planned = {k: v for k, v in changes.items() if k in SearchPlan.names()}
    return planned, {k: v for k, v in changes.items() if k not in planned}


def search_model(model: str | None, template, space: SearchSpace, options: RunOptions | None = None, *,
                 plan: SearchPlan | None = None, progress=None, **changes) -> SearchResult:
    """A sweep of ``space`` as `tirbyoc.app.sweeping.search.search` runs it, as ``plan`` says (or its
    fields as keywords: ``strategy="tpe", trials=40, engine="dask", jobs=2``): its strategy
    proposes points until its trials or seconds run out, its engine runs them in its workers
    (or on the cluster at its address), each finished row appended to its results file (JSON
    lines; a second run with it resumes). The model is loaded and targeted as `RunOptions`
    says (``options``, or its fields as keywords). A grid's points come back in grid order, a
    search's as they finished."""
    planned, changes = _split_changes(changes)
    plan = replace(plan or SearchPlan(), **planned)
    opts = options_of(options, changes, "sweep")
    point_opts = RunOptions(target=opts.target, seed=opts.seed, obj=opts.obj, input_shapes=opts.input_shapes)
    base = as_template(template)
    space.check(base.params)  # unknown names fail before anything is built
    tgt = check_target(run_target(base, opts.target))
    check_templates_on_target([base], tgt)
    if not plan.serial and (base.name not in template_names() or get_template(base.name) is not base):
        raise TirbyocError(f"--jobs and --engine run points in worker processes, which find the template "
                           f"by its registered name; the {base.name!r} given is not the registered "
                           "template of that name (a variant, or unregistered): sweep the "
                           "registered template, or run the points in this process (jobs=1)")
    references: dict = {}

    def run(params: dict) -> SweepPoint:
        return run_point(model, base, params, point_opts, references)

    header = {"model": model, "template": base.name, "target": opts.target, "seed": opts.seed,
              "space": {k: list(v) for k, v in space.params.items()}}
    store = ResultsFile(plan.results, header) if plan.results is not None else None
    workers = Workers(run_point_by_name, (model, base.name, point_opts), lambda params: _code_key_of(base, params))
    result = search(space, run, plan, base, seed=opts.seed, store=store, progress=progress, workers=workers)
    if plan.strategy == "grid":
        order = {point_key(p): n for n, p in enumerate(space.grid())}
        result.points.sort(key=lambda p: order.get(point_key(p.params), len(order)))
    return result


def run_point(model, base, params, options: RunOptions, references: dict) -> SweepPoint:
    """One point: the variant offloaded, built, run and compared, on ``options.target`` or,
    when none is given, the variant's own (a parameter may change it: hexagon_hvx's ``arch``),
    the model loaded as ``options`` says; ``references``: TVM's build per model preparation
    (`preparation`: activation dtype, requantization, fusion), shared by the points of one
    process. Every point runs the model as the base template prepares it, unless its cores
    take other activations."""
    t0 = time.perf_counter()
    point = SweepPoint(params)
    try:
        variant = base.variant(**params)
        point.scratchpad_kib = scratchpad_kib(variant)
        tgt = check_target(run_target(variant, options.target))
        # one model for the whole grid: prepared as for the base template (a variant without
        # its ALU runs the same requantized model, its epilogues on the host), unless the
        # variant's cores take other activations
        prep = [base] if activation_dtype([base]) == activation_dtype([variant]) else [variant]
        key = preparation(prep, options.target)
        if key not in references:
            prepared = legalized_model(model, prep, options, constant_weights=True)
            untouched = ModelCall(prepared.mod, model_target(tgt), prepared.entry, prepared.arrays)
            ref, _, _ = build_reference(untouched, 1, "default", timed=False)
            references[key] = (prepared.mod, prepared.entry, prepared.arrays, ref)
        mod, entry, arrays, ref = references[key]
        done = _offloaded_run(references, key, ModelCall(mod, tgt, entry, arrays), variant, ref)
        _record(point, variant, ref, done)
    except TirbyocError as err:
        point.error = str(err)
    point.seconds = time.perf_counter() - t0
    return point


BUILDS_KEPT = 4  # offloaded builds a process keeps for points that differ only in timing


def code_key(template) -> str:
    """What the code of ``template``'s offload depends on: its parameters but the timing ones
    (`Template.timing_params`)."""
    return repr(sorted((k, v) for k, v in template.params.items() if k not in template.timing_params))


def _code_key_of(base, params: dict) -> str | None:
    try:
        return code_key(base.variant(**params))
    except TirbyocError:  # an invalid point: its run says why
        return None


def _offloaded_run(references: dict, prep_key, call: ModelCall, variant, ref):
    """`run_offloaded` of ``call`` (its target: the variant's) for ``variant``, or - when this
    process built the same code for a variant that differs only in timing parameters - that
    build run again under this variant's simulator, its output compared again (the same code,
    its own cycles)."""
    builds = references.setdefault("builds", {})  # (preparation, code key) -> (run, its executable)
    key = (prep_key, code_key(variant))
    kept, compiled = builds.get(key, (None, {}))
    if kept is None or kept.module is None or kept.comparison is None:
        done = run_offloaded(call, [variant], ref, RunOptions(repeat=1), builds=compiled)
        builds[key] = (done, compiled)
        while len(builds) > BUILDS_KEPT:
            builds.pop(next(iter(builds)))
        return done
    out, _, stats = build_and_time(call.offloaded(kept.module), 1, [variant.simulator], timed=False,
                                   builds=compiled)
    return OffloadRun(kept.report, compare(out, ref), None, {variant.name: stats[0]}, kept.missing)


def _record(point: SweepPoint, variant, ref, done) -> None:
    """A run's figures into ``point``."""
    report, comparison, simulation = done.report, done.comparison, done.simulation
    missing = list(done.missing)  # a copy: the run may be kept for the next point (`_offloaded_run`)
    point.coverage = report.coverage
    if ref is None:
        missing.append(UNSTABLE)
    if comparison is not None:
        point.verified, point.max_abs_err = comparison.passed, comparison.abs_err
        if comparison.note:
            missing.append(f"not meaningfully checked: {comparison.note}")
    if missing:
        point.error = "; ".join(missing)
    st = simulation.get(variant.name)
    if st is not None:
        point.cycles, point.utilization = st.cycles, st.utilization
        point.dma_bytes = sum(st.load_bytes.values()) + st.store_bytes


# TVM's builds of the model per sweep, kept by a worker process that runs several points
# (a Dask worker): the same reference a serial sweep shares among its points
_WORKER_REFERENCES: dict = {}


def run_point_by_name(model, name, options: RunOptions, params) -> SweepPoint:
    """`run_point` in a worker process, which finds the template by its registered name."""
    key = repr((model, name, options))
    references = _WORKER_REFERENCES.setdefault(key, {})
    return run_point(model, get_template(name), params, options, references)


def table(points: list[SweepPoint]) -> str:

    rows = []
    for p in points:
        if p.error and p.coverage is None:
            rows.append((p.label(), "-", "-", "-", "-", p.error))
            continue
        util = p.utilization.get("compute")
        rows.append((p.label(), f"{p.coverage:.1%}", "-" if p.cycles is None else f"{p.cycles:,}",
                     "-" if util is None else f"{util:.0%}",
                     {True: "yes", False: "NO", None: "-"}[p.verified], p.error or ""))
    return render(("parameters", "coverage", "cycles", "compute busy", "verified", "note"), rows)


def plot(points: list[SweepPoint], path: str, title: str = "") -> None:
    """Cycles per grid point (bars; unverified points hatched) with each unit's utilization
    (load, compute, store) as lines."""
    try:
        # deferred: optional dependency
        import matplotlib

        matplotlib.use("Agg")
        # deferred: optional dependency
        import matplotlib.pyplot as plt
    except ImportError:
        raise TirbyocError("--plot needs matplotlib: pip install 'tirbyoc[plot]'") from None
    shown = [p for p in points if p.cycles is not None]
    if not shown:
        raise TirbyocError("no grid point has simulated cycles to plot")
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(shown) + 2), 4.5))
    xs = range(len(shown))
    bars = ax.bar(xs, [p.cycles for p in shown], color=["#2e7d32" if p.verified else "#c62828" for p in shown])
    for bar, p in zip(bars, shown):
        bar.set_hatch("" if p.verified else "//")
        ax.annotate(f"{p.coverage:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [p.label().replace(", ", "\n") for p in shown], fontsize=8,
                  rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel("simulated cycles (bars; label: MAC coverage)")
    ax2 = ax.twinx()
    for unit, style in (("compute", "o-"), ("load", "s--"), ("store", "^:")):
        ax2.plot(list(xs), [p.utilization.get(unit, 0) * 100 for p in shown], style, label=unit)
    ax2.set_ylabel("unit busy (% of cycles)")
    ax2.set_ylim(0, 100)
    ax2.legend(loc="upper right", fontsize=8, title="busy", title_fontsize=8)
    ax.set_title(title or "template sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["SweepPoint", "parse_params", "plot", "run_point", "run_point_by_name", "search_model",
           "sweep", "table"]
