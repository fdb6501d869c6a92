"""The matcher: which blocks of a PrimFunc an intrinsic can compute, and why not.

For one block and one intrinsic description:

1. **Unify** the two expression trees modulo commutativity (`tirbyoc.matching.unify`): this binds
   each intrinsic operand to a workload access and checks operations and dtypes, casts
   included.
2. **Map iterators** by role. An intrinsic axis is characterised by the operands whose
   index uses it and by its kind (a GEMM's ``k`` is the reduction axis read by A and B); a
   workload iterator plays that role if it is used by the bound operands in the same way.
   Several workload iterators may play one role (conv2d's ``kh, kw, ic`` all index data and
   weights): the innermost one is used if the intrinsic's width divides it, otherwise they
   are fused (implicit GEMM). Iterators that play no role become loops around the
   intrinsic (batch axes, GEMV's rows under a dot-product intrinsic). Loop order,
   nesting and unit-extent iterators do not matter: only the block's bindings are read.
3. **Extents**: each axis records the padding it needs; a template may forbid padding.
4. **Layouts, soundly**: for every operand decide whether the implementation can read
   (or write) the workload's window in place, given the layout it declared (dense or
   row-strided, alignment). If not, the operand map says what the rewrite must do
   (transpose, pack into tiles, reindex an implicit GEMM view, pad) and gives the packing
   as an IndexMap. A match never claims in-place access the implementation cannot do.

Everything is plain data (`Match`, `AxisMap`, `OperandMap`); rewriting is elsewhere.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Sequence

from tirbyoc._tvm import IRModule, PrimFunc
from tirbyoc.decl.intrinsic import Intrinsic, Role
from tirbyoc.ir.pattern import Access, BlockPattern, block_macs, function_blocks
from tirbyoc.matching.candidates import Candidate, candidates, intrinsic_pattern
from tirbyoc.matching.casts import cast_staged
from tirbyoc.matching.operands import operand_map
from tirbyoc.matching.results import (AxisMap, BlockResult, Match, MatchStage, Mismatch, Refusals, Refused, Staging,
                                      refuse)
from tirbyoc.matching.unify import bindings


# ------------------------------------------------------------------ one pair
def _intrinsic_dims(intrin: Intrinsic, acc: Access) -> tuple[str | None, ...]:
    """Per dimension of an intrinsic operand: the axis that indexes it, or None (constant)."""
    dims = []
    for form in acc.indices:
        if form is not None and not form.terms:
            dims.append(None)
        elif form is not None and len(form.terms) == 1 and form.terms[0][1] == 1 and form.const == 0:
            dims.append(form.terms[0][0])
        else:
            raise refuse(MatchStage.STRUCTURE, f"intrinsic {intrin.name} indexes {acc.text}; the "
                                            "matcher needs one axis or a constant per dimension")
    return tuple(dims)


def _position(acc: Access, var: str) -> int:
    """How far from the innermost dimension ``var`` indexes ``acc`` (large if not at all)."""
    for d in range(len(acc.index_vars) - 1, -1, -1):
        if var in acc.index_vars[d]:
            return len(acc.index_vars) - 1 - d
    return 1 << 30


def _waste(extent: int, size: int) -> float:
    return (-(-extent // size) * size) / extent



def _with_cast_staging(m: Match, casts: dict[str, str]) -> Match:
    """``m`` with the operands read from ``casts``' buffers marked as cast in a staging copy."""
    ops = []
    for o in m.operands:
        if o.buffer in casts and not o.is_output:
            why = f"cast {o.buffer} to {casts[o.buffer]} in a staging copy"
            o = replace(o, direct=False, staging=(Staging.CAST, *o.staging),
                        reason=why if o.reason is None else f"{why}; {o.reason}")
        ops.append(o)
    return replace(m, operands=tuple(ops))


