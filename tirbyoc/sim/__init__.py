"""`tirbyoc.sim`: the simulator that simulated templates' intrinsic implementations call.

The tile operations (GEMM, reset, ALU, DMA load/store) are C functions (``csrc/accel_sim.c``)
exported as TVM packed functions and registered as ``tirbyoc.sim.<op>``, so tensorized code
calls them directly (``T.call_packed("tirbyoc.sim.gemm", C, A, B)``), with no Python in
between. They compute the values exactly and advance a decoupled access-execute timing model
(load, compute and store units; an operation waits for its unit and for the tiles it reads
and writes). A `Simulator` holds one template's timing parameters (`SimConfig`); ``reset`` /
``stats`` bracket a run. The model and its formulas: docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tvm

from tirbyoc._tvm import s_tir, tirx
from tirbyoc.decl.extern import ExternLibrary
from tirbyoc.rewrite.functions.double_buffer import FOOTPRINT_ATTR
from tirbyoc.rewrite.block.scratchpad import scratchpad_usage

OPS = ("gemm", "fill_zero", "dma_load", "dma_store", "alu_add", "alu_max", "alu_relu",
       "alu_shift_clip", "alu_imm", "alu_tensor", "scratchpad_begin", "scratchpad_end")
CONTROL = ("configure", "reset", "stats")
SCOPES = ("input", "weight", "accumulator")  # the scope ids DMA calls pass: 0, 1, 2

LIBRARY = ExternLibrary(
    name="tirbyoc_accel_sim",
    sources=[Path(__file__).parent / "csrc" / "accel_sim.c"],
    symbols=[f"tirbyoc_sim_{op}" for op in OPS + CONTROL],
    ffi=True,
    globals={f"tirbyoc.sim.{op}": f"tirbyoc_sim_{op}" for op in OPS + CONTROL},
)
_STATS = ("cycles", "busy_load", "busy_compute", "busy_store", "load_bytes_input",
          "load_bytes_weight", "load_bytes_accumulator", "store_bytes", "tile_bytes_input",
          "tile_bytes_weight", "tile_bytes_accumulator", "gemm_ops", "alu_ops", "load_ops",
          "store_ops", "macs", "high_water_input", "high_water_weight", "high_water_accumulator")
_registered = False


def load():
    """Build the simulator library (cached) and register ``tirbyoc.sim.<op>``; returns the
    runtime module."""
    global _registered
    module = LIBRARY.runtime_module()
    if not _registered:

        for name, symbol in LIBRARY.global_names().items():
            tvm.register_global_func(name, module[symbol], override=True)
        _registered = True
    return module


def unavailable_reason() -> str | None:
    """Why the simulator cannot run here (None: it can)."""
    try:
        load()
    except Exception as err:  # noqa: BLE001 - a template asks; the answer is the reason
        return f"the simulator library cannot be built or loaded: {err}"
    return None


@dataclass(frozen=True)
class SimConfig:
    """Timing parameters of a simulated GEMM accelerator."""

    core_macs: int = 256  # MACs the GEMM core does per cycle (BATCH x BLOCK_IN x BLOCK_OUT)
    alu_lanes: int = 16  # accumulator lanes the ALU does per cycle
    dma_bytes_per_cycle: int = 8
    dma_latency: int = 64  # cycles before a DMA's first byte
    capacities: tuple = (32768, 262144, 131072)  # input, weight, accumulator scratchpads (bytes)
    clock_mhz: int = 100
    # the template's storage scopes of those three scratchpads: offloaded PrimFuncs then tell
    # the simulator what they allocate in each (high-water marks, capacity errors)
    scopes: tuple = ()

    def __post_init__(self):
        for name in ("core_macs", "alu_lanes", "dma_bytes_per_cycle", "clock_mhz"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"SimConfig.{name} must be a positive int, got {v!r}")
        if isinstance(self.dma_latency, bool) or not isinstance(self.dma_latency, int) or self.dma_latency < 0:
            raise ValueError(f"SimConfig.dma_latency must be a non-negative int, got {self.dma_latency!r}")
        caps = tuple(self.capacities)
        if len(caps) != 3 or any(not isinstance(c, int) or c <= 0 for c in caps):
            raise ValueError(f"SimConfig.capacities must be three positive byte counts, got {caps!r}")
        object.__setattr__(self, "capacities", caps)
        scopes = tuple(self.scopes)
        if scopes and (len(scopes) != 3 or not all(isinstance(x, str) for x in scopes)):
            raise ValueError(f"SimConfig.scopes must name the input, weight and accumulator scopes, got {scopes!r}")
        object.__setattr__(self, "scopes", scopes)


def config_for(scopes, **timing) -> SimConfig:
    """The `SimConfig` of a template whose input, weight and accumulator scratchpads are
    ``scopes`` (three `tirbyoc.Scope`, in that order): capacities and scope names are taken
    from them, so the simulator and the scratchpad planner cannot disagree. ``timing``: the
    other `SimConfig` fields (core_macs, alu_lanes, dma_bytes_per_cycle, dma_latency, clock_mhz)."""
    scopes = tuple(scopes)
    if len(scopes) != 3 or any(s.capacity is None for s in scopes):
        raise ValueError("config_for needs the input, weight and accumulator scopes, each with a "
                         f"capacity; got {[getattr(s, 'name', s) for s in scopes]}")
    return SimConfig(capacities=tuple(int(s.capacity) for s in scopes),
                     scopes=tuple(s.name for s in scopes), **timing)


@dataclass(frozen=True)
class SimStats:
    """One run's figures (cycles at the configured clock)."""

    config: SimConfig
    cycles: int
    busy: dict  # unit -> busy cycles
    load_bytes: dict  # scope -> bytes loaded from DRAM
    store_bytes: int
    tile_bytes: dict  # scope -> bytes of distinct scratchpad tiles written
    ops: dict  # gemm / alu / load / store -> count
    macs: int
    high_water: dict  # scope -> most bytes the running programs held at once

    @property
    def tile_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def utilization(self) -> dict:
        return {u: (b / self.cycles if self.cycles else 0.0) for u, b in self.busy.items()}

    @property
    def seconds(self) -> float:
        return self.cycles / (self.config.clock_mhz * 1e6)

    def to_json(self) -> dict:
        return {"cycles": self.cycles, "seconds": self.seconds, "busy": self.busy,
                "utilization": self.utilization, "load_bytes": self.load_bytes,
                "store_bytes": self.store_bytes, "tile_bytes": self.tile_bytes, "ops": self.ops,
                "tile_ops": self.tile_ops, "macs": self.macs, "high_water": self.high_water,
                "config": asdict(self.config)}


