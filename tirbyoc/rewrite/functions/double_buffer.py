"""Double buffering of scratchpad tiles: the load of tile i+1 overlaps the compute on tile i.

A template's block DMA may name scopes whose tiles get two versions (`BlockDMA.double_buffer`).
`plan_double_buffering` decides, per offloaded PrimFunc, which of those scopes have room for
twice their tiles and marks the function (attribute ``tirbyoc.double_buffer``); TVM lowers it
as usual and `version_tiles`, a pass of tirbyoc's TIR pipeline run after TVM's own
(`tirbyoc.offloading.lowering`), gives each marked tile two versions: its allocation doubles
and every access inside the loop over tiles is offset by ``(iteration % 2) * tile``. In a
decoupled access-execute machine (VTA's, the simulator's) the load unit then fills one
version while the core reads the other: nothing else has to move.

Why after TVM's lowering and not in the schedule: TVM places a tile's allocation where its
accesses meet (inside the loop over tiles) and compacts it to what one iteration touches, so a
buffer versioned in the schedule comes back as one tile. After lowering, the loop, the
allocation and the accelerator's calls are explicit.

A tile is versioned only where that cannot change a result: every access is an argument of
the accelerator's packed calls (``tvm_stack_make_array`` of the tile's data), all of them
inside one serial loop whose body first fills the whole tile with one unconditional block-DMA
load, so no iteration reads what another wrote. Anything else keeps its single tile.
The scratchpad footprint a simulated template declares (``tirbyoc.footprint``: the packed
calls that report bytes per scope) grows by what versioning adds, so capacity checks and
high-water marks stay those of the code that runs.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import (BUFFER_DATA, CALL_PACKED, MAKE_ARRAY, PrimCall, StringImm, call_name, child_stmts,
                          expr_dtype, tirx, tvm_ffi, with_call_args)
from tirbyoc.dtypes import dtype_bytes

ATTR = "tirbyoc.double_buffer"  # {"load": packed function, "scopes": [scope, ...]}
FOOTPRINT_ATTR = "tirbyoc.footprint"  # {"calls": [packed function, ...], "scopes": [scope, ...]}


def plan_double_buffering(func, template, used: dict) -> tuple[object, list[str]]:
    """(``func`` marked for `version_tiles`, notes) for ``template``'s double-buffered scopes
    whose tiles fit twice: ``used`` is bytes per scope (`scratchpad_usage`)."""
    dma = getattr(template, "block_dma", None)
    scopes = tuple(getattr(dma, "double_buffer", ()) or ())
    if not scopes:
        return func, []
    capacity = {s.name: s.capacity for s in template.scopes}
    chosen, notes = [], []
    for scope in scopes:
        need = used.get(scope, 0)
        if not need:
            continue
        if capacity.get(scope) is not None and 2 * need > capacity[scope]:
            notes.append(f"one {scope} tile (2 x {need} B > {capacity[scope]} B)")
            continue
        chosen.append(scope)
    if not chosen:
        return func, notes
    notes.append("double buffer " + ", ".join(chosen) + " (two versions of each tile its loop reloads)")
    return func.with_attr(ATTR, {"load": dma.load, "scopes": chosen}), notes


def _int_value(expr) -> int | None:
    """An integer constant's value, None for any other expression."""
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _data_of(expr, buffer) -> bool:
    """Whether ``expr`` is ``buffer``'s data pointer (``tirx.buffer_data(buffer)``)."""
    return isinstance(expr, PrimCall) and call_name(expr) == BUFFER_DATA and expr.args[0].same_as(buffer)


def _leaf_use(stmt, buffer) -> str | None:
    """How the leaf statement ``stmt`` uses ``buffer`` (a Var in TVM 0.27's TIR): None,
    ``"array"`` (only as the data of ``tvm_stack_make_array``) or ``"other"``."""
    seen, arrays = [], []
    tvm_ffi.structural_walk(stmt, [(tirx.Var, lambda v: seen.append(v) if v.same_as(buffer) else None),
                                   (PrimCall, lambda c: arrays.append(c) if call_name(c) == MAKE_ARRAY
                                    and _data_of(c.args[0], buffer) else None)], order="pre")
    if not seen:
        return None
    return "array" if len(seen) == len(arrays) else "other"


_OWN_EXPRS = ("min", "extent", "condition", "value", "message", "data", "step")


def _collect_uses(stmt, var, path: tuple, out: list) -> None:
    """Every statement using ``var`` in program order: (path of enclosing For / IfThenElse
    nodes, statement, use kind)."""
    if isinstance(stmt, tirx.AllocBuffer) and stmt.buffer.same_as(var):
        return  # the allocation itself
    children = child_stmts(stmt)
    if not children:
        kind = _leaf_use(stmt, var)
        if kind is not None:
            out.append((path, stmt, kind))
        return
    own = [getattr(stmt, f) for f in _OWN_EXPRS if getattr(stmt, f, None) is not None
           and not isinstance(getattr(stmt, f), tirx.Stmt)]
    if any(_leaf_use(e, var) for e in own):
        out.append((path, stmt, "other"))
    inner = path + (stmt,) if isinstance(stmt, (tirx.For, tirx.IfThenElse)) else path
    for child in children:
        _collect_uses(child, var, inner, out)


