"""How a searched sweep picks its next points: the grid in order, random draws, or a
model-based search (Optuna's TPE for one objective, NSGA-II for several).

A strategy is asked for points (`ask`) and told each finished point's objective values
(`tell`: None where the point failed or broke a constraint); it never proposes a point
twice. Every strategy draws from the same finite space (`SearchSpace`), so each point it
runs is a grid point with the grid's row. **A new strategy** is a class with ``ask(n)`` and
``tell(params, values)`` registered in `STRATEGIES`.
"""

from __future__ import annotations

import random

from tirbyoc.app.sweeping.search_space import SearchSpace, point_key
from tirbyoc.errors import TirbyocError


class GridStrategy:
    """Every point, in grid order (today's sweep)."""

    def __init__(self, space: SearchSpace, objectives, seed: int = 0):
        self.todo = space.grid()

    def ask(self, n: int) -> list[dict]:
        out, self.todo = self.todo[:n], self.todo[n:]
        return out

    def tell(self, params: dict, values) -> None:
        pass


class RandomStrategy(GridStrategy):
    """Grid points in a seeded random order (sampling without replacement)."""

    def __init__(self, space: SearchSpace, objectives, seed: int = 0):
        super().__init__(space, objectives, seed)
        random.Random(seed).shuffle(self.todo)


class OptunaStrategy:
    """Optuna's ask-and-tell: TPE with one objective, NSGA-II with several. A parameter of
    numbers is searched by its values' rank (an ordered integer index, so TPE models
    "larger is better"), any other as a categorical choice. A proposal already run is told
    its known values at once and not run again."""

    MAX_REPEATS = 200  # proposals in a row that were all run before: the search has converged

    def __init__(self, space: SearchSpace, objectives, seed: int = 0, sampler: str = "tpe"):
        try:
            import optuna  # deferred: an optional dependency (the search extra)
        except ImportError:
            raise TirbyocError("a model-based search needs Optuna: pip install 'tirbyoc[search]'") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna, self.space, self.objectives = optuna, space, list(objectives)
        many = len(self.objectives) > 1
        if sampler == "tpe":
            made = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
        else:
            made = optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
        directions = [o.direction for o in self.objectives]
        self.study = optuna.create_study(directions=directions if many else None,
                                         direction=None if many else directions[0], sampler=made)
        self.dists = {name: self._distribution(values) for name, values in space.params.items()}
        self.known: dict[str, tuple | None] = {}
        self.pending: dict[str, list] = {}
        self.left = space.size

    def _distribution(self, values: list):
        d = self.optuna.distributions
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return d.IntDistribution(0, len(values) - 1)
        return d.CategoricalDistribution(list(range(len(values))))

    def _params(self, trial) -> dict:
        return {n: self.space.params[n][int(trial.params[n])] for n in self.space.params}

    def ask(self, n: int) -> list[dict]:
        out, repeats = [], 0
        while len(out) < n and self.left > 0 and repeats < self.MAX_REPEATS:
            trial = self.study.ask(self.dists)
            params = self._params(trial)
            key = point_key(params)
            if key in self.known or key in self.pending:
                repeats += 1
                if key in self.known:
                    self._tell(trial, self.known[key])
                else:  # running now: its values come later
                    self.pending[key].append(trial)
                continue
            self.pending[key] = [trial]
            self.left -= 1
            out.append(params)
        return out

    def tell(self, params: dict, values) -> None:
        key = point_key(params)
        self.known[key] = values
        for trial in self.pending.pop(key, []):
            self._tell(trial, values)

    def _tell(self, trial, values) -> None:
        if values is None:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, list(values) if len(values) > 1 else values[0])


def _tpe(space, objectives, seed):
    return OptunaStrategy(space, objectives, seed, "tpe" if len(objectives) == 1 else "nsga2")


def _nsga2(space, objectives, seed):
    return OptunaStrategy(space, objectives, seed, "nsga2")


STRATEGIES = {"grid": GridStrategy, "random": RandomStrategy, "tpe": _tpe, "nsga2": _nsga2}


def strategy(name: str, space: SearchSpace, objectives, seed: int = 0):
    """The strategy ``name`` over ``space`` (see `STRATEGIES`)."""
    try:
        make = STRATEGIES[name]
    except KeyError:
        raise TirbyocError(f"unknown search {name!r}; known: {', '.join(STRATEGIES)}") from None
    return make(space, objectives, seed)


__all__ = ["GridStrategy", "OptunaStrategy", "RandomStrategy", "STRATEGIES", "strategy"]
