"""Layouts, soundly: whether an intrinsic's implementation can address a workload operand's
window in place (order, strides, alignment, the layout it declared), and otherwise what the
rewrite must do first (`Staging`) and why."""

from __future__ import annotations

from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.pattern import Access
from tirbyoc.matching.results import OperandMap, Staging


def operand_map(op, dims: tuple, wacc: Access, axes: dict, is_output: bool) -> OperandMap:
    """How intrinsic operand ``op`` (indexed by axes ``dims``) is fed from the workload's
    access ``wacc``: in place, or what staging it needs and why."""
    view = tuple(d for d in dims if d is not None)
    tile = tuple(axes[a].size for a in view)
    padded = tuple(axes[a].padded for a in view)
    staging: list = []
    reasons: list[str] = []
    pack = False
    if any(axes[a].pads for a in view):
        staging.append(Staging.PAD)
        reasons.append("pad " + ", ".join(axes[a].pad_text for a in view if axes[a].pads))
    wdims, why = _window_dims(view, axes, wacc)
    ok = why is None
    if why:
        reasons.append(why)
    if not ok:
        staging.append(Staging.REINDEX)
    elif wdims != sorted(wdims):
        staging.append(Staging.TRANSPOSE)
        reasons.append(f"{wacc.text} holds axes {view} in another order")
        ok = False
    elif wdims and wdims != list(range(wdims[0], len(wacc.indices))):
        # TVM's tensorize passes a region in place only if the dimensions it adds to the
        # description's are leading ones (w[k, c, 0, 0] of a 1x1 conv's OIHW weight is not)
        inner = [d for d in range(wdims[0], len(wacc.indices)) if d not in wdims]
        staging.append(Staging.TRANSPOSE)
        reasons.append(f"{wacc.text}: dimension {inner[0]} of {wacc.buffer} lies inside the "
                       "window; TVM's tensorize takes extra dimensions only as outer ones")
        ok = False
    if ok:
        problem = layout_problem(op, wacc, wdims, tile, [axes[a].iters[0] for a in view])
        if problem:
            reasons.append(problem)
            ok = False
    if ok and op.layout.tile is not None:  # a plain buffer is never in the packed layout
        reasons.append(f"the implementation reads {op.name} packed in {'x'.join(map(str, op.layout.tile))} tiles")
        ok = False
    if not ok and op.layout.dense and len(view) > 1:
        pack = True
        staging.append(Staging.PACK)
    if op.scope != wacc.scope:
        staging.append(f"copy to {op.scope}")
    direct = ok and "pad" not in staging
    return OperandMap(
        keeps_order=_keeps_order(view, axes, wacc),
        operand=op.name, buffer=wacc.buffer, access=wacc.text, is_output=is_output,
        view_axes=view, view_extents=padded, tile=tile, direct=direct,
        staging=tuple(dict.fromkeys(staging)) if not direct else tuple(s for s in staging if s.startswith("copy")),
        reason="; ".join(reasons) or None, pack=pack, scope=op.scope, workload_scope=wacc.scope,
        pack_tile=op.layout.tile if pack else None,
    )


def _keeps_order(view: tuple, axes: dict, wacc: Access) -> bool:
    """Whether the intrinsic axes of ``view`` index ``wacc``'s dimensions outermost first (a
    fused axis by its outermost dimension): a copy between the two then runs along both
    buffers' rows instead of transposing them."""
    firsts = []
    for a in view:
        dims = [d for d, vs in enumerate(wacc.index_vars) for v in axes[a].iters if v in vs]
        if dims:
            firsts.append(min(dims))
    return firsts == sorted(firsts)


def _window_dims(view: tuple, axes: dict, wacc: Access) -> tuple[list[int], str | None]:
    """The dimension of ``wacc`` each intrinsic axis of ``view`` indexes, or why the window
    is not one the implementation could read as it is (a fused or absent axis, a non-affine
    or mixed index, a stride): then the operand is reindexed."""
    wdims = []
    for a in view:
        amap = axes[a]
        if len(amap.iters) != 1:
            return wdims, (f"axis {a} is {'absent' if not amap.iters else 'fused from ' + '*'.join(amap.iters)}"
                           f" in {wacc.text}")
        v = amap.iters[0]
        hits = [d for d, vs in enumerate(wacc.index_vars) if v in vs]
        if len(hits) != 1 or wacc.indices[hits[0]] is None:
            return wdims, f"iterator {v} does not index one dimension of {wacc.text} affinely"
        d = hits[0]
        mapped_here = [x for x in wacc.index_vars[d] if any(x in axes[b].iters for b in view if b != a)]
        if mapped_here:
            return wdims, f"{wacc.text}: dimension {d} mixes iterators {v} and {mapped_here[0]}"
        coeff = wacc.indices[d].coeff(v)
        if coeff != 1:
            return wdims, f"{wacc.text}: iterator {v} steps by {coeff}"
        wdims.append(d)
    return wdims, None


def layout_problem(op, wacc: Access, wdims: list[int], tile: tuple,
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


__all__ = ["layout_problem", "operand_map"]
