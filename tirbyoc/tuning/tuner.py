"""Tune a model's offloadable PrimFuncs with MetaSchedule, in tirbyoc's search space.

`tune` extracts the tasks (`offloadable_tasks`), gives each a `space` built on `TirbyocRule`,
measures each task's untuned default rewrite first (so tuning never ends worse than no
tuning), and runs MetaSchedule's own ``tune_tasks`` (evolutionary search, task scheduler, JSON
database in ``work_dir``) with a builder that does not load TVM's intrinsic library, the
runner the template needs (the host's ``LocalRunner``, an ``RPCRunner`` for a board behind a
tracker, or `SimulatorRunner` for simulated accelerators), and a measure callback that
counts valid candidates and reports progress. The database it leaves is what
``tirbyoc run --database`` applies (`tuned_schedules`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import shutil
import sys
import time
import types
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import LocalRunner, RPCConfig, RPCRunner

from tirbyoc.decl.registry import as_template
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.devices import device_of
from tirbyoc.offloading.table import render
from tirbyoc.tuning.apply import write_manifest
from tirbyoc.tuning.build import SimulatorBuilder, local_builder, tuning_target
from tirbyoc.tuning.rule import TirbyocRule
from tirbyoc.tuning.sim_runner import SimulatorRunner
from tirbyoc.tuning.tasks import TuneTask, offloadable_tasks, workload

log = logging.getLogger("tirbyoc.tuning")

FAILED = 1e9  # MetaSchedule records a candidate that did not build or run as 1e10 s


def space(template, *, tunable: bool = True, tilings: int | None = None):
    """MetaSchedule's ``PostOrderApply`` with `TirbyocRule` as its rule: the design space
    of ``template``'s rewrites, the register block as the tunable decision on CPUs.
    ``tunable=False, tilings=1``: the untuned default rewrite alone."""


    return ms.space_generator.PostOrderApply(
        sch_rules=[TirbyocRule(template, tunable=tunable, tilings=tilings)],
        postprocs=[ms.postproc.DisallowDynamicLoop()],
        mutator_probs={ms.mutator.MutateTileSize(): 1.0} if tunable else {})


@contextlib.contextmanager
def without_tvm_intrinsic_library():
    """MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin`` (about 40 s: it
    parses every built-in TVMScript intrinsic) although tirbyoc's candidates use only the
    template's own. While tuning, that import finds an empty module; afterwards a real import
    works as before. Not used when the library is already loaded."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        yield
        return
    placeholder = types.ModuleType(name)
    placeholder.__doc__ = "tirbyoc: TVM's built-in tensor intrinsics are not loaded while tuning"
    sys.modules[name] = placeholder
    try:
        yield
    finally:
        if sys.modules.get(name) is placeholder:
            del sys.modules[name]


@dataclass
class TaskOutcome:
    """One task's tuning: trials measured, how many were valid, the best time."""

    task: TuneTask
    trials: int = 0
    valid: int = 0
    best_secs: float | None = None

    @property
    def valid_fraction(self) -> float:
        return self.valid / self.trials if self.trials else 0.0


@dataclass
class TuneResult:
    """What `tune` did: per task outcomes, functions it could not offload, the database."""

    template: str
    work_dir: str
    tasks: list[TaskOutcome]
    skipped: list[tuple[str, str]]
    database: object = field(repr=False, default=None)
    seconds: float = 0.0
    unit: str = "s"  # what best_secs measures ("s" host seconds, "cycles" for a simulator)
    emulates: str = ""  # the instruction the template's code emulates: its times are not that one's

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def valid(self) -> int:
        return sum(t.valid for t in self.tasks)

    @property
    def valid_fraction(self) -> float:
        return self.valid / self.trials if self.trials else 0.0

    def table(self) -> str:

        rows = []
        for t in self.tasks:
            best = "-" if t.best_secs is None else (
                f"{t.best_secs:,.0f} cycles" if self.unit == "cycles" else f"{t.best_secs * 1e6:,.1f} us")
            rows.append((t.task.name, str(t.task.weight), f"{t.task.macs:,}",
                         ", ".join(dict.fromkeys(t.task.intrinsics)), str(t.trials),
                         f"{t.valid}/{t.trials}", best))
        rows += [(n, "-", "-", "not offloadable: " + why[:70], "-", "-", "-") for n, why in self.skipped]
        text = render(("task", "calls", "MACs", "intrinsic", "trials", "valid", "best"), rows)
        if self.emulates:
            text += (f"\nbest: times of {self.template}'s portable code, which emulates "
                     f"{self.emulates}: they rank candidates on this CPU, not the instruction's")
        return text

    def to_json(self) -> dict:
        return {"template": self.template, "work_dir": self.work_dir, "seconds": round(self.seconds, 1),
                "trials": self.trials, "valid": self.valid, "valid_fraction": self.valid_fraction,
                "unit": self.unit, "emulates": self.emulates,
                "tasks": [{"name": t.task.name, "functions": t.task.functions, "calls": t.task.weight,
                           "macs": t.task.macs, "intrinsics": list(t.task.intrinsics),
                           "trials": t.trials, "valid": t.valid, "best": t.best_secs} for t in self.tasks],
                "skipped": [{"name": n, "reason": r} for n, r in self.skipped]}