def _fills_tile(stmt, var, load: str, elements: int) -> bool:
    """Whether ``stmt`` is ``call_packed(load, whole tile, ...)``: a dense view of all
    ``elements`` at offset 0 as the destination."""
    call = getattr(stmt, "value", None) if isinstance(stmt, tirx.Evaluate) else None
    if not (isinstance(call, PrimCall) and call_name(call) == CALL_PACKED and len(call.args) > 1
            and isinstance(call.args[0], StringImm) and str(call.args[0].value) == load):
        return False
    view = call.args[1]
    if not (isinstance(view, PrimCall) and call_name(view) == MAKE_ARRAY and _data_of(view.args[0], var)):
        return False
    shape = [_int_value(d) for d in view.args[1].args]
    if any(d is None for d in shape) or prod(shape) != elements or _int_value(view.args[5]) != 0:
        return False
    strides = view.args[2]
    if isinstance(strides, PrimCall) and call_name(strides) == "tirx.tvm_stack_make_shape":
        dense = [prod(shape[i + 1:]) for i in range(len(shape))]
        got = [_int_value(s) for s in strides.args]
        return all(g == d for g, d, n in zip(got, dense, shape) if n != 1)
    return _int_value(strides) == 0  # no strides: compact


def versioning_loop(body, buffer, load: str):
    """The serial loop whose iterations may alternate between two versions of ``buffer``'s
    tile (see the module docstring), or None."""
    uses: list = []
    _collect_uses(body, buffer, (), uses)
    if not uses or any(kind != "array" for _, _, kind in uses):
        return None
    path, first, _ = uses[0]
    elements = prod(_int_value(d) or 0 for d in buffer.shape)
    if not path or not isinstance(path[-1], tirx.For) or not _fills_tile(first, buffer, load, elements):
        return None
    loop = path[-1]
    if int(loop.kind) not in (int(tirx.ForKind.SERIAL), int(tirx.ForKind.UNROLLED)):
        return None
    if loop.step is not None and _int_value(loop.step) != 1:
        return None
    extent = _int_value(loop.extent)
    if extent is not None and extent < 2:
        return None
    n = len(path)
    if any(len(p) < n or any(not a.same_as(b) for a, b in zip(p, path)) for p, _, _ in uses):
        return None
    return loop


def _version(body, alloc, loop):
    """``body`` with ``alloc``'s tile doubled and each access in ``loop`` offset by parity."""
    buf = alloc.buffer
    elements = prod(int(d) for d in buf.shape)
    doubled = tirx.decl_buffer((2 * elements,), buf.dtype, buf.name, scope=str(buf.scope()))

    def offset_view(call):
        if call_name(call) != MAKE_ARRAY or not _data_of(call.args[0], buf):
            return call
        args = list(call.args)
        parity = tirx.floormod(loop.loop_var - loop.min, 2)
        shift = parity * tirx.const(elements, expr_dtype(loop.loop_var))
        off = args[5]
        args[5] = off + (shift if expr_dtype(shift) == expr_dtype(off) else tirx.Cast(expr_dtype(off), shift))
        return with_call_args(call, args)

    def per_loop(stmt):
        if not stmt.same_as(loop):
            return stmt
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                        tvm_ffi.structural_map(stmt.body, [(PrimCall, offset_view)]),
                        stmt.thread_binding, stmt.annotations, stmt.step, stmt.span)

    def per_alloc(stmt):
        return tirx.AllocBuffer(doubled, stmt.annotations, stmt.span) if stmt.buffer.same_as(buf) else stmt

    body = tvm_ffi.structural_map(body, [(tirx.For, per_loop)], order="pre")
    body = tvm_ffi.structural_map(body, [(tirx.AllocBuffer, per_alloc)])
    # TVM 0.27's buffers are variables: every other mention of the tile now names the double
    return tvm_ffi.structural_map(body, [(tirx.Var, lambda v: doubled if v.same_as(buf) else v)])


def _grow_footprint(body, footprint, extra: dict):
    """The footprint calls' byte counts plus ``extra`` (bytes per scope)."""
    if footprint is None or not any(extra.values()):
        return body
    calls = {str(c) for c in footprint["calls"]}
    scopes = [str(s) for s in footprint["scopes"]]

    def grow(call):
        if not (call_name(call) == CALL_PACKED and call.args and isinstance(call.args[0], StringImm)
                and str(call.args[0].value) in calls):
            return call
        args = list(call.args)
        for i, scope in enumerate(scopes):
            if extra.get(scope) and 1 + i < len(args):
                args[1 + i] = args[1 + i] + tirx.const(extra[scope], expr_dtype(args[1 + i]))
        return with_call_args(call, args)

    return tvm_ffi.structural_map(body, [(PrimCall, grow)])


def _allocations(body) -> list:
    found: list = []
    tvm_ffi.structural_walk(body, (tirx.AllocBuffer, found.append), order="pre")
    return found


def version_tiles(func, _mod=None, _ctx=None):
    """The TIR pass (see the module docstring): two versions of each marked tile that can
    have them; unmarked functions unchanged."""
    attrs = func.attrs or {}
    if ATTR not in attrs:
        return func
    spec = attrs[ATTR]
    load, scopes = str(spec["load"]), {str(s) for s in spec["scopes"]}
    body, extra = func.body, {}
    for alloc in _allocations(func.body):
        scope = str(alloc.buffer.scope())
        if scope not in scopes:
            continue
        current = next(a for a in _allocations(body) if a.buffer.same_as(alloc.buffer))
        loop = versioning_loop(body, current.buffer, load)
        if loop is None:
            continue
        body = _version(body, current, loop)
        nbytes = prod(int(d) for d in alloc.buffer.shape) * dtype_bytes(str(alloc.buffer.dtype))
        extra[scope] = extra.get(scope, 0) + nbytes
    body = _grow_footprint(body, attrs.get(FOOTPRINT_ATTR), extra)
    return func.with_body(body)


__all__ = ["ATTR", "FOOTPRINT_ATTR", "plan_double_buffering", "version_tiles", "versioning_loop"]
