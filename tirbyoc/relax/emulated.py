"""A model whose offloaded PrimFuncs run in an emulator while the rest runs on this CPU.

Hexagon code cannot run in this process, but each offloaded PrimFunc can run under
qemu-hexagon (`tirbyoc.offloading.hexagon`). `emulate_offloaded` turns every
``R.call_tir(f, args, out)`` of an offloaded ``f`` into ``R.call_dps_packed`` of a packed
function that runs ``f``'s Hexagon build under QEMU on the very tensors the model passes;
the PrimFunc leaves the module, and everything else is built for the host as usual. The
model's output then checks the offload end to end, on the model's own intermediate values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tirbyoc._tvm import make_target, relax, tvm
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading import hexagon
from tirbyoc.offloading.devices import HEXAGON, device_of
from tirbyoc.relax.bridge import replace_call_tir

PREFIX = "tirbyoc.emulated."


@dataclass
class EmulatedRuns:
    """What the emulator did during one model run: calls per PrimFunc, seconds in QEMU, the
    largest VTCM high-water mark."""

    emulator: str
    target: dict
    calls: dict = field(default_factory=dict)
    seconds: float = 0.0
    vtcm_high_water: int = 0

    def to_json(self) -> dict:
        return {"emulator": self.emulator, "target": self.target, "calls": self.calls,
                "seconds": self.seconds, "vtcm_high_water": self.vtcm_high_water}


def _register(name: str, func, target, capacities: dict, runs: EmulatedRuns) -> str:
    """A packed function ``PREFIX + name`` that runs ``func`` under QEMU on its arguments
    (inputs then outputs, as ``call_tir`` passes them) and writes the outputs back."""
    symbol = PREFIX + name
    vtcm = capacities.get(hexagon.VTCM) or hexagon.DEFAULT_VTCM_BYTES

    def run(*tensors):
        arrays = [t.numpy() for t in tensors]
        done = hexagon.run(func, target, arrays, vtcm)
        for tensor, before, after in zip(tensors, arrays, done.arrays):
            if not (before == after).all():
                tensor.copyfrom(after)
        runs.calls[name] = runs.calls.get(name, 0) + 1
        runs.seconds += done.seconds
        runs.vtcm_high_water = max(runs.vtcm_high_water, done.vtcm_high_water)

    tvm.register_global_func(symbol, run, override=True)
    return symbol


def emulate_offloaded(mod, names, target, capacities: dict | None = None):
    """(``mod`` with the PrimFuncs ``names`` run under the emulator for ``target``, the
    `EmulatedRuns` that fills in as the model runs). A PrimFunc called with symbolic shape
    arguments cannot be emulated: a `TirbyocError` says which."""
    if device_of(target) is not HEXAGON:  # the one emulated device whose runs it counts (VTCM, seconds)
        raise TirbyocError(f"no emulator runs code for {target}; tirbyoc emulates Hexagon only")
    runs = EmulatedRuns(hexagon.emulator_name(target), json.loads(str(make_target(target))))
    symbols = {gv: _register(gv.name_hint, mod[gv], target, capacities or {}, runs)
               for gv in mod.functions if gv.name_hint in set(names)}

    def to_emulator(op):
        if len(op.args) != 2:
            raise TirbyocError(f"{op.args[0].name_hint} is called with symbolic shape "
                               "arguments, which the emulated run cannot pass")
        return relax.call_dps_packed(relax.ExternFunc(symbols[op.args[0]]), op.args[1],
                                     op.ty_args[0] if len(op.ty_args) == 1 else op.ty_args)

    return replace_call_tir(mod, symbols, to_emulator), runs


__all__ = ["EmulatedRuns", "emulate_offloaded"]
