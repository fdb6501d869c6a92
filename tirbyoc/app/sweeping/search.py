"""`tirbyoc sweep` as a search: a strategy proposes template variants, an engine runs them,
the results stream to a file, and the report is the best point and the Pareto front.

    tirbyoc sweep -t vta -p BLOCK_OUT=8,16,32 -p ACC_KIB=32..256:x2 -m builtin:resnet18_int8 \\
        --search tpe --trials 40 --objective cycles --objective scratchpad_kib \\
        --constraint scratchpad_kib<=512 --engine dask --jobs 2 --results vta.jsonl

Each point is what a grid sweep makes of it (`tirbyoc.app.sweeping.sweep.run_point`: the variant
offloaded, simulated, checked against TVM's build), so a point's row is the same whichever
strategy proposed it and whichever engine ran it. A constraint on the parameters or on the
variant's scratchpad is checked before a point runs (a point that breaks it is not run and
does not count as a trial); one on a simulated figure after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from tirbyoc.app.sweeping.engines import engine as make_engine
from tirbyoc.app.sweeping.objectives import objective, pareto_front, scratchpad_kib
from tirbyoc.app.sweeping.search_space import Constraint, SearchSpace, point_key
from tirbyoc.app.sweeping.strategies import strategy as make_strategy
from tirbyoc.app.sweeping.sweep_point import SweepPoint
from tirbyoc.app.sweeping.sweep_results import ResultsFile
from tirbyoc.errors import TirbyocError


@dataclass
class SearchResult:
    points: list  # SweepPoints, in the order they finished (resumed ones first)
    objectives: list
    constraints: list
    trials: int  # points run or read back from the results file
    seconds: float
    skipped: list = field(default_factory=list)  # (params, the constraint it breaks), never run
    resumed: int = 0  # of the trials, points read back from the results file

    def feasible(self) -> list:
        """Points with every objective's figure that meet every constraint."""
        return [p for p in self.points if self.values(p) is not None]

    def values(self, point) -> tuple | None:
        vals = tuple(o.value(point) for o in self.objectives)
        if any(v is None for v in vals) or point.verified is False:
            return None
        if not all(c.holds(_figure(point, c.name)) for c in self.constraints):
            return None
        return vals

    def best(self):
        """The feasible point best in the first objective, ties broken by the next ones
        (None without one)."""
        def rank(p):
            return tuple(v if o.direction == "minimize" else -v for o, v in zip(self.objectives, self.values(p)))

        return min(self.feasible(), key=rank, default=None)

    def front(self) -> list:
        """The feasible points no other feasible point dominates, by the first objective."""
        ok = self.feasible()
        idx = pareto_front([self.values(p) for p in ok], self.objectives)
        first = self.objectives[0]
        return sorted((ok[i] for i in idx), key=first.value)


def _figure(point, name: str):
    """A constraint's figure: a parameter, or an objective the point reports."""
    if name in point.params:
        return point.params[name]
    try:
        return objective(name).value(point)
    except TirbyocError:  # an unknown name: the constraint cannot hold
        return None


class _Budget:
    """Trials and seconds left."""

    def __init__(self, trials: int | None, seconds: float | None, size: int):
        self.trials, self.seconds, self.start = trials, seconds, time.monotonic()
        self.total = size if trials is None else min(trials, size)  # for the progress bar
        self.used = 0

    def open(self) -> bool:
        over_time = self.seconds is not None and time.monotonic() - self.start >= self.seconds
        return not over_time and (self.trials is None or self.used < self.trials)


@dataclass(frozen=True)
class SearchPlan:
    """How a sweep searches its space: the strategy that proposes points, what it optimizes
    and under which constraints, its budget, the engine that runs the points and the file
    the rows stream to. A grid sweep is the default plan."""

    strategy: str = "grid"  # grid, random, tpe, nsga2 (`tirbyoc.app.sweeping.strategies`)
    objectives: tuple = ("cycles",)  # names (`tirbyoc.app.sweeping.objectives`) or Objective records
    constraints: tuple = ()  # "NAME<=VALUE" strings or Constraint records
    trials: int | None = None  # points to run (None: the whole space, a grid's default)
    seconds: float | None = None  # wall-clock budget
    engine: str = "local"  # local, dask (`tirbyoc.app.sweeping.engines`)
    jobs: int = 1  # worker processes
    address: str | None = None  # a running Dask scheduler to use instead of a local cluster
    results: str | None = None  # a JSON lines file each row is appended to (a rerun resumes)

    @property
    def serial(self) -> bool:
        """Points run one after another in this process."""
        return self.jobs <= 1 and self.engine == "local" and self.address is None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Workers:
    """How an engine's worker processes run a point: ``fn(*args, params)`` (``fn`` found by
    name there), and ``group_of(params)``: which points share a build (kept on one worker)."""

    fn: object
    args: tuple
    group_of: object = None


