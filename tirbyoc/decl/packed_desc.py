"""The description TVM's tensorize is given for an intrinsic with packed operands.

An operand declared ``Layout.packed(tile)`` is described as it is declared - an (n, k) weight
indexed ``B[j, k]`` - because that is what the matcher compares a workload with, and what
a newcomer reads. Its implementation, and the staged copy the rewrite makes, hold it packed
([n/16, k/4, 16, 4] for ``tile=(16, 4)``). TVM's tensorize compares the description with the
rewritten block, which by then reads the packed copy, so it is given the description with the
operand's buffer re-laid-out by TVM's own ``transform_layout``: ``B[j // 16, k // 4, j % 16,
k % 4]`` over a buffer of the packed shape.
"""

from __future__ import annotations


def packed_description(desc, operands):
    """``desc`` with each packed operand's parameter buffer transformed to its stored layout
    (``desc`` itself when no operand is packed)."""
    packed = [(i, op) for i, op in enumerate(operands) if op.layout.tile is not None]
    if not packed:
        return desc
    # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
    from tirbyoc._tvm import is_buffer, s_tir, tirx
    from tirbyoc.decl.intrinsic_check import leaf_block

    sch = s_tir.Schedule(desc)
    leaf = sch.get_sblock(leaf_block("packed description", desc).name_hint)
    buffers = {b.name: b for b in desc.params if is_buffer(b)}  # TVM 0.27: buffer params
    for _, op in packed:
        sch.transform_layout(leaf, buffers[op.name], tirx.IndexMap.from_func(
            op.layout.pack_map(), ndim=len(op.shape), index_dtype="int32"))
    return sch.mod["main"]


__all__ = ["packed_description"]
