"""Scratchpad tiling: how many intrinsic tiles each scratchpad holds, and proof it fits.

A VTA-style accelerator computes only on operands held in small on-chip scratchpads that DMA
fills from DRAM and drains back. The rewrite groups intrinsic tiles into scratchpad tiles
(``factors``: intrinsic tiles per scratchpad tile, per intrinsic axis) and loads each
operand's scratchpad tile once per trip of the loops around it:

    for outer loops, spatial scratchpad tiles:          # the output tile stays in the acc
        acc = 0
        for reduction scratchpad tiles:
            DMA-load each input's scratchpad tile
            for intrinsic tiles inside: compute
        DMA-store the output tile

`plan_tiles` chooses the factors that move the fewest bytes while every scope's footprint
(the sum of the tiles placed in it, each rounded up to the scope's alignment) stays within
its capacity; `scratchpad_usage` reads the allocations back from the lowered IR so a test can
check the plan against what TVM actually allocates.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

from tirbyoc._tvm import iter_blocks, s_tir, tvm
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.errors import RewriteError


@dataclass(frozen=True)
class TileAxis:
    """One axis to tile: its name, the intrinsic's extent along it (1 for a loop around the
    intrinsic, e.g. VTA's rows when its batch is 1), how many such tiles the (padded)
    workload has, and whether it is a reduction."""

    name: str
    size: int
    tiles: int
    reduce: bool


@dataclass(frozen=True)
class TileOperand:
    """One operand staged in a scratchpad: which axes index it, element type, scope."""

    name: str
    scope: str
    axes: tuple[str, ...]
    dtype: str
    is_output: bool


@dataclass(frozen=True)
class TilePlan:
    factors: dict  # axis -> intrinsic tiles per scratchpad tile
    footprint: dict  # scope -> bytes the tiles occupy
    capacity: dict  # scope -> bytes available
    bytes_moved: int  # DMA traffic of the whole block
    transfers: int  # scratchpad-tile transfers

    def describe(self, used: dict | None = None) -> str:
        """In words; ``used``: the bytes actually allocated per scope, if measured."""
        used = used or self.footprint
        tiles = ", ".join((f"{f} iterations of {a}" if a.startswith("loop ") else f"{f} {a} tiles")
                          for a, f in self.factors.items() if f > 1) or "one intrinsic tile"
        use = ", ".join(f"{s} {used[s]}/{self.capacity[s]} B" for s in self.footprint)
        return f"scratchpad tile of {tiles} ({use}; {self.bytes_moved} B moved by DMA)"


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tile_bytes(op: TileOperand, axes: dict, factors: dict) -> int:
    return prod(factors[a] * axes[a].size for a in op.axes) * dtype_bytes(op.dtype)


def rank_tiles(axes: list[TileAxis], operands: list[TileOperand], capacity: dict,
               alignment: dict | None = None, where: str = "") -> list[TilePlan]:
    """Every scratchpad tiling that fits every scope by this estimate, least DMA traffic
    first (ties: fewer transfers, i.e. bigger tiles and less per-transfer latency).

    Traffic: an input's tile is loaded once per trip of every loop around it (spatial and
    reduction scratchpad tiles); the output's tile is stored once per spatial tile. The
    estimate is exact for tiles addressed by plain iterators; the rewrite checks the real
    allocation (`scratchpad_usage`) and moves down this list when a window (a strided conv
    input) needs more. Raises `RewriteError` with the numbers when even one intrinsic tile
    per operand does not fit.
    """
    alignment = alignment or {}
    by_name = {a.name: a for a in axes}
    scopes = sorted({op.scope for op in operands})
    ranked = []
    for combo in product(*[_divisors(a.tiles) for a in axes]):
        factors = dict(zip((a.name for a in axes), combo))
        use = dict.fromkeys(scopes, 0)
        for op in operands:
            use[op.scope] += _round_up(tile_bytes(op, by_name, factors), alignment.get(op.scope, 1))
        if any(use[s] > capacity[s] for s in scopes):
            continue
        spatial_trips = prod(a.tiles // factors[a.name] for a in axes if not a.reduce)
        all_trips = spatial_trips * prod(a.tiles // factors[a.name] for a in axes if a.reduce)
        moved = transfers = 0
        for op in operands:
            trips = spatial_trips if op.is_output else all_trips
            moved += trips * tile_bytes(op, by_name, factors)
            transfers += trips
        ranked.append(((moved, transfers), TilePlan(factors, use, {s: capacity[s] for s in scopes},
                                                    moved, transfers)))
    if not ranked:
        ones = dict.fromkeys(by_name, 1)
        need = dict.fromkeys(scopes, 0)
        for op in operands:
            need[op.scope] += _round_up(tile_bytes(op, by_name, ones), alignment.get(op.scope, 1))
        worst = [s for s in scopes if need[s] > capacity[s]]
        numbers = "; ".join(f"{s} needs {need[s]} bytes for one intrinsic tile of "
                            + " + ".join(f"{op.name} {tile_bytes(op, by_name, ones)}"
                                         for op in operands if op.scope == s)
                            + (f" (each rounded up to {alignment[s]}-byte alignment)"
                               if alignment.get(s, 1) > 1 else "")
                            + f", has {capacity[s]}" for s in worst)
        raise RewriteError(f"{where}: no scratchpad tiling fits: {numbers}. Enlarge the scope "
                           "or declare a smaller intrinsic.")
    ranked.sort(key=lambda kp: kp[0])
    return [plan for _, plan in ranked]


def plan_tiles(axes, operands, capacity, alignment=None, where: str = "") -> TilePlan:
    """The scratchpad tiling with the least DMA traffic that fits (`rank_tiles`' first)."""
    return rank_tiles(axes, operands, capacity, alignment, where)[0]


def scratchpad_usage(func, scopes) -> dict:
    """Bytes allocated per scope in ``func`` after TVM's own buffer compaction (the
    allocation a build makes): ``{scope: bytes}`` for each scope in ``scopes``."""

    mod = tvm.IRModule({"main": func})
    mod = s_tir.transform.LowerInitBlock()(mod)
    mod = s_tir.transform.PlanAndUpdateBufferAllocationLocation()(mod)
    mod = s_tir.transform.ConvertBlocksToOpaque()(mod)
    mod = s_tir.transform.CompactBufferAllocation()(mod)
    used = dict.fromkeys(scopes, 0)
    for block in iter_blocks(mod["main"].body):
        for buf in block.alloc_buffers:
            scope = str(buf.scope())
            if scope in used:
                used[scope] += prod(int(s) for s in buf.shape) * dtype_bytes(str(buf.dtype))
    return used


__all__ = ["TileAxis", "TileOperand", "TilePlan", "plan_tiles", "rank_tiles", "scratchpad_usage", "tile_bytes"]
