"""A library call's exact size: a group re-declared for the block it computes (one call per
block, no padding), split so that a CPU's cores each run one call. `offload` resizes every
match through `exact_size` before it rewrites."""

from __future__ import annotations

import os
from dataclasses import replace

from tirbyoc._tvm import is_host_target, make_target
from tirbyoc.decl.intrinsic import AxisExtents
from tirbyoc.errors import RewriteError, TirbyocError
from tirbyoc.ir.pattern import function_blocks
from tirbyoc.matching.candidates import Candidate
from tirbyoc.matching.matcher import match_block
from tirbyoc.matching.results import Match, Mismatch

MIN_PART = 16  # a library call's share of a spatial axis is not split finer than this


def split_for_cores(axes, cores: int, multiples: dict | None = None) -> dict:
    """The extents one library call covers so that a block becomes ``cores`` calls the CPU
    schedule runs in parallel (a library call inside a PrimFunc runs on one of TVM's threads,
    single-threaded: one call for the whole block would leave the other cores idle): the
    largest spatial axis whose extent ``cores`` divides (no padding) into parts of at least
    `MIN_PART`, each a multiple of what a packed operand's tiles need along it (``multiples``:
    axis -> tile; AMX's weight: 16 output channels); the whole block where none does."""
    extents = {a.axis: a.extent for a in axes}
    multiples = multiples or {}
    if cores > 1:
        fits = [a for a in axes if a.kind == "S" and a.extent % cores == 0 and a.extent // cores >= MIN_PART
                and (a.extent // cores) % multiples.get(a.axis, 1) == 0]
        if fits:
            best = max(fits, key=lambda a: a.extent)
            extents[best.axis] = best.extent // cores
    return extents


def target_cores(target) -> int:
    """The cores code built for ``target`` runs on: its ``num-cores``, else this machine's
    (a CPU target; 1 for any other)."""
    tgt = make_target(target)
    if not is_host_target(tgt):
        return 1
    cores = tgt.attrs.get("num-cores")
    return int(cores) if cores else (os.cpu_count() or 1)


def exact_size(func, m: Match, cores: int = 1) -> Match:
    """For a group that can be re-declared for any size (a library call), the match of the
    exact-size group: one call per block, no padding (``cores`` > 1: one call per core,
    `split_for_cores`). Other matches are returned as is."""
    group = m.group
    if group is None or group.resize is None or m.intrinsic is not group.compute:
        return m
    if m.runtime_axes:
        raise RewriteError(f"{m.function}/{m.block}: axis {m.runtime_axes[0]} has a size known only at run "
                           f"time; {group.name} takes it only as a whole-function library call")
    packed = {a: t for o in m.operands if o.pack_tile for a, t in zip(o.view_axes, o.pack_tile)}
    extents = split_for_cores(m.axes, cores, packed)
    if all(not a.padding and extents[a.axis] == a.size for a in m.axes):
        return m
    if any(e == 1 for e in extents.values()):
        return m  # TVM cannot tensorize a unit-extent description loop: keep the tile match
    sizes = dict(zip(m.iters, m.iter_extents))
    fused = {a.axis: tuple(sizes.get(n) for n in a.iters) for a in m.axes if len(a.iters) > 1}
    try:
        exact = group.resize(AxisExtents(extents, fused))
    except TirbyocError as err:
        raise RewriteError(f"{m.function}/{m.block}: {group.name} cannot be declared for "
                           f"{extents}: {err}") from err
    wpat = next(p for p in function_blocks(func) if p.name == m.block)
    new = match_block(Candidate(exact.compute, exact, None), wpat, m.function)
    if isinstance(new, Mismatch) or (new.padding and not exact.resize_pads):
        why = new.message if isinstance(new, Mismatch) else "it does not cover the block exactly"
        raise RewriteError(f"{m.function}/{m.block}: the {exact.name} group does not fit: {why}")
    return replace(new, template=m.template, init=m.init)


__all__ = ["MIN_PART", "exact_size", "split_for_cores", "target_cores"]
