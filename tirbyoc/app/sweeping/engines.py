"""Where a sweep's points run: worker processes on this machine, or a Dask cluster.

An engine runs ``fn(*args, params)`` for each point it is given (``group``: points that share
a build, which an engine whose workers outlive a point sends to one worker) and hands back finished
points as they finish (`wait`), never one twice: a point whose worker dies is run again
elsewhere (Dask reschedules it; the local pool is restarted and its unfinished points
resubmitted), and after `RETRIES` deaths its row says so. **A new engine** (Ray, a batch
queue) is a class with ``submit(params, group)``, ``wait(timeout)``, ``running`` and ``close()``
in `ENGINES`.

``local`` (the default): ``jobs`` spawned processes, one point per process (its own TVM
state), the machine's threads divided among them. ``dask``: a `distributed.LocalCluster` of
``jobs`` single-threaded worker processes started here, or the running cluster at
``address`` (``tcp://host:8786``), whose workers need tirbyoc installed.
"""

from __future__ import annotations

import multiprocessing
import os
import zlib
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from tirbyoc.errors import TirbyocError

RETRIES = 3  # runs of a point after the first, when workers die under it


@contextmanager
def threads_per_worker(jobs: int):
    """``TVM_NUM_THREADS`` for workers started inside: this machine's cores divided among them."""
    saved = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = saved


class LocalEngine:
    """Spawned worker processes (`ProcessPoolExecutor`), one point per process."""

    def __init__(self, fn, args: tuple, jobs: int, address: str | None = None):
        if address is not None:
            raise TirbyocError("--address joins a cluster: use it with --engine dask")
        self.fn, self.args, self.jobs = fn, args, max(1, jobs)
        self.futures: dict = {}  # future -> (params, deaths)
        self.pool = self._pool()

    def _pool(self):
        with threads_per_worker(self.jobs):
            return ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                       max_tasks_per_child=1)

    def submit(self, params: dict, group: str | None = None, deaths: int = 0) -> None:
        """Run ``params`` (``group`` is for engines whose workers outlive a point)."""
        self.futures[self.pool.submit(self.fn, *self.args, params)] = (params, deaths)

    def wait(self, timeout: float | None = None) -> list[tuple[dict, object, str | None]]:
        """Finished points: (params, result or None, why it has none)."""
        done, _ = wait_futures(list(self.futures), timeout=timeout, return_when=FIRST_COMPLETED)
        out, broken = [], False
        for future in done:
            params, deaths = self.futures[future]
            try:
                out.append((params, future.result(), None))
                del self.futures[future]
            except BrokenProcessPool:
                broken = True
        if broken:
            # a worker died: the pool is gone with every point in flight, none of which
            # finished; each runs again in a new pool (which one killed it is not known)
            again = list(self.futures.values())
            self.futures.clear()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = self._pool()
            for params, deaths in again:
                if deaths >= RETRIES:
                    out.append((params, None, f"its worker process died {deaths + 1} times"))
                else:
                    self.submit(params, deaths=deaths + 1)
        return out

    @property
    def running(self) -> int:
        return len(self.futures)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class DaskEngine:
    """A Dask cluster: a local one of ``jobs`` worker processes, or the one at ``address``."""

    def __init__(self, fn, args: tuple, jobs: int, address: str | None = None):
        try:
            import distributed  # deferred: an optional dependency (the cluster extra)
        except ImportError:
            raise TirbyocError("--engine dask needs Dask: pip install 'tirbyoc[cluster]'") from None
        self.distributed, self.fn, self.args = distributed, fn, args
        self.cluster = None
        if address is None:
            with threads_per_worker(jobs):
                self.cluster = distributed.LocalCluster(n_workers=max(1, jobs), threads_per_worker=1,
                                                        processes=True, dashboard_address=None)
            address = self.cluster.scheduler_address
        self.client = distributed.Client(address)
        if self.cluster is not None:
            self.client.wait_for_workers(max(1, jobs), timeout=120)
        self.futures: dict = {}  # future -> (params, group)
        self.homes: dict = {}  # group -> the name of the worker that builds its code

    def _scheduler_view(self) -> tuple[list, set]:
        """(the live workers' names as the scheduler knows them - a local cluster's are 0, 1,
        ...; a nanny restarts a killed worker under its old name - and the keys of the tasks
        it holds as ``no-worker``), in one round trip."""
        names, stuck = self.client.run_on_scheduler(lambda dask_scheduler: (
            [w.name for w in dask_scheduler.workers.values()],
            [str(k) for k, ts in dask_scheduler.tasks.items() if ts.state == "no-worker"]))
        return sorted(names, key=str), set(stuck)

    def submit(self, params: dict, group: str | None = None) -> None:
        """Run ``params``; points of one ``group`` (the same code: `tirbyoc.app.sweeping.sweep.code_key`)
        run on one worker, named strictly (no fallback, so that the scheduler's work stealing
        cannot move them), so that it builds that code once. The scheduler's allowed_failures
        (3 by default) re-runs a point whose worker died: a local cluster's nanny restarts the
        worker under the same name; a point pinned to a worker that left for good is moved
        (`wait`)."""
        placed = {}
        if group is not None:
            names = self._scheduler_view()[0]
            if group not in self.homes or self.homes[group] not in names:
                self.homes[group] = names[zlib.crc32(group.encode()) % len(names)] if names else None
            if self.homes[group] is not None:
                placed = {"workers": [self.homes[group]], "allow_other_workers": False}
        future = self.client.submit(self.fn, *self.args, params, pure=False, **placed)
        self.futures[future] = (params, group)

    def _move_orphans(self) -> None:
        """Resubmit the pending points that no live worker may run: pinned to a worker that
        left, or to one that died and came back (the scheduler resolved the name to the old
        worker's address, so the restarted worker does not take them: they wait as
        ``no-worker`` forever)."""
        names, stuck = self._scheduler_view()
        orphans = [(f, p, g) for f, (p, g) in self.futures.items() if g is not None and f.status == "pending"
                   and (self.homes.get(g) not in names or str(f.key) in stuck)]
        for future, params, group in orphans:
            del self.futures[future]
            future.cancel()
            self.homes.pop(group, None)
            self.submit(params, group)

    def wait(self, timeout: float | None = None) -> list[tuple[dict, object, str | None]]:
        try:
            done, _ = self.distributed.wait(list(self.futures), timeout=timeout, return_when="FIRST_COMPLETED")
        except self.distributed.TimeoutError:
            self._move_orphans()
            return []
        out = []
        for future in done:
            params, _ = self.futures.pop(future)
            try:
                out.append((params, future.result(), None))
            except self.distributed.KilledWorker as err:
                out.append((params, None, f"its workers died running it ({err})"))
        return out

    @property
    def running(self) -> int:
        return len(self.futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


ENGINES = {"local": LocalEngine, "dask": DaskEngine}


def engine(name: str, fn, args: tuple, jobs: int, address: str | None = None):
    try:
        make = ENGINES[name]
    except KeyError:
        raise TirbyocError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}") from None
    return make(fn, args, jobs, address)


__all__ = ["DaskEngine", "ENGINES", "LocalEngine", "RETRIES", "engine", "threads_per_worker"]
