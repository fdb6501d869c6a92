"""The matcher: which blocks of a PrimFunc an intrinsic can compute, and why not.

For one block and one intrinsic description:

1. **Unify** the two expression trees modulo commutativity (`tirbyoc.unify`): this binds
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

import weakref
from dataclasses import dataclass, field
from math import prod
from typing import Iterable, Sequence

from .dtypes import dtype_bytes
from .intrinsic import Intrinsic, IntrinsicGroup, Role
from .pattern import Access, BlockPattern, block_macs, function_blocks, read_block
from .unify import (
    STAGE_DTYPE,
    STAGE_EXTENT,
    STAGE_ITERATORS,
    STAGE_OPERATION,
    STAGE_STRUCTURE,
    Mismatch,
    bindings,
)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class AxisMap:
    """One intrinsic axis and the workload iterators that play its role."""

    axis: str
    kind: str  # "S" or "R"
    size: int  # the intrinsic's extent
    iters: tuple[str, ...]  # workload iterators fused into it, outer to inner; () if absent
    extent: int  # their combined extent (1 when absent)

    @property
    def padded(self) -> int:
        return -(-self.extent // self.size) * self.size

    @property
    def padding(self) -> int:
        return self.padded - self.extent

    @property
    def fused(self) -> bool:
        return len(self.iters) > 1

    def describe(self) -> str:
        src = "*".join(self.iters) if self.iters else "(none)"
        pad = f" pad {self.extent}->{self.padded}" if self.padding else ""
        return f"{self.axis}={src}{pad}"


@dataclass(frozen=True)
class OperandMap:
    """How one intrinsic operand is fed from the workload.

    ``direct``: the implementation can address the workload's window in place (shape,
    order, strides and alignment all fit its declared layout). Otherwise ``staging`` lists
    what the rewrite must do first, ``reason`` says why, and ``pack`` tells whether the
    operand must be packed into intrinsic-sized tiles (`layout_map` gives the IndexMap).
    """

    operand: str
    buffer: str
    access: str
    is_output: bool
    view_axes: tuple[str, ...]  # the intrinsic axes of this operand, in its dimension order
    view_extents: tuple[int, ...]  # their padded extents
    tile: tuple[int, ...]  # the intrinsic's extents for those axes
    direct: bool
    staging: tuple[str, ...] = ()
    reason: str | None = None
    pack: bool = False
    scope: str = "global"  # the intrinsic's scope for it
    workload_scope: str = "global"

    def layout_map(self):
        """IndexMap from the operand's view (its axes in intrinsic order, padded extents) to
        the layout the implementation reads: identity, or tile-packed
        ``(x, y) -> (x // tx, y // ty, x % tx, y % ty)`` (VNNI's [N/16, K/4, 16, 4])."""
        from ._tvm import tirx

        tiles = self.tile

        def fn(*xs):
            if not self.pack:
                return list(xs)
            return [x // t for x, t in zip(xs, tiles)] + [x % t for x, t in zip(xs, tiles)]

        return tirx.IndexMap.from_func(fn, ndim=len(tiles), index_dtype="int32")

    def describe(self) -> str:
        how = "in place" if self.direct else "+".join(self.staging)
        return f"{self.operand}<-{self.access} ({how})"


@dataclass(frozen=True)
class Match:
    """A block that an intrinsic (or a group led by it) can compute: plain data."""

    function: str
    block: str
    intrinsic: Intrinsic
    group: IntrinsicGroup | None
    template: str | None
    iters: tuple[str, ...]  # the block's iterators, in order
    iter_extents: tuple[int | None, ...]
    axes: tuple[AxisMap, ...]
    outer: tuple[str, ...]  # workload iterators left as loops around the intrinsic
    operands: tuple[OperandMap, ...]
    macs: int | None  # multiply-accumulates (compute) or elements (others) the block performs
    init: str | None = None  # "in-block", the name of a separate init block, or None
    chain: tuple[str, ...] = ()  # for a multi-block match: the blocks after this one

    @property
    def padding(self) -> dict[str, tuple[int, int]]:
        return {a.axis: (a.extent, a.padded) for a in self.axes if a.padding}

    @property
    def direct(self) -> bool:
        return all(o.direct for o in self.operands)

    @property
    def calls(self) -> int:
        outer = prod(e for n, e in zip(self.iters, self.iter_extents) if n in self.outer and e)
        return outer * prod(a.padded // a.size for a in self.axes)

    @property
    def padded_macs(self) -> int:
        return self.calls * prod(a.size for a in self.axes)

    @property
    def mapping(self) -> dict[str, tuple[str, ...]]:
        return {a.axis: a.iters for a in self.axes}

    def operand(self, name: str) -> OperandMap:
        for o in self.operands:
            if o.operand == name:
                return o
        raise KeyError(name)

    def score(self) -> tuple:
        """Smaller is better: fewer operands to stage, fewer heavy staging steps (transpose,
        pack, reindex) than mere padding, less padding waste, fewer loops around the call.
        A group re-declared for any size (``resize``: a library call) needs no padding, so
        its padding costs nothing here, and the number of loops around the call comes first:
        one large GEMM (after an im2col copy) beats thousands of small calls - but an axis the
        workload lacks counts first, as the exact-size call would have a unit extent there."""
        resizable = self.group is not None and self.group.resize is not None
        waste = 1.0 if resizable or not self.macs else self.padded_macs / self.macs
        staged = sum(1 for o in self.operands
                     if not o.direct and not (resizable and set(o.staging) <= {"pad"}))
        heavy = sum(1 for o in self.operands for s in o.staging if s in ("transpose", "pack", "reindex"))
        if resizable:
            absent = sum(1 for a in self.axes if not a.iters)
            return (absent + len(self.outer), staged, heavy, round(waste, 6))
        return (staged, heavy, round(waste, 6), len(self.outer))

    def block_index_map(self):
        """IndexMap from the block's iterators to ``(outer..., axis values...)``: the view
        in which the block is one loop nest of intrinsic calls (for
        ``Schedule.transform_block_layout``). Fused axes are row-major over their iterators."""
        from ._tvm import tirx

        extents = dict(zip(self.iters, self.iter_extents))

        def fn(*vs):
            env = dict(zip(self.iters, vs))
            out = [env[n] for n in self.outer]
            for a in self.axes:
                value = tirx.const(0, "int32")
                for it in a.iters:
                    value = value * extents[it] + env[it]
                out.append(value)
            return out

        return tirx.IndexMap.from_func(fn, ndim=len(self.iters), index_dtype="int32")

    def describe(self) -> str:
        parts = [", ".join(a.describe() for a in self.axes)]
        if self.outer:
            parts.append("outer " + ",".join(self.outer))
        staged = [o.describe() for o in self.operands if not o.direct]
        if staged:
            parts.append("; ".join(staged))
        return " | ".join(parts)


@dataclass(frozen=True)
class BlockResult:
    """What the matcher found for one block: its matches (best first) or the reasons."""

    function: str
    block: str
    macs: int  # multiply-accumulates (`tirbyoc.pattern.block_macs`; 0 for other blocks)
    matches: tuple[Match, ...]
    reasons: tuple[tuple[str, str, int, bool], ...]  # (intrinsic, reason, stage, is compute)

    @property
    def best(self) -> Match | None:
        return self.matches[0] if self.matches else None

    @property
    def reason(self) -> str | None:
        """The most specific reason no candidate matched (None if one did)."""
        if self.matches or not self.reasons:
            return None
        intrin, text, _, _ = max(self.reasons, key=lambda r: (r[2], r[3]))
        return f"{intrin}: {text}"


# ------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    intrinsic: Intrinsic
    group: IntrinsicGroup | None = None
    template: object = None  # tirbyoc.Template


def candidates(targets) -> list[Candidate]:
    """Normalise what to match against: Templates, template names, groups, intrinsics."""
    from .registry import get_template
    from .template import Template

    if isinstance(targets, (str, Template, IntrinsicGroup, Intrinsic)):
        targets = [targets]
    out: list[Candidate] = []
    seen = set()

    def add(c: Candidate):
        if c.intrinsic.name not in seen:
            seen.add(c.intrinsic.name)
            out.append(c)

    for t in targets:
        if isinstance(t, str):
            t = get_template(t)
        if isinstance(t, Template):
            for g in t.groups:
                for member in g.members():
                    add(Candidate(member, g, t))
            for i in t.extra:
                add(Candidate(i, None, t))
        elif isinstance(t, IntrinsicGroup):
            for member in t.members():
                add(Candidate(member, t, None))
        elif isinstance(t, Intrinsic):
            add(Candidate(t, None, None))
        else:
            raise TypeError(
                f"cannot match against {t!r}: pass Templates, template names, IntrinsicGroups "
                "or Intrinsics"
            )
    return out


_PATTERNS: "weakref.WeakKeyDictionary[Intrinsic, BlockPattern]" = weakref.WeakKeyDictionary()


def intrinsic_pattern(intrin: Intrinsic) -> BlockPattern:
    """The description's leaf block as a pattern (read once per intrinsic)."""
    pat = _PATTERNS.get(intrin)
    if pat is None:
        from .intrinsic_check import leaf_block

        pat = read_block(leaf_block(intrin.name, intrin.desc))
        _PATTERNS[intrin] = pat
    return pat


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
            raise Mismatch(STAGE_STRUCTURE, f"intrinsic {intrin.name} indexes {acc.text}; the "
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

    def run(self, failures: list[Mismatch]) -> Match | None:
        ipat, wpat = self.ipat, self.wpat
        if wpat.problem:
            failures.append(Mismatch(STAGE_STRUCTURE, f"block {wpat.name!r}: {wpat.problem}"))
            return None
        if ipat.is_reduction and not wpat.is_reduction:
            failures.append(Mismatch(
                STAGE_OPERATION, f"block {wpat.name!r} is not a reduction; intrinsic reduces over "
                f"{', '.join(it.name for it in ipat.iters if it.kind == 'R')}"))
            return None
        best = None
        for binding in bindings(ipat, wpat, failures):
            if self.intrin.role is not Role.COMPUTE and not self.as_epilogue:
                wrong = self._scope_mismatch(binding)
                if wrong:
                    failures.append(wrong)
                    continue
            try:
                m = self.build(binding)
            except Mismatch as err:
                failures.append(err)
                continue
            if best is None or m.score() < best.score():
                best = m
        return best

    def _scope_mismatch(self, binding) -> Mismatch | None:
        """Data-movement, init and ALU intrinsics work on fixed scopes: they apply to the
        staging blocks a rewrite creates, never to a workload block in other scopes. (Only
        a compute intrinsic's operands may be staged into its scopes.)"""
        for op in self.intrin.operands:
            wacc = binding[op.name]
            if wacc.scope != op.scope:
                return Mismatch(STAGE_OPERATION, f"block {self.wpat.name!r}: {wacc.buffer} is in scope "
                                             f"{wacc.scope!r}; this {self.intrin.role.value} intrinsic "
                                             f"works on {op.scope!r} (operand {op.name})")
        return None

    # -- step 2: iterators --------------------------------------------------------------
    def build(self, binding: dict[str, Access]) -> Match:
        intrin, ipat, wpat = self.intrin, self.ipat, self.wpat
        iaccess: dict[str, Access] = {ipat.store.buffer: ipat.store}
        for acc in ipat.loads:
            iaccess.setdefault(acc.buffer, acc)
        idims = {name: _intrinsic_dims(intrin, acc) for name, acc in iaccess.items()}
        axis_sig = {it.name: frozenset(n for n, dims in idims.items() if it.name in dims) for it in ipat.iters}
        axis_kind = {it.name: it.kind for it in ipat.iters}
        axis_size = {it.name: it.extent for it in ipat.iters}

        live = [it for it in wpat.iters if it.extent != 1]
        wsig = {it.name: frozenset(n for n, acc in binding.items() if it.name in acc.vars) for it in live}

        # Group intrinsic axes that share a role (copies and elementwise ops: all axes are
        # used by every operand) and resolve them by dimension order.
        groups: dict[tuple, list[str]] = {}
        for it in ipat.iters:
            groups.setdefault((axis_sig[it.name], it.kind), []).append(it.name)
        chosen: dict[str, tuple[str, ...]] = {}
        used: set[str] = set()
        for (sig, kind), axes in groups.items():
            cands = [it for it in live if wsig[it.name] == sig and it.kind == kind]
            ref = self._reference(sig)
            iref = iaccess[ref]
            wref = binding[ref]
            axes = sorted(axes, key=lambda a: _position(iref, a))  # innermost first
            cands = sorted(cands, key=lambda it: (_position(wref, it.name), -wpat.iters.index(it)))
            if len(axes) == 1:
                chosen[axes[0]] = self._choose(axes[0], axis_size[axes[0]], cands)
            else:
                for a, it in zip(axes, cands):
                    chosen[a] = (it.name,)
                for a in axes[len(cands):]:
                    chosen[a] = ()
            for a in axes:
                used.update(chosen[a])
                if not chosen[a]:
                    self._check_absent(a, kind, sig, wsig)

        if not any(chosen.values()):
            raise Mismatch(STAGE_ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                            f"any intrinsic axis ({self._roles(wsig)})")
        extents = {it.name: it.extent for it in wpat.iters}
        axes_out = []
        for it in ipat.iters:
            names = chosen[it.name]
            sym = [n for n in names if extents[n] is None]
            if sym:
                raise Mismatch(STAGE_EXTENT, f"block {wpat.name!r}: iterator {sym[0]} (axis {it.name}) "
                                             "has a symbolic extent; intrinsic axes need static extents")
            extent = prod(extents[n] for n in names) if names else 1
            amap = AxisMap(it.name, it.kind, it.extent, names, extent)
            if amap.padding and not self.allow_padding:
                what = "reduction" if it.kind == "R" else "spatial"
                rel = f"< {it.extent}" if extent < it.extent else f"is not a multiple of {it.extent}"
                raise Mismatch(STAGE_EXTENT, f"block {wpat.name!r}: {what} axis {it.name} "
                                             f"({'*'.join(names) or 'absent'}) has extent {extent} {rel} "
                                             "and the template forbids padding")
            axes_out.append(amap)
        absent = [a for a in axes_out if not a.iters and a.size > 1]
        if absent:
            # The rewrite would need a broadcast dimension in the operands that TVM's reindex
            # cannot add; reporting this as a match would promise an offload that never comes.
            a = absent[0]
            raise Mismatch(STAGE_ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                            f"intrinsic axis {a.axis} (size {a.size}; e.g. a GEMV "
                                            "under a GEMM intrinsic); it cannot be padded from "
                                            "nothing - declare an intrinsic without that axis")
        outer = tuple(it.name for it in live if it.name not in used)

        operands = tuple(self._operand(op, iaccess[op.name], idims[op.name], binding[op.name],
                                       {a.axis: a for a in axes_out})
                         for op in intrin.operands)
        return Match(
            function=self.function, block=wpat.name, intrinsic=intrin, group=self.cand.group,
            template=getattr(self.cand.template, "name", None),
            iters=tuple(it.name for it in wpat.iters), iter_extents=tuple(it.extent for it in wpat.iters),
            axes=tuple(axes_out), outer=outer, operands=operands, macs=_block_size(wpat),
            init="in-block" if wpat.init_value is not None else None,
        )

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
            order = {it.name: i for i, it in enumerate(self.wpat.iters)}
            return tuple(sorted((c.name for c in cands), key=order.__getitem__))
        return (primary.name,)

    def _check_absent(self, axis: str, kind: str, sig: frozenset, wsig: dict) -> None:
        wpat = self.wpat
        if kind == "R" and not wpat.is_reduction:
            raise Mismatch(STAGE_ITERATORS, f"block {wpat.name!r} has no reduction for axis {axis}")
        if not self.allow_padding:
            raise Mismatch(STAGE_ITERATORS, f"block {wpat.name!r}: no iterator plays the role of "
                                            f"{'reduction' if kind == 'R' else 'spatial'} axis {axis} "
                                            f"(used by {', '.join(sorted(sig))}); {self._roles(wsig)}")

    def _roles(self, wsig: dict) -> str:
        rows = []
        for it in self.wpat.iters:
            if it.name in wsig:
                used = ",".join(sorted(wsig[it.name])) or "none"
                rows.append(f"{it.name}({it.kind}) uses {used}")
        return "; ".join(rows) or "the block has no non-unit iterators"

    # -- step 4: layouts ----------------------------------------------------------------
    def _operand(self, op, iacc: Access, dims: tuple, wacc: Access, axes: dict) -> OperandMap:
        view = tuple(d for d in dims if d is not None)
        tile = tuple(axes[a].size for a in view)
        padded = tuple(axes[a].padded for a in view)
        staging: list[str] = []
        reasons: list[str] = []
        pack = False
        is_output = iacc.buffer == self.ipat.store.buffer
        if any(axes[a].padding for a in view):
            staging.append("pad")
            reasons.append("pad " + ", ".join(f"{a} {axes[a].extent}->{axes[a].padded}"
                                              for a in view if axes[a].padding))
        wdims = []
        ok = True
        for a in view:
            amap = axes[a]
            if len(amap.iters) != 1:
                ok = False
                reasons.append(f"axis {a} is {'absent' if not amap.iters else 'fused from ' + '*'.join(amap.iters)}"
                               f" in {wacc.text}")
                break
            v = amap.iters[0]
            hits = [d for d, vs in enumerate(wacc.index_vars) if v in vs]
            if len(hits) != 1 or wacc.indices[hits[0]] is None:
                ok = False
                reasons.append(f"iterator {v} does not index one dimension of {wacc.text} affinely")
                break
            d = hits[0]
            mapped_here = [x for x in wacc.index_vars[d] if any(x in axes[b].iters for b in view if b != a)]
            coeff = wacc.indices[d].coeff(v)
            if mapped_here:
                ok = False
                reasons.append(f"{wacc.text}: dimension {d} mixes iterators {v} and {mapped_here[0]}")
                break
            if coeff != 1:
                ok = False
                reasons.append(f"{wacc.text}: iterator {v} steps by {coeff}")
                break
            wdims.append(d)
        if not ok:
            staging.append("reindex")
        elif wdims != sorted(wdims):
            staging.append("transpose")
            reasons.append(f"{wacc.text} holds axes {view} in another order")
            ok = False
        elif wdims and wdims != list(range(wdims[0], len(wacc.indices))):
            # TVM's tensorize passes a region in place only if the dimensions it adds to the
            # description's are leading ones (w[k, c, 0, 0] of a 1x1 conv's OIHW weight is not)
            inner = [d for d in range(wdims[0], len(wacc.indices)) if d not in wdims]
            staging.append("transpose")
            reasons.append(f"{wacc.text}: dimension {inner[0]} of {wacc.buffer} lies inside the "
                           "window; TVM's tensorize takes extra dimensions only as outer ones")
            ok = False
        if ok:
            layout_problem = self._layout_problem(op, wacc, wdims, tile, [axes[a].iters[0] for a in view])
            if layout_problem:
                reasons.append(layout_problem)
                ok = False
        if not ok and op.layout.dense and len(view) > 1:
            pack = True
            staging.append("pack")
        if op.scope != wacc.scope:
            staging.append(f"copy to {op.scope}")
        direct = ok and "pad" not in staging
        return OperandMap(
            operand=op.name, buffer=wacc.buffer, access=wacc.text, is_output=is_output,
            view_axes=view, view_extents=padded, tile=tile, direct=direct,
            staging=tuple(dict.fromkeys(staging)) if not direct else tuple(s for s in staging if s.startswith("copy")),
            reason="; ".join(reasons) or None, pack=pack, scope=op.scope, workload_scope=wacc.scope,
        )

    def _layout_problem(self, op, wacc: Access, wdims: list[int], tile: tuple,
                        mapped_iters: list[str]) -> str | None:
        """Why the in-place window breaks the implementation's declared layout, or None."""
        shape = wacc.shape
        if wacc.strides:
            strides = list(wacc.strides)
        else:
            if any(s is None for s in shape):
                strides = [None] * len(shape)
            else:
                strides, acc = [], 1
                for e in reversed(shape):
                    strides.append(acc)
                    acc *= e
                strides.reverse()
        if not wdims:
            return None
        last = wdims[-1]
        if strides[last] != 1:
            return f"the innermost axis is not contiguous in {wacc.text} (stride {strides[last]})"
        if op.layout.dense and len(wdims) > 1:
            expect = list(range(wdims[0], len(shape)))
            if wdims != expect:
                return (f"a {'x'.join(map(str, tile))} window of {wacc.buffer}"
                        f"{list(shape)} is not one contiguous block; the implementation reads it dense")
            for d, t in zip(wdims[1:], tile[1:]):
                if strides[d - 1] != (strides[d] or 0) * t:
                    return (f"a {'x'.join(map(str, tile))} window of {wacc.buffer}{list(shape)} is "
                            "strided; the implementation reads it dense")
        align = op.layout.alignment
        if align > 1:
            nbytes = dtype_bytes(wacc.dtype)
            mapped = {d: (mapped_iters[i], tile[i]) for i, d in enumerate(wdims)}
            for d, form in enumerate(wacc.indices):
                if form is None:
                    return f"{wacc.text}: a non-affine index cannot prove {align}-byte alignment"
                if not form.terms and not form.const:
                    continue
                if strides[d] is None:
                    return f"{wacc.text}: unknown strides cannot prove {align}-byte alignment"
                step = strides[d] * nbytes
                it, t = mapped.get(d, (None, None))
                offsets = [form.const] + [c for n, c in form.terms if n != it] + ([t] if it else [])
                if any((c * step) % align for c in offsets):
                    return f"{wacc.text}: the window start is not {align}-byte aligned"
        return None




def _block_size(wpat: BlockPattern) -> int | None:
    ext = [it.extent for it in wpat.iters]
    return None if any(e is None for e in ext) else prod(ext)


# ------------------------------------------------------------------ public API
def _functions(func_or_mod) -> list[tuple[str, object]]:
    from ._tvm import IRModule, PrimFunc

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


def explain(func_or_mod, targets) -> list[BlockResult]:
    """For every block of every PrimFunc: its matches, best first, or why none matched."""
    cands = candidates(targets)
    runs_here = {c.template.name: c.template.runs_here() for c in cands if c.template is not None}
    results = []
    for fname, func in _functions(func_or_mod):
        blocks = function_blocks(func)
        macs = block_macs(func)
        for i, wpat in enumerate(blocks):
            matches, reasons = [], []
            for cand in cands:
                failures: list[Mismatch] = []
                m = _PairMatcher(cand, wpat, fname).run(failures)
                if m is not None:
                    if m.init is None and wpat.is_reduction:
                        init = _separate_init(blocks, i)
                        if init:
                            m = _replace(m, init=init)
                    matches.append(m)
                elif failures:
                    top = max(failures, key=lambda f: f.stage)
                    reasons.append((cand.intrinsic.name, top.message, top.stage,
                                    cand.intrinsic.role is Role.COMPUTE))
                else:
                    reasons.append((cand.intrinsic.name, f"block {wpat.name!r} does not match", 0, False))
            matches.sort(key=lambda m: (_role_rank(m.intrinsic), m.score(), not runs_here.get(m.template, True)))
            results.append(BlockResult(fname, wpat.name, macs.get(wpat.name, 0), tuple(matches),
                                       tuple(reasons)))
    return results


def match(func_or_mod, targets) -> list[Match]:
    """Every (block, intrinsic) match in a PrimFunc or IRModule, best first within a block."""
    return [m for r in explain(func_or_mod, targets) for m in r.matches]


def _role_rank(intrin: Intrinsic) -> int:
    return 0 if intrin.role is Role.COMPUTE else 1


def _replace(m: Match, **kw) -> Match:
    from dataclasses import replace

    return replace(m, **kw)


__all__ = ["AxisMap", "BlockResult", "Candidate", "Match", "OperandMap", "candidates", "explain",
           "intrinsic_pattern", "match"]
