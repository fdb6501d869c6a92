"""What a searched sweep minimises or maximises, each read off a finished point.

The simulator's figures (cycles, each unit's busy fraction, DMA bytes) and the template's own
size: ``scratchpad_kib``, the on-chip memory the variant declares (every scope's capacity but
DRAM's), the area proxy a hardware designer trades cycles against; or a numeric template
parameter itself, minimised (``block_out``, ``dma_bytes_per_cycle``: what the design costs). A point with no figure
for an objective (it failed, or its template is not simulated) is infeasible for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tirbyoc.errors import TirbyocError


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # "minimize" or "maximize"
    read: Callable  # (SweepPoint) -> float | None
    doc: str

    def value(self, point) -> float | None:
        v = self.read(point)
        return None if v is None else float(v)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.direction == "minimize" else a > b


def _busy(unit: str):
    return lambda p: p.utilization.get(unit) if p.utilization else None


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("cycles", "minimize", lambda p: p.cycles, "simulated cycles of the whole model"),
    Objective("compute_busy", "maximize", _busy("compute"), "fraction of cycles the GEMM core is busy"),
    Objective("load_busy", "maximize", _busy("load"), "fraction of cycles the load DMA is busy"),
    Objective("dma_bytes", "minimize", lambda p: p.dma_bytes, "bytes the DMA moves in and out"),
    Objective("scratchpad_kib", "minimize", lambda p: p.scratchpad_kib,
              "on-chip memory the variant declares, KiB (an area proxy)"),
)}


def objective(name: str, params=()) -> Objective:
    """The objective ``name``: one of `OBJECTIVES`, or a numeric template parameter among
    ``params`` to minimise (a core's width, a DMA's bandwidth: what a design costs)."""
    key = name.strip().lower()
    if key in OBJECTIVES:
        return OBJECTIVES[key]
    if key in params:
        return Objective(key, "minimize", lambda p: _number(p.params.get(key)), f"the parameter {key}")
    raise TirbyocError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}, or a template "
                       f"parameter ({', '.join(sorted(k for k in params if k != 'name'))})")


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def scratchpad_kib(template) -> float:
    """The on-chip memory ``template`` declares: every scope with a capacity, in KiB."""
    return sum(s.capacity for s in template.scopes if getattr(s, "capacity", None)) / 1024


def dominates(a: tuple, b: tuple, objectives) -> bool:
    """Whether values ``a`` are at least as good as ``b`` in every objective and better in one."""
    at_least = all(not o.better(y, x) for o, x, y in zip(objectives, a, b))
    return at_least and any(o.better(x, y) for o, x, y in zip(objectives, a, b))


def pareto_front(values: list[tuple], objectives) -> list[int]:
    """The indices of ``values`` no other value dominates (ties kept, first seen first)."""
    front = []
    for i, v in enumerate(values):
        if not any(dominates(w, v, objectives) for j, w in enumerate(values) if j != i):
            front.append(i)
    return front


__all__ = ["OBJECTIVES", "Objective", "dominates", "objective", "pareto_front", "scratchpad_kib"]
