"""Pointers to bfloat16 that TVM 0.27 can build: declared as pointers to their 16 bits.

An implementation that hands a bfloat16 buffer to C (``A.access_ptr("r")`` in a
``T.call_extern``: the bf16 kernels of ``x86_amx`` and ``x86_avx512_bf16``) does not build in
TVM 0.27 as written: its BF16ComputeLegalize promotes the pointer's
``type_annotation(bfloat16)`` to ``float32`` as if it were arithmetic, BF16StorageLegalize
then makes the buffer ``uint16``, and lowering stops ("tvm_access_ptr element type must
match the source buffer"). `Intrinsic` declares every such pointer as one to ``uint16`` - the
16 bits TVM stores a bfloat16 in, the same address - when it builds the implementation, so
the tensor intrinsic builds with TVM's own pipeline or tirbyoc's alike.
"""

from __future__ import annotations


def bf16_pointers_as_bits(func):
    """``func`` with each ``tvm_access_ptr`` to bfloat16 elements one to ``uint16`` (``func``
    itself when it has none)."""
    # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
    from tirbyoc._tvm import ACCESS_PTR, PrimCall, call_name, expr_dtype, tirx, tvm_ffi, with_call_args

    def rewrite(call):
        if call_name(call) != ACCESS_PTR or expr_dtype(call.args[0]) != "bfloat16":
            return call
        return with_call_args(call, [tirx.type_annotation("uint16"), *call.args[1:]])

    body = tvm_ffi.structural_map(func.body, [(PrimCall, rewrite)])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["bf16_pointers_as_bits"]