@derived_object
class _Count(PyMeasureCallback):
    """Counts measured and valid candidates per task, reports progress."""

    def __init__(self, outcomes: list[TaskOutcome], budget: int, progress, scale: float) -> None:
        super().__init__()
        self.outcomes, self.budget, self.progress, self.scale = outcomes, budget, progress, scale

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        out = self.outcomes[task_id]
        for built, ran in zip(builder_results, runner_results):
            out.trials += 1
            secs = _valid_secs(ran) if built.error_msg is None else None
            if secs:
                _record(out, secs, self.scale)
        if self.progress is not None:
            done = sum(o.trials for o in self.outcomes)
            self.progress(min(done, self.budget), self.budget, out.task.name)


def rpc_runner(tracker: str, key: str, *, timeout_sec: float = 60.0):
    """MetaSchedule's ``RPCRunner`` for devices registered under ``key`` at ``tracker``
    ("HOST:PORT")."""

    host, sep, port = tracker.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TirbyocError(f"--rpc-tracker {tracker!r}: expected HOST:PORT (e.g. 127.0.0.1:9190)")
    if not key:
        raise TirbyocError("--rpc-key is empty: give the key the devices registered with the tracker")
    return RPCRunner(RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key,
                               session_timeout_sec=timeout_sec))


def _runner(template, runner):

    if runner is not None:  # a SimulatorRunner measures cycles (reported at its clock)
        return runner, "cycles" if getattr(runner, "clock_hz", None) else "s"
    if getattr(template, "simulator", None) is not None:

        return SimulatorRunner(template), "cycles"
    paths = [str(lib.path) for lib in getattr(template, "libraries", ()) if not lib.ffi]
    # The runner measures in worker processes: a candidate calling the template's extern C
    # (blas's shim) would crash there ("Symbols not found") unless the worker loads it first.
    return LocalRunner(initializer=partial(_load_libraries, paths) if paths else None), "s"


def _builder(template, builder):
    """The builder candidates go through: ``builder`` (default a `local_builder`), behind a
    `SimulatorBuilder` for a simulated template (candidates prepared as `offload` prepares)."""
    builder = builder or local_builder()
    return SimulatorBuilder(template, builder) if getattr(template, "simulator", None) is not None else builder


def _load_libraries(paths: list) -> None:
    """In a runner's worker: load the template's C libraries globally, as `prepare` does in
    this process (kept importable by path, so that it pickles to the worker)."""

    for path in paths:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _seed_defaults(template, contexts, outcomes, database, builder, runner, target,
                   scale: float) -> int:
    """Measure each task's default rewrite (the untuned schedule ``tirbyoc.offload``
    gives) with the tuning's own builder and runner, and commit it to
    ``database`` before the search starts. MetaSchedule samples its first candidates at
    random from the design spaces, so on a small budget it may never measure the default;
    seeded, the database's best is never worse than the untuned rewrite, and the
    evolutionary search starts its population from it. Returns the candidates measured."""


    schedules = []
    for ctx in contexts:
        default = ms.TuneContext(ctx.mod, target=target, task_name=ctx.task_name,
                                 space_generator=space(template, tunable=False, tilings=1))
        spaces = default.generate_design_space()
        schedules.append(spaces[0] if spaces else None)
    todo = [(i, sch) for i, sch in enumerate(schedules) if sch is not None]
    if not todo:
        return 0
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, sch in todo])
    inputs, ready = [], []
    for (i, sch), b in zip(todo, built):
        outcome = outcomes[i]
        outcome.trials += 1
        if b.error_msg is not None:
            log.warning("tirbyoc tune: %s: the default rewrite did not build: %s",
                        outcome.task.name, b.error_msg.strip().splitlines()[-1][:200])
            continue
        args = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
        inputs.append(ms.runner.RunnerInput(str(b.artifact_path), _device_name(target), args))
        ready.append((i, sch, args, str(b.artifact_path)))
    for (i, sch, args, artifact), future in zip(ready, runner.run(inputs) if inputs else []):
        ran = future.result()
        shutil.rmtree(Path(artifact).parent, ignore_errors=True)
        secs = _valid_secs(ran)
        if not secs:
            log.warning("tirbyoc tune: %s: the default rewrite did not run: %s",
                        outcomes[i].task.name, (ran.error_msg or "no time").strip().splitlines()[-1][:300])
            continue
        workload_ = database.commit_workload(contexts[i].mod)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload_, run_secs=ran.run_secs, target=target, args_info=args))
        _record(outcomes[i], secs, scale)
    return len(todo)


def _device_name(target) -> str:
    """The device name a runner opens for ``target`` ("cpu" for llvm), as MetaSchedule's
    task scheduler gives it."""

    return str(tvm.runtime.Device(target.get_target_device_type(), 0)).partition(":")[0]