def search(space: SearchSpace, run, plan: SearchPlan, base, *, seed: int = 0, store: ResultsFile | None = None,
           progress=None, workers: Workers | None = None) -> SearchResult:
    """Run points of ``space`` as ``plan.strategy`` proposes them until the budget
    (``plan.trials`` points, ``plan.seconds``) or the space ends. ``run(params) -> SweepPoint``
    runs one point in this process (a serial plan); ``workers``: how the engine's workers run
    one. ``base``: the template (its variants' scratchpads, for constraints checked before a
    run); ``store``: the rows read back and appended."""
    objs = [objective(o, base.params) if isinstance(o, str) else o for o in plan.objectives]
    cons = [Constraint.parse(c) if isinstance(c, str) else c for c in plan.constraints]
    strat = make_strategy(plan.strategy, space, objs, seed)
    budget, t0 = _Budget(plan.trials, plan.seconds, space.size), time.monotonic()
    out = SearchResult([], objs, cons, 0, 0.0)
    serial, jobs = plan.serial, plan.jobs
    eng = None if serial else make_engine(plan.engine, workers.fn, workers.args, jobs, plan.address)
    try:
        while True:
            while budget.open() and (serial or eng.running < jobs):
                params = _next(strat, out, base, store, budget)
                if params is None:
                    break
                if serial:
                    _finish(out, strat, store, params, run(params), None, progress, budget)
                else:
                    eng.submit(params, workers.group_of(params) if workers.group_of is not None else None)
            if serial or eng.running == 0:
                break
            for params, point, why in eng.wait(timeout=5.0):
                _finish(out, strat, store, params, point, why, progress, budget)
    finally:
        if eng is not None:
            eng.close()
    out.seconds = time.monotonic() - t0
    return out


def _next(strat, out: SearchResult, base, results, budget) -> dict | None:
    """The next point to run, after telling the strategy about proposals that need no run
    (a constraint on the parameters or the scratchpad breaks; a row in the results file)."""
    while budget.open():
        asked = strat.ask(1)
        if not asked:
            return None
        params = asked[0]
        broken = _broken_before_run(params, out.constraints, base)
        if broken is not None:
            out.skipped.append((params, broken))
            strat.tell(params, None)
            continue
        if results is not None and params in results:
            _add(out, strat, params, SweepPoint.from_json(results.rows[point_key(params)]))
            out.resumed += 1
            budget.used += 1
            continue
        budget.used += 1
        return params
    return None


def _broken_before_run(params: dict, constraints, base) -> str | None:
    kib = None
    for c in constraints:
        if c.name in params:
            value = params[c.name]
        elif c.name == "scratchpad_kib":
            if kib is None:
                try:
                    kib = scratchpad_kib(base.variant(**params))
                except TirbyocError:  # an invalid variant: its run says why
                    return None
            value = kib
        else:
            continue
        if not c.holds(value):
            return str(c)
    return None


def _add(out: SearchResult, strat, params: dict, point: SweepPoint) -> None:
    """A finished point (run now or read back): a trial, and the strategy told its values."""
    out.points.append(point)
    out.trials += 1
    strat.tell(params, out.values(point))


def _finish(out: SearchResult, strat, results, params, point, why, progress, budget) -> None:
    if point is None:
        point = SweepPoint(params, error=why)
    _add(out, strat, params, point)
    if results is not None:
        results.add(point.to_json())
    if progress is not None:
        progress(out.trials, budget.total, point.label())


__all__ = ["SearchPlan", "SearchResult", "Workers", "search"]