class _PairMatcher:
    """Matches one workload block against one intrinsic (all bindings; keeps the best)."""

    def __init__(self, cand: Candidate, wpat: BlockPattern, function: str, *,
                 as_epilogue: bool = False):
        self.cand = cand
        self.as_epilogue = as_epilogue  # epilogue steps run on the staged accumulator
        self.intrin = cand.intrinsic
        self.ipat = intrinsic_pattern(self.intrin)
        self.wpat = wpat
        self.function = function
        tmpl = cand.template
        self.allow_padding = getattr(tmpl, "allow_padding", True)

    def run(self, refusals: Refusals) -> Match | None:
        """The best match over every binding (raises `Refused` when the block cannot match
        at all; why each binding failed goes to ``refusals``)."""
        ipat, wpat = self.ipat, self.wpat
        if wpat.problem:
            raise refuse(MatchStage.STRUCTURE, f"block {wpat.name!r}: {wpat.problem}")
        if ipat.is_reduction and not wpat.is_reduction:
            raise refuse(MatchStage.OPERATION, f"block {wpat.name!r} is not a reduction; intrinsic reduces "
                                               f"over {', '.join(it.name for it in ipat.iters if it.kind == 'R')}")
        best = self._best(refusals)
        staged = (cast_staged(wpat) if best is None and self.intrin.role is Role.COMPUTE and not self.as_epilogue
                  else None)
        if staged is not None:  # the block as written matches no way: its casts as staging copies
            self.wpat, casts = staged
            try:
                best = self._best(Refusals())  # why these fail: the block as written says it
            finally:
                self.wpat = wpat
            best = None if best is None else _with_cast_staging(best, casts)
        return best

    def _best(self, refusals: Refusals) -> Match | None:
        best = None
        for binding in bindings(self.ipat, self.wpat, refusals):
            try:  # a branch point: a binding that fails is recorded, the next tried
                if self.intrin.role is not Role.COMPUTE and not self.as_epilogue:
                    self._check_scopes(binding)
                m = self.build(binding)
            except Refused as err:
                refusals.record(err)
                continue
            if best is None or m.score() < best.score():
                best = m
        return best

    def _check_scopes(self, binding) -> None:
        """Data-movement, init and ALU intrinsics work on fixed scopes: they apply to the
        staging blocks a rewrite creates, never to a workload block in other scopes. (Only
        a compute intrinsic's operands may be staged into its scopes.)"""
        for op in self.intrin.operands:
            wacc = binding[op.name]
            if wacc.scope != op.scope:
                raise refuse(MatchStage.OPERATION, f"block {self.wpat.name!r}: {wacc.buffer} is in scope "
                                                   f"{wacc.scope!r}; this {self.intrin.role.value} intrinsic "
                                                   f"works on {op.scope!r} (operand {op.name})")

    # -- step 2: iterators --------------------------------------------------------------
    def build(self, binding: dict[str, Access]) -> Match:
        """The match for one binding (raises `Refused` with the reason it fails)."""
        intrin, ipat, wpat = self.intrin, self.ipat, self.wpat
        iaccess: dict[str, Access] = {ipat.store.buffer: ipat.store}
        for acc in ipat.loads:
            iaccess.setdefault(acc.buffer, acc)
        idims = {name: _intrinsic_dims(intrin, acc) for name, acc in iaccess.items()}
        live = [it for it in wpat.iters if it.extent != 1]
        chosen = self._assign_roles(binding, iaccess, idims, live)
        axes_out = self._axis_maps(chosen)
        used = {n for names in chosen.values() for n in names}
        outer = tuple(it.name for it in live if it.name not in used)
        operands = tuple(operand_map(op, idims[op.name], binding[op.name], {a.axis: a for a in axes_out},
                                     is_output=op.name == ipat.store.buffer)
                         for op in intrin.operands)
        return Match(
            function=self.function, block=wpat.name, intrinsic=intrin, group=self.cand.group,
            template=getattr(self.cand.template, "name", None),
            iters=tuple(it.name for it in wpat.iters), iter_extents=tuple(it.extent for it in wpat.iters),
            axes=tuple(axes_out), outer=outer, operands=operands, macs=_block_size(wpat),
            init="in-block" if wpat.init_value is not None else None,
        )

    def _assign_roles(self, binding, iaccess, idims, live) -> dict[str, tuple[str, ...]]:
        """intrinsic axis -> the workload iterators that play its role. Intrinsic axes that
        share a role (copies and elementwise ops: every operand uses every axis) are resolved
        by dimension order."""
        ipat, wpat = self.ipat, self.wpat
        axis_sig = {it.name: frozenset(n for n, dims in idims.items() if it.name in dims) for it in ipat.iters}
        axis_size = {it.name: it.extent for it in ipat.iters}
        wsig = {it.name: frozenset(n for n, acc in binding.items() if it.name in acc.vars) for it in live}
        groups: dict[tuple, list[str]] = {}
        for it in ipat.iters:
            groups.setdefault((axis_sig[it.name], it.kind), []).append(it.name)
        chosen: dict[str, tuple[str, ...]] = {}
        for (sig, kind), axes in groups.items():
            cands = [it for it in live if wsig[it.name] == sig and it.kind == kind]
            ref = self._reference(sig)
            axes = sorted(axes, key=lambda a: _position(iaccess[ref], a))  # innermost first
            cands = sorted(cands, key=lambda it: (_position(binding[ref], it.name), -wpat.iters.index(it)))
            if len(axes) == 1:
                chosen[axes[0]] = self._choose(axes[0], axis_size[axes[0]], cands)
            else:
                for a, it in zip(axes, cands):
                    chosen[a] = (it.name,)
                for a in axes[len(cands):]:
                    chosen[a] = ()
            for a in axes:
                if not chosen[a]:
                    self._check_absent(a, kind, sig, wsig)
        if not any(chosen.values()):
            raise refuse(MatchStage.ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                                f"any intrinsic axis ({self._roles(wsig)})")
        return chosen

    def _axis_maps(self, chosen: dict[str, tuple[str, ...]]) -> list[AxisMap]:
        """One `AxisMap` per intrinsic axis: static extents or run-time ones
        (`_run_time_axis`), padding only where allowed, and no axis without an iterator (it
        cannot be padded from nothing)."""
        wpat = self.wpat
        extents = {it.name: it.extent for it in wpat.iters}
        axes_out = []
        for it in self.ipat.iters:
            names = chosen[it.name]
            sym = [n for n in names if extents[n] is None]
            if sym:
                axes_out.append(self._run_time_axis(it, names, sym[0]))
                continue
            extent = prod(extents[n] for n in names) if names else 1
            amap = AxisMap(it.name, it.kind, it.extent, names, extent)
            if amap.pads and not self.allow_padding:
                what = "reduction" if it.kind == "R" else "spatial"
                rel = f"< {it.extent}" if extent < it.extent else f"is not a multiple of {it.extent}"
                raise refuse(MatchStage.EXTENT, f"block {wpat.name!r}: {what} axis {it.name} "
                                                 f"({'*'.join(names) or 'absent'}) has extent {extent} {rel} "
                                                 "and the template forbids padding",
                              iterator=it.name, expected=f"a multiple of {it.extent}", found=str(extent))
            axes_out.append(amap)
        absent = [a for a in axes_out if not a.iters and a.size > 1]
        if absent:
            # The rewrite would need a broadcast dimension in the operands that TVM's reindex
            # cannot add; reporting this as a match would promise an offload that never comes.
            a = absent[0]
            raise refuse(MatchStage.ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                                f"intrinsic axis {a.axis} (size {a.size}; e.g. a GEMV "
                                                "under a GEMM intrinsic); it cannot be padded from "
                                                "nothing - declare an intrinsic without that axis",
                          iterator=a.axis)
        return axes_out

    def _run_time_axis(self, it, names: tuple[str, ...], sym: str) -> AxisMap:
        """The `AxisMap` of an intrinsic axis whose iterator's extent is known only at run
        time: an any-size kernel takes it whole; a tile intrinsic's is padded to a multiple
        of its width when the function runs (``pad_einsum`` with a symbolic extent), where
        the template allows padding. (`_choose` never fuses an iterator of run-time extent.)"""
        where = f"block {self.wpat.name!r}: iterator {sym} (axis {it.name}) has a symbolic extent"
        if self._takes_any_size():  # the kernel reads it at run time
            return AxisMap(it.name, it.kind, it.extent, names, None, kernel_sized=True)
        if it.extent > 1 and not self.allow_padding:
            raise refuse(MatchStage.EXTENT, f"{where}; the template forbids padding, so the "
                                             f"intrinsic's {it.extent}-wide axis needs a static multiple of {it.extent}",
                          iterator=sym, expected=f"a static multiple of {it.extent}", found="symbolic")
        return AxisMap(it.name, it.kind, it.extent, names, None)

    def _takes_any_size(self) -> bool:
        """Whether the intrinsic is a library kernel re-declared for any size (``resize``),
        which reads its extents from its arguments at run time."""
        group = self.cand.group
        return group is not None and group.resize is not None and self.intrin is group.compute

    def _reference(self, sig: frozenset) -> str:
        """The operand whose dimension order decides among iterators of one role."""
        store = self.ipat.store.buffer
        if store in sig:
            return store
        for acc in self.ipat.loads:
            if acc.buffer in sig:
                return acc.buffer
        return store

    def _choose(self, axis: str, size: int, cands: list) -> tuple[str, ...]:
        """One iterator (innermost first) if the width divides it, else fuse all of them."""
        if not cands:
            return ()
        primary = cands[0]
        if len(cands) == 1 or (primary.extent is not None and primary.extent % size == 0):
            return (primary.name,)
        if any(c.extent is None for c in cands):
            return (primary.name,)
        fused_extent = prod(c.extent for c in cands)
        if _waste(fused_extent, size) < _waste(primary.extent, size):
            # outermost first as the operand that decides lays them out (an NHWC input's
            # kh, kw, c): the copy that fuses them then reads and writes along its rows
            return tuple(c.name for c in reversed(cands))
        return (primary.name,)

    def _check_absent(self, axis: str, kind: str, sig: frozenset, wsig: dict) -> None:
        wpat = self.wpat
        if kind == "R" and not wpat.is_reduction:
            raise refuse(MatchStage.ITERATORS, f"block {wpat.name!r} has no reduction for axis {axis}",
                          iterator=axis)
        if not self.allow_padding:
            raise refuse(MatchStage.ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                            f"{'reduction' if kind == 'R' else 'spatial'} axis {axis} "
                                            f"(used by {', '.join(sorted(sig))}); {self._roles(wsig)}")

    def _roles(self, wsig: dict) -> str:
        rows = []
        for it in self.wpat.iters:
            if it.name in wsig:
                used = ",".join(sorted(wsig[it.name])) or "none"
                rows.append(f"{it.name}({it.kind}) uses {used}")
        return "; ".join(rows) or "the block has no non-unit iterators"

