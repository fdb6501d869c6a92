"""Register blocks on the stack, whatever their size: the allocation TVM would move to the heap.

The CPU schedule keeps an ``mr x nr`` block of accumulators in a small buffer across the
reduction (`tirbyoc.rewrite.cpu.register_blocks`); LLVM keeps such a buffer in registers only when it is a
stack slot (an ``alloca`` whose every access has a constant index once the block is unrolled).
TVM's ``LowerTVMBuiltin`` puts a buffer of 1 KiB or more on the heap instead
(``TVMBackendAllocWorkspace``, its ``kMaxStackAlloca``), which caps an AVX-512 block at 15 of
the 32 zmm registers. A 4 x 6 block of 24 zmm accumulators makes each reduction step 24
fused multiply-adds for 10 loads instead of 12 for 7: BERT's 128 x 768 x 3072 matmul ran at
0.82 of the fma peak with 4 x 3, and 0.95 with 4 x 6 (Zen 5, one thread).

`mark_register_blocks` (before TVM's lowering, blocks still there) names, in a function
attribute, the buffers the register blocks' write-backs read; `keep_register_blocks_on_stack`
(after it, before ``LowerTVMBuiltin``) sets TVM's own opt-out, the ``disable_lower_builtin``
allocation annotation, on those buffers' allocations when they hold at most
`TILE_BLOCK_BYTES` (an AMX call's 2x2 accumulator tiles, stored to and loaded from the
stack). Both run in `tirbyoc.offloading.lowering`'s pipeline.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import iter_blocks, tirx, tvm_ffi
from tirbyoc.dtypes import dtype_bytes

REGISTER_BLOCKS_ATTR = "tirbyoc.register_blocks"  # function attribute: the accumulator buffers' names
WRITEBACK_ATTR = "tirbyoc.writeback"  # marks the register block's write-back (set by `tirbyoc.rewrite.cpu.register_blocks`)
DISABLE_LOWER_BUILTIN = "disable_lower_builtin"  # TVM's allocation annotation: leave it an alloca
REGISTER_BLOCK_BYTES = 2048  # 32 zmm registers: no register block is larger
TILE_BLOCK_BYTES = 4096  # a call's output kept as a block of its own: AMX's four accumulator tiles
CALL_BLOCK_BYTES = 32 * 512 * 4  # ... for a kernel that pads blocks to its call tile: an AMX call's 32 x 512 int32


def mark_register_blocks(func):
    """``func`` with `REGISTER_BLOCKS_ATTR` naming the allocated buffers its register blocks'
    write-backs read (unchanged when it has none)."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    blocks = list(iter_blocks(func.body))
    allocated = {b.name for blk in blocks for b in blk.alloc_buffers}
    names = sorted({r.source.name for blk in blocks if WRITEBACK_ATTR in blk.annotations
                    for r in blk.reads if r.source.name in allocated})
    return func.with_attr(REGISTER_BLOCKS_ATTR, names) if names else func


def _on_stack(names: set[str]):
    def visit(node):
        buf = node.buffer
        if buf.name not in names or str(buf.scope()) != "global" \
                or not all(isinstance(d, tirx.IntImm) for d in buf.shape):
            return node
        if prod(int(d) for d in buf.shape) * dtype_bytes(str(buf.dtype)) > CALL_BLOCK_BYTES:
            return node
        annotations = {**dict(node.annotations or {}), DISABLE_LOWER_BUILTIN: tirx.IntImm("bool", 1)}
        return tirx.AllocBuffer(buf, annotations, node.span)

    return visit


def keep_register_blocks_on_stack(func):
    """``func`` (lowered) with the allocations `mark_register_blocks` named left on the stack
    (see the module's docstring); other functions come back unchanged."""
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None or REGISTER_BLOCKS_ATTR not in func.attrs:
        return func
    names = {str(n) for n in func.attrs[REGISTER_BLOCKS_ATTR]}
    body = tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, _on_stack(names))])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["CALL_BLOCK_BYTES", "REGISTER_BLOCKS_ATTR", "REGISTER_BLOCK_BYTES", "TILE_BLOCK_BYTES", "keep_register_blocks_on_stack",
           "mark_register_blocks"]
