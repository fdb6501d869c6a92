"""`tirbyoc run --profile`: each offloaded PrimFunc built and timed alone, untouched and
offloaded (TVM 0.27's Relax VM has no per-call profiler)."""

from __future__ import annotations

import numpy as np

from tirbyoc._tvm import tirx, tvm
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.devices import device_of
from tirbyoc.offloading.verification import compile_func, concrete_params, make_inputs, specialize_symbolic


def time_function(func, target, repeat: int, seed: int = 0) -> float:
    """Milliseconds per call of one PrimFunc built for ``target``, on seeded inputs in its
    domain (the best of 3 measurements of ``repeat`` calls), on the target's device (a GPU
    function not scheduled yet is scheduled as TVM's default GPU pipeline would)."""
    arrays = make_inputs(func, concrete_params(func), None, seed)
    device = device_of(target)
    func = device.as_default_built(func, target)
    exe = compile_func(func, target, "timed")
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"
    dev = device.runtime_device()
    timer = exe.mod.time_evaluator(name, dev, number=max(1, repeat), repeat=3)
    return float(np.min(timer(*[tvm.runtime.tensor(a, dev) for a in arrays]).results)) * 1e3


def at_sizes(func, sizes: dict | None):
    """``func`` with its symbolic extents bound to ``sizes`` (a dynamic model's run sizes), so
    that it can be timed alone; as it is when it has none or no sizes are given."""
    return specialize_symbolic([func], sizes)[0] if sizes else func  # unchanged without symbolic extents


def profile_functions(mod, offloaded, report, target, repeat: int, progress=None, sizes: dict | None = None) -> None:
    """Per offloaded PrimFunc of ``report``: milliseconds per call of TVM's build of the
    untouched function (in ``mod``) and of the offloaded one (in ``offloaded``), each built and
    timed alone (``FunctionReport.ms``). A function that became a library call
    (``call_dps_packed``) has no PrimFunc left to time alone. ``sizes``: a dynamic model's
    first run sizes (``{name: size}``), each function of symbolic extents timed at them."""
    names = {g.name_hint for g in offloaded.get_global_vars()}
    todo = [f for f in report.functions if f.offloaded and not f.extern]
    for n, f in enumerate(todo):
        if progress is not None:
            progress(n, len(todo), f.name)
        new = offloaded[f.name] if f.name in names else None
        if not isinstance(new, tirx.PrimFunc):
            continue
        try:
            f.ms = {"tvm": time_function(at_sizes(mod[f.name], sizes), target, repeat),
                    "offloaded": time_function(at_sizes(new, sizes), target, repeat)}
        except TirbyocError as err:
            f.ms = {"error": str(err)}
    if progress is not None:
        progress(len(todo), len(todo), "")


__all__ = ["at_sizes", "profile_functions", "time_function"]