def _block_size(wpat: BlockPattern) -> int | None:
    ext = [it.extent for it in wpat.iters]
    return None if any(e is None for e in ext) else prod(ext)


# ------------------------------------------------------------------ public API
def prim_functions(func_or_mod) -> list[tuple[str, object]]:
    """(name, PrimFunc) for a PrimFunc or each PrimFunc of an IRModule."""
    if isinstance(func_or_mod, PrimFunc):
        attrs = func_or_mod.attrs
        name = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        return [(name, func_or_mod)]
    if isinstance(func_or_mod, IRModule):
        return [(gv.name_hint, f) for gv, f in func_or_mod.functions.items() if isinstance(f, PrimFunc)]
    raise TypeError(f"expected a tirx.PrimFunc or an IRModule, got {type(func_or_mod).__name__}")


def _separate_init(blocks: Sequence[BlockPattern], index: int) -> str | None:
    target = blocks[index].store
    for prev in reversed(blocks[:index]):
        if prev.store is not None and prev.store.buffer == target.buffer and not prev.is_reduction \
                and prev.value is not None and prev.value[0] in ("const", "cast") and not prev.loads:
            return prev.name
    return None


def match_block(candidate: Candidate, block: BlockPattern, function: str, *,
                as_epilogue: bool = False) -> Match | Mismatch:
    """The best match of one candidate intrinsic on one block (read by
    `tirbyoc.ir.pattern.function_blocks`), or the most specific reason it does not match.
    Never raises on a workload. ``as_epilogue``: the block is an epilogue step run on the
    staged accumulator (scopes are not checked)."""
    refusals = Refusals()
    try:
        found = _PairMatcher(candidate, block, function, as_epilogue=as_epilogue).run(refusals)
    except Refused as err:
        refusals.record(err)
        found = None
    if found is not None:
        return found
    return refusals.most_specific(Mismatch(MatchStage.NONE, f"block {block.name!r} does not match"))