class Simulator:
    """The simulator as one template configures it."""

    def __init__(self, config: SimConfig | None = None):
        self.config = config or SimConfig()

    def unavailable_reason(self) -> str | None:
        return unavailable_reason()

    def configure(self) -> None:
        """Load the simulator, set this template's timing, clear all state."""

        load()
        values = np.array(self.config_values(), dtype="int64")
        tvm.get_global_func("tirbyoc.sim.configure")(tvm.runtime.tensor(values))

    def config_values(self) -> list[int]:
        """The configuration vector `configure` passes (and a deployed library is compiled
        with): core MACs, ALU lanes, DMA bytes per cycle, DMA latency, three capacities."""
        c = self.config
        return [c.core_macs, c.alu_lanes, c.dma_bytes_per_cycle, c.dma_latency, *c.capacities]

    def deploy_defines(self) -> list[str]:
        """-D flags that build the simulator with this configuration (no configure() call
        in a deployed library)."""
        return ["TIRBYOC_SIM_CONFIG=" + ",".join(str(int(v)) for v in self.config_values())]

    def reset(self) -> None:

        load()
        tvm.get_global_func("tirbyoc.sim.reset")()

    def stats(self) -> SimStats:

        load()
        out = tvm.runtime.tensor(np.zeros(len(_STATS), dtype="int64"))
        tvm.get_global_func("tirbyoc.sim.stats")(out)
        v = dict(zip(_STATS, (int(x) for x in out.numpy())))
        return SimStats(
            self.config, v["cycles"],
            {u: v[f"busy_{u}"] for u in ("load", "compute", "store")},
            {s: v[f"load_bytes_{s}"] for s in SCOPES}, v["store_bytes"],
            {s: v[f"tile_bytes_{s}"] for s in SCOPES},
            {k: v[f"{k}_ops"] for k in ("gemm", "alu", "load", "store")}, v["macs"],
            {s: v[f"high_water_{s}"] for s in SCOPES})

    def annotate(self, func, used: dict | None = None):
        """``func`` (an offloaded PrimFunc) bracketed by ``scratchpad_begin/end`` calls with the
        bytes it allocates in each scratchpad scope (read from its lowered allocations), so a
        run reports high-water marks and fails clearly past a capacity. Unchanged when the
        config names no scopes or the function allocates none. ``used``: those bytes per scope
        (`scratchpad_usage`) when the caller has already measured them."""

        if not self.config.scopes:
            return func
        used = used if used is not None else scratchpad_usage(func, list(self.config.scopes))
        if not any(used.values()):
            return func
        sizes = [tirx.const(used[s], "int64") for s in self.config.scopes]
        realize = func.body
        block = realize.block
        body = tirx.SeqStmt([tirx.Evaluate(tirx.call_packed("tirbyoc.sim.scratchpad_begin", *sizes)),
                             block.body,
                             tirx.Evaluate(tirx.call_packed("tirbyoc.sim.scratchpad_end", *sizes))])
        new = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                           block.init, block.alloc_buffers, block.match_buffers, block.annotations)
        # the calls that report the footprint, for tirbyoc's lowering to grow by what it adds
        footprint = {"calls": ["tirbyoc.sim.scratchpad_begin", "tirbyoc.sim.scratchpad_end"],
                     "scopes": list(self.config.scopes)}
        return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new)).with_attr(
            FOOTPRINT_ATTR, footprint)


__all__ = ["SCOPES", "SimConfig", "SimStats", "Simulator", "config_for", "load", "unavailable_reason"]
