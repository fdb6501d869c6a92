"""Losing a worker on purpose: what the sweep engines' tests and benchmarks kill to show that
a point whose worker dies runs again and no row is lost or doubled."""

from __future__ import annotations

import signal


def worker_processes() -> list:
    """This process's worker processes (spawned by multiprocessing: a process pool's or a
    local Dask cluster's workers), as psutil Processes."""
    import psutil  # deferred: imported only where workers are killed

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:  # gone meanwhile
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(p)
    return out


def kill_a_worker_after(points: int, killed: list, then=None):
    """A sweep progress callback that, once ``points`` points have finished, kills one worker
    process (SIGKILL: a machine lost mid-point) and appends its pid to ``killed``; ``then``:
    a progress callback to call on every step as well."""

    def progress(done, total, label):
        if then is not None:
            then(done, total, label)
        if killed or done < points:
            return
        workers = worker_processes()
        if workers:
            workers[0].send_signal(signal.SIGKILL)
            killed.append(workers[0].pid)

    return progress


__all__ = ["kill_a_worker_after", "worker_processes"]
