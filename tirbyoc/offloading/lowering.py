"""tirbyoc's TIR pipeline: TVM's default lowering, then the passes an offloaded function needs
that TVM has no hook for. Every build of offloaded code goes through it (`PIPELINE`, for
``tvm.compile(..., tir_pipeline=PIPELINE)``); a function without tirbyoc's attributes comes
out as TVM's default pipeline leaves it.

* `tirbyoc.rewrite.functions.double_buffer.version_tiles`: two versions of each scratchpad tile the
  rewrite marked for double buffering.

* `tirbyoc.rewrite.cpu.stack.keep_register_blocks_on_stack`: the register blocks of accumulators
  left on the stack (in registers) where TVM would move a buffer of 1 KiB or more to the heap.

* `tirbyoc.rewrite.cpu.cpu_epilogue.fence_products`: the float products of an epilogue fused
  into a write-back rounded before they are added (no fused multiply-add that TVM's own
  build of the unfused blocks would not make), in the loop nests that

and, before TVM's lowering, on the scheduled functions:

* `tirbyoc.rewrite.cpu.cpu_epilogue.mark_writebacks` marks (the write-backs, by their block
  annotation, which TVM's lowering drops);
* `tirbyoc.rewrite.cpu.prefetch.insert_weight_prefetches`: the prefetches of the next weight
  tiles that the CPU schedule asked for (a loop annotation) added to the tensorized blocks;
* `tirbyoc.rewrite.cpu.stack.mark_register_blocks` names the register blocks' buffers (by their
  write-backs' annotation) for the pass after the lowering that keeps them on the stack.
"""

from __future__ import annotations

from tirbyoc._tvm import register_tir_pipeline, tirx
from tirbyoc.rewrite.cpu.cpu_epilogue import fence_products, mark_writebacks
from tirbyoc.rewrite.functions.double_buffer import version_tiles
from tirbyoc.rewrite.cpu.prefetch import insert_weight_prefetches
from tirbyoc.rewrite.cpu.stack import keep_register_blocks_on_stack, mark_register_blocks

PIPELINE = "tirbyoc"


def tirbyoc_passes() -> list:
    """The passes run after TVM's default lowering (before its host finalisation)."""
    return [tirx.transform.prim_func_pass(version_tiles, opt_level=0, name="tirbyoc.VersionTiles"),
            tirx.transform.prim_func_pass(lambda f, _m, _c: keep_register_blocks_on_stack(f), opt_level=0,
                                          name="tirbyoc.RegisterBlocksOnStack"),
            tirx.transform.prim_func_pass(lambda f, _m, _c: fence_products(f), opt_level=0,
                                          name="tirbyoc.FenceProducts")]


def tirbyoc_pre_passes() -> list:
    """The passes run before TVM's default lowering (blocks still there)."""
    return [tirx.transform.prim_func_pass(lambda f, _m, _c: mark_writebacks(f), opt_level=0,
                                          name="tirbyoc.MarkWritebacks"),
            tirx.transform.prim_func_pass(lambda f, _m, _c: insert_weight_prefetches(f), opt_level=0,
                                          name="tirbyoc.PrefetchWeights"),
            tirx.transform.prim_func_pass(lambda f, _m, _c: mark_register_blocks(f), opt_level=0,
                                          name="tirbyoc.MarkRegisterBlocks")]


register_tir_pipeline(PIPELINE, tirbyoc_passes, tirbyoc_pre_passes)

__all__ = ["PIPELINE", "tirbyoc_passes", "tirbyoc_pre_passes"]
