"""Scratchpad tiles passed to packed functions by access pointer where TVM merges allocations.

TVM's ``StorageRewrite`` combines every allocation of a specially tagged scope
(``local.acc_buffer``: anything with a tag after the dot) into one, each at an offset. An
access through ``tvm_access_ptr`` gets that offset added; a bare data pointer does not (TVM
warns "Use a merged buffer variable address, could cause error") - and a packed call's tensor
argument is ``tvm_stack_make_array(buffer.data, ..., elem_offset)``, so a tile merged behind
another would be read and written at the other's address. This happens when a function holds
two tiles in one scratchpad (a fused epilogue's bias next to the accumulator tile).

`address_merged_tiles` gives such arguments their address through ``tvm_access_ptr``
(element offset folded into the pointer, the array's own offset 0), for the scopes in which
the function allocates more than one buffer; a scope with one tile keeps the plain form
(which `tirbyoc.rewrite.functions.double_buffer.version_tiles` reads). The rewrite's last stage applies
it to the function it returns, so the result is right whichever pipeline builds it.
"""

from __future__ import annotations

from tirbyoc._tvm import (BUFFER_DATA, MAKE_ARRAY, PrimCall, call_name, expr_dtype, iter_blocks, tirx,
                          tvm_ffi, with_call_args)

# StorageRewrite merges every scope with a tag except these (storage_rewrite.cc,
# IsSpecialTaggedMemory)
_UNMERGED_TAGS = (".dyn", ".workspace", ".vtcm")


def _shared_scopes(func) -> set[str]:
    """Tagged scopes (``x.y``) in which ``func`` allocates more than one buffer."""
    count: dict[str, int] = {}
    for block in iter_blocks(func.body):
        for buf in block.alloc_buffers:
            scope = str(buf.scope())
            tag = scope[scope.find("."):] if "." in scope else ""
            if tag and tag not in _UNMERGED_TAGS:
                count[scope] = count.get(scope, 0) + 1
    return {s for s, n in count.items() if n > 1}


def _span(shape_call, strides_call):
    """Elements a strided view spans: 1 + sum((extent - 1) * stride)."""
    shape = list(shape_call.args) if isinstance(shape_call, PrimCall) else []
    strides = list(strides_call.args) if isinstance(strides_call, PrimCall) else []
    if not shape:
        return None
    if len(strides) != len(shape):  # compact
        total = shape[0]
        for s in shape[1:]:
            total = total * s
        return total
    span = tirx.const(1, "int32")
    for e, s in zip(shape, strides):
        span = span + (tirx.Cast("int32", e) - 1) * tirx.Cast("int32", s)
    return span


def address_merged_tiles(func):
    """``func`` with the tile arguments of merged scopes addressed by ``tvm_access_ptr``
    (see the module's docstring); ``func`` itself when no scope holds two tiles."""
    scopes = _shared_scopes(func)
    if not scopes:
        return func

    def rewrite(call):
        if call_name(call) != MAKE_ARRAY or len(call.args) != 6:
            return call
        data = call.args[0]
        if not (isinstance(data, PrimCall) and call_name(data) == BUFFER_DATA):
            return call
        buf = data.args[0]
        if str(buf.scope()) not in scopes:
            return call
        args = list(call.args)
        offset = args[5] - buf.elem_offset if not args[5].same_as(buf.elem_offset) else 0
        args[0] = buf.access_ptr("rw", offset=offset, extent=_span(args[1], args[2]))
        args[5] = tirx.const(0, expr_dtype(args[5]))
        return with_call_args(call, args)

    return func.with_body(tvm_ffi.structural_map(func.body, [(PrimCall, rewrite)]))


__all__ = ["address_merged_tiles"]