def explain(func_or_mod, targets) -> list[BlockResult]:
    """For every block of every PrimFunc: its matches, best first, or why none matched."""
    cands = candidates(targets)
    runs_here = {c.template.name: c.template.runs_here() for c in cands if c.template is not None}
    results = []
    for fname, func in prim_functions(func_or_mod):
        blocks = function_blocks(func)
        macs = block_macs(func)
        for i, wpat in enumerate(blocks):
            matches, mismatches = [], []
            for cand in cands:
                m = match_block(cand, wpat, fname)
                if isinstance(m, Mismatch):
                    mismatches.append(replace(m, intrinsic=cand.intrinsic.name,
                                              compute=cand.intrinsic.role is Role.COMPUTE))
                    continue
                if m.init is None and wpat.is_reduction:
                    init = _separate_init(blocks, i)
                    if init:
                        m = replace(m, init=init)
                matches.append(m)
            matches.sort(key=lambda m: (_role_rank(m.intrinsic), m.score(), not runs_here.get(m.template, True)))
            results.append(BlockResult(fname, wpat.name, macs.get(wpat.name, 0), tuple(matches),
                                       tuple(mismatches)))
    return results


def match(func_or_mod, targets) -> list[Match]:
    """Every (block, intrinsic) match in a PrimFunc or IRModule, best first within a block."""
    return [m for r in explain(func_or_mod, targets) for m in r.matches]


def _role_rank(intrin: Intrinsic) -> int:
    return 0 if intrin.role is Role.COMPUTE else 1


__all__ = ["explain", "match", "match_block", "prim_functions"]
