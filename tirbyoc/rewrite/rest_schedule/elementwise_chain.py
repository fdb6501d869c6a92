"""An elementwise chain of the rest inlined into its last step: one pass over the data
instead of one per operator.

``LegalizeOps`` writes a fused chain of elementwise operators as one loop nest per operator,
each storing its whole result: the float input of a quantized model (divide, round, add the
zero point, clip, cast) is five float32 passes over the image and an 8-bit one. Inlined into
the last (``compute_inline``), the chain is one pass computing each element from the input.

Bit for bit: each operator still rounds as it did; what could differ is LLVM contracting a
product into a later sum (an FMA rounds once). Within one of ``LegalizeOps``'s nests that
is as TVM builds it; across two it never happens there (the product is stored first). So a
producer whose value holds a float product is not inlined. Only a producer read by one
consumer at the very indices it writes, over the same shape (an elementwise step, not a
broadcast, a pad or a transpose), is inlined; TVM's ``compute_inline`` checks the rest.
"""

from __future__ import annotations

from tirbyoc._tvm import SPATIAL, TensorLoad, expr_dtype, s_tir, tirx, tvm_ffi
from tirbyoc.ir.tir_walk import at_iterators


def inline_elementwise_chains(sch) -> int:
    """Inline each elementwise producer of the root block's children into its elementwise
    consumer (see the module's docstring); returns how many were inlined."""
    inlined = 0
    for block in list(sch.get_child_blocks(sch.get_sblock("root"))):
        consumers = sch.get_consumers(block)
        if len(consumers) != 1 or not _inlinable(sch.get(block), sch.get(consumers[0])):
            continue
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:  # TVM's own checks: the block stays
            continue
        inlined += 1
    return inlined


def _elementwise(block) -> tirx.BufferStore | None:
    """``block``'s store when it is one elementwise step: spatial iterators only, no init,
    one store at exactly its iterators, in order."""
    store = block.body
    if (block.init is not None or not isinstance(store, tirx.BufferStore) or len(block.writes) != 1
            or any(int(iv.iter_type) != SPATIAL for iv in block.iter_vars)):
        return None
    return store if at_iterators(store.indices, block) else None


def _inlinable(producer, consumer) -> bool:
    made, used = _elementwise(producer), _elementwise(consumer)
    if made is None or used is None or _has_float_product(made.value):
        return False
    buf = made.buffer
    if not _same_shape(buf.shape, used.buffer.shape):
        return False
    loads = []
    tvm_ffi.structural_walk(used.value, (TensorLoad, loads.append))
    reads = [ld for ld in loads if ld.source.same_as(buf)]
    return bool(reads) and all(at_iterators(ld.indices, consumer) for ld in reads)


def _same_shape(a, b) -> bool:
    """Equal extents, constant or symbolic (a dynamic model's ``seq``: the same Var)."""
    return len(a) == len(b) and all(x.same_as(y) or (hasattr(x, "value") and hasattr(y, "value") and
                                                     int(x.value) == int(y.value)) for x, y in zip(a, b))


def _has_float_product(expr) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Mul, lambda m: found.append(expr_dtype(m).startswith(("float", "bfloat")))))
    return any(found)


__all__ = ["inline_elementwise_chains"]
