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

import itertools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from tirbyoc.app.preparation import activation_dtype, preparation
from tirbyoc.app.run import (
    UNSTABLE,
    build_reference,
    check_target,
    check_templates_on_target,
    run_offloaded,
)
from tirbyoc.app.legalize import legalized_model
from tirbyoc.app.options import RunOptions, options_of
from tirbyoc.app.targets import model_target, run_target
from tirbyoc.decl.registry import as_template, get_template, template_names
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.table import render


@dataclass
class SweepPoint:
    params: dict
    coverage: float | None = None
    verified: bool | None = None
    max_abs_err: float | None = None
    cycles: int | None = None
    utilization: dict = field(default_factory=dict)
    dma_bytes: int | None = None
    error: str | None = None  # why this point has no figures
    seconds: float = 0.0

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())

    def to_json(self) -> dict:
        return {"params": self.params, "coverage": self.coverage, "verified": self.verified,
                "max_abs_err": self.max_abs_err, "cycles": self.cycles,
                "utilization": self.utilization, "dma_bytes": self.dma_bytes, "error": self.error,
                "seconds": round(self.seconds, 2)}


def _value(text: str):
    """A grid value as the factory takes it: an int, a bool (true / false), or the text."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def parse_params(specs) -> dict[str, list]:
    """``["BLOCK_OUT=8,16,32", "acc_kib=64"]`` -> ``{"block_out": [8, 16, 32], "acc_kib": [64]}``."""
    grid: dict[str, list] = {}
    for spec in specs or ():
        name, sep, values = spec.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise TirbyocError(f"--param {spec!r}: write NAME=V1,V2,... (e.g. BLOCK_OUT=8,16,32)")
        grid[name.strip().lower()] = [_value(v) for v in values.split(",") if v.strip()]
    return grid


def grid_points(grid: dict[str, list]) -> list[dict]:
    names = list(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


def sweep(model: str | None, template, grid: dict[str, list], options: RunOptions | None = None, *,
          progress=None, jobs: int = 1, **changes) -> list[SweepPoint]:
    """One `SweepPoint` per grid point (in grid order), the model loaded and targeted as
    `RunOptions` says (``options``, or its fields as keywords: target, seed, obj,
    input_shapes); ``jobs``: worker processes."""
    opts = options_of(options, changes, "sweep")
    target, seed, obj, input_shapes = opts.target, opts.seed, opts.obj, opts.input_shapes

    base = as_template(template)
    for name in grid:  # unknown names fail before anything is built
        if name not in base.params:
            raise TirbyocError(f"template {base.name!r} has no parameter {name!r}; its parameters "
                               f"are {sorted(k for k in base.params if k != 'name')}")
    tgt = check_target(run_target(base, target))
    check_templates_on_target([base], tgt)
    todo = grid_points(grid)
    if jobs > 1 and len(todo) > 1:
        if base.name not in template_names() or get_template(base.name) is not base:
            raise TirbyocError(f"--jobs runs points in worker processes, which find the template by "
                               f"its registered name; the {base.name!r} given is not the registered "
                               "template of that name (a variant, or unregistered): sweep the "
                               "registered template, or run the points in this process (jobs=1)")
        return _sweep_parallel(model, base.name, todo, target, seed, obj, input_shapes, jobs, progress)
    references: dict = {}
    points = []
    for n, params in enumerate(todo):
        if progress is not None:
            progress(n, len(todo), ", ".join(f"{k}={v}" for k, v in params.items()))
        points.append(_run_point(model, base, params, target, seed, obj, input_shapes, references))
    if progress is not None:
        progress(len(todo), len(todo), "")
    return points


def _run_point(model, base, params, target, seed, obj, input_shapes, references: dict) -> SweepPoint:
    """One grid point: the variant offloaded, built, run and compared, on ``target`` or, when
    none is given, the variant's own (a parameter may change it: hexagon_hvx's ``arch``);
    ``references``: TVM's build per model preparation (`preparation`: activation dtype,
    requantization, fusion), shared by the points of one process. Every point runs the model
    as the base template prepares it, unless its cores take other activations."""
    t0 = time.perf_counter()
    point = SweepPoint(params)
    try:
        variant = base.variant(**params)
        tgt = check_target(run_target(variant, target))
        # one model for the whole grid: prepared as for the base template (a variant without
        # its ALU runs the same requantized model, its epilogues on the host), unless the
        # variant's cores take other activations
        prep = [base] if activation_dtype([base]) == activation_dtype([variant]) else [variant]
        key = preparation(prep)
        if key not in references:
            _, mod, entry, arrays = legalized_model(model, prep, seed, obj=obj, input_shapes=input_shapes,
                                                    constant_weights=True)
            ref, _, _ = build_reference(mod, model_target(tgt), entry, arrays, 1, "default", timed=False)
            references[key] = (mod, entry, arrays, ref)
        mod, entry, arrays, ref = references[key]
        done = run_offloaded(mod, [variant], tgt, entry, arrays, ref, repeat=1)
        report, comparison, simulation, missing = (done.report, done.comparison,
                                                   done.simulation, done.missing)
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
    except TirbyocError as err:
        point.error = str(err)
    point.seconds = time.perf_counter() - t0
    return point


def _point_in_worker(model, name, params, target, seed, obj, input_shapes) -> SweepPoint:
    return _run_point(model, get_template(name), params, target, seed, obj, input_shapes, {})


def _sweep_parallel(model, name, todo, target, seed, obj, input_shapes, jobs, progress) -> list[SweepPoint]:
    """The points in ``jobs`` spawned processes, one process per point (``max_tasks_per_child``),
    their TVM threads sharing this machine's cores."""
    jobs = min(jobs, len(todo))
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    saved = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = threads  # inherited by the workers as they start
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                 max_tasks_per_child=1) as pool:
            futures = [pool.submit(_point_in_worker, model, name, params, target, seed, obj, input_shapes)
                       for params in todo]
            points = []
            for n, future in enumerate(futures):
                if progress is not None:
                    progress(n, len(todo), ", ".join(f"{k}={v}" for k, v in todo[n].items()))
                points.append(future.result())
    finally:
        if saved is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = saved
    if progress is not None:
        progress(len(todo), len(todo), "")
    return points


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


__all__ = ["SweepPoint", "grid_points", "parse_params", "plot", "sweep", "table"]
