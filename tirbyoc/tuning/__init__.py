"""MetaSchedule with tirbyoc's templates: a schedule rule built on the matcher and rewrite
engine, tuning of a model's offloadable PrimFuncs, applying the database, and runners for
simulated accelerators and remote boards.

Layering: this package uses the matcher, the rewrite engine and the Relax bridge's helpers;
the CLI uses it. ``tirbyoc.offload`` takes its database lookup as a plain callable.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "TirbyocRule": "rule", "prepare": "preparation", "prepare_module": "preparation",
    "offloadable_tasks": "tasks", "TuneTask": "tasks", "workload": "tasks",
    "tune": "tuner", "TuneResult": "tuner", "space": "tuner", "rpc_runner": "tuner",
    "tuning_target": "build", "without_tvm_intrinsic_library": "tuner",
    "SimulatorRunner": "sim_runner", "local_builder": "build",
    "tuned_schedules": "apply", "load_database": "apply",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tirbyoc.tuning' has no attribute {name!r}")

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = sorted(_LAZY)