def _valid_secs(ran) -> list[float] | None:
    """The run times of a runner result that ran, or None (an error, or MetaSchedule's
    failure time)."""
    secs = [float(x) for x in (ran.run_secs or [])]
    if ran.error_msg is not None or not secs or min(secs) >= FAILED:
        return None
    return secs


def _record(outcome: TaskOutcome, secs: list[float], scale: float) -> None:
    """Count one valid measurement (mean of its runs) in ``outcome``."""
    outcome.valid += 1
    best = sum(secs) / len(secs) * scale
    if scale != 1.0:
        best = float(round(best))  # cycles (recorded as float32 seconds)
    outcome.best_secs = best if outcome.best_secs is None else min(outcome.best_secs, best)


@dataclass(frozen=True)
class TuneSettings:
    """How `tune` measures and searches, beyond its budget and where it writes."""

    runner: object = None  # a MetaSchedule runner (None: `SimulatorRunner` for a simulated
    # template, else ``LocalRunner``; `rpc_runner` for a remote board)
    builder: object = None  # a MetaSchedule builder (None: the template's own)
    target: object = None  # the target tuned for (None: the template's, for this CPU)
    trials_per_iter: int | None = None  # candidates per search round (None: from the budget)
    progress: object = None  # ``progress(done, total, task)``, after each measured batch
    seed: int = 0
    quiet: bool = True  # MetaSchedule's own log tables in ``work_dir/logs`` only


def tune(mod, template, *, trials: int, work_dir: str, settings: TuneSettings | None = None,
         **changes) -> TuneResult:
    """Tune the PrimFuncs of ``mod`` (an IRModule or PrimFunc) that ``template`` can
    offload, ``trials`` candidates in all, into a JSON database in ``work_dir``, as
    ``settings`` (or its fields as keywords: ``runner=rpc_runner(...)``) say. The first
    candidate of each task is its default rewrite (so at least one per task is measured)."""
    unknown = sorted(set(changes) - {f.name for f in fields(TuneSettings)})
    if unknown:
        raise TypeError(f"tune() got unknown option(s) {', '.join(unknown)}; TuneSettings has "
                        f"{', '.join(f.name for f in fields(TuneSettings))}")
    opts = replace(settings or TuneSettings(), **changes)
    runner, builder, target, progress, seed = opts.runner, opts.builder, opts.target, opts.progress, opts.seed
    template = as_template(template)
    if trials < 1:
        raise TirbyocError(f"--trials {trials}: give at least 1")
    tasks, skipped = offloadable_tasks(mod, template)
    result = TuneResult(template.name, work_dir, [TaskOutcome(t) for t in tasks], skipped,
                        emulates=template.emulates)
    if not tasks:
        return result

    tgt = tuning_target(template, target)
    device = device_of(tgt)
    if runner is None and device.emulated:
        raise TirbyocError(f"tuning {template.name} measures candidates where its code runs: this "
                           f"machine runs {device.name} code only in {device.emulator_name(tgt)}, "
                           f"which does not time it; give a runner for a {device.name} board (--rpc-tracker, --rpc-key)")
    write_manifest(work_dir, template)
    runner, result.unit = _runner(template, runner)
    scale = 1.0
    if result.unit == "cycles":
        scale = runner.clock_hz
    per_iter = opts.trials_per_iter or max(1, min(64, trials // max(1, len(tasks))))
    start = time.time()
    if opts.quiet:
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    with without_tvm_intrinsic_library():
        contexts = [ms.TuneContext(workload(t.func), target=tgt, space_generator=space(template),
                                   search_strategy="evolutionary", task_name=t.name,
                                   rand_state=seed + i, num_threads="physical")
                    for i, t in enumerate(tasks)]
        builder = _builder(template, builder)
        database = ms.database.JSONDatabase(work_dir=work_dir)
        seeded = _seed_defaults(template, contexts, result.tasks, database, builder, runner, tgt, scale)
        if progress is not None:
            progress(min(seeded, trials), trials, "default rewrites")
        left = trials - seeded
        if left > 0:
            per_iter = min(per_iter, left)
            callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
            callbacks.append(_Count(result.tasks, trials, progress, scale))
            ms.tune_tasks(
                tasks=contexts, task_weights=[float(t.weight) for t in tasks], work_dir=work_dir,
                max_trials_global=left, num_trials_per_iter=per_iter,
                builder=builder, runner=runner, database=database,
                cost_model="random" if left <= 2 * per_iter else "xgb" if _has_xgboost() else "random",
                measure_callbacks=callbacks)
        result.database = database
    result.seconds = time.time() - start
    return result


def _has_xgboost() -> bool:

    return importlib.util.find_spec("xgboost") is not None


__all__ = ["TaskOutcome", "TuneResult", "TuneSettings", "rpc_runner", "space", "tune",
           "without_tvm_intrinsic_library"]
