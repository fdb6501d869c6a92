"""tirbyoc's TIR pipeline: TVM's default lowering, then the passes an offloaded function needs
that TVM has no hook for. Every build of offloaded code goes through it (`PIPELINE`, for
``tvm.compile(..., tir_pipeline=PIPELINE)``); a function without tirbyoc's attributes comes
out as TVM's default pipeline leaves it.

* `tirbyoc.rewrite.functions.double_buffer.version_tiles`: two versions of each scratchpad tile the
  rewrite marked for double buffering.

* `tirbyoc.rewrite.cpu.stack.keep_register_blocks_on_stack`: the register blocks of accumulators
  left on the stack (in registers) where TVM would move a buffer of 1 KiB or more to the heap.

* `tirbyoc.rewrite.cpu.byte_lookup.vector_byte_lookups`: a vector of lookups into a 256-entry
  byte table (`tirbyoc.relax.byte_tables`) as two ``vpermi2b`` and a blend, not a byte at a time
  (AVX-512 VBMI targets);

* `tirbyoc.rewrite.cpu.cpu_epilogue.fence_products`: the float products of an epilogue fused
  into a write-back rounded before they are added (no fused multiply-add that TVM's own
  build of the unfused blocks would not make), in the loop nests that

and, before TVM's lowering, on the scheduled functions:

* `tirbyoc.rewrite.cpu.cpu_epilogue.mark_writebacks` marks (the write-backs, by their block
  annotation, which TVM's lowering drops);
* `tirbyoc.rewrite.cpu.prefetch.insert_weight_prefetches`: the prefetches of the next weight
  tiles that the CPU schedule asked for (a loop annotation) added to the tensorized blocks;
* `tirbyoc.rewrite.cpu.row_bounds.simplify_row_bounds`: the bounds checks of fused run-time
  rows (``r // seq < batch``) without a division (``r < batch * seq``);
* `tirbyoc.rewrite.cpu.run_time_rows.skip_padded_row_blocks`: each register block of a row
  count known at run time run on its real rows only (a loop annotation);
* `tirbyoc.rewrite.cpu.vector_tails.split_predicated_vectors`: a vectorized write-back
  predicated per lane (padding known at run time) given a whole-vector version for where every
  lane is real;
* `tirbyoc.rewrite.cpu.stack.mark_register_blocks` names the register blocks' buffers (by their
  write-backs' annotation) for the pass after the lowering that keeps them on the stack.
"""

from __future__ import annotations

from tirbyoc._tvm import register_tir_pipeline, tirx
from tirbyoc.rewrite.cpu.byte_lookup import vector_byte_lookups
from tirbyoc.rewrite.cpu.cpu_epilogue import fence_products, mark_writebacks
from tirbyoc.rewrite.functions.double_buffer import version_tiles
from tirbyoc.rewrite.cpu.prefetch import insert_weight_prefetches
from tirbyoc.rewrite.cpu.row_bounds import simplify_row_bounds
from tirbyoc.rewrite.cpu.run_time_rows import skip_padded_row_blocks
from tirbyoc.rewrite.cpu.stack import keep_register_blocks_on_stack, mark_register_blocks
from tirbyoc.rewrite.cpu.vector_tails import split_predicated_vectors
from tirbyoc.rewrite.foundation.pipeline import Stage, dump_after

PIPELINE = "tirbyoc"

# on the scheduled functions, before TVM's lowering (blocks still there)
BEFORE_LOWERING = (
    Stage("mark write-backs", mark_writebacks, "the write-backs marked by their block annotation"),
    Stage("prefetch weights", insert_weight_prefetches, "the next weight tiles' prefetches the schedule asked for"),
    # before the two after it: both read the write-back's predicate
    Stage("row bounds", simplify_row_bounds, "fused run-time rows' bounds checks without a division"),
    Stage("skip padded rows", skip_padded_row_blocks, "each run-time row block run on its real rows only"),
    # after it: it finds a block's real rows from its write-back's predicate
    Stage("whole vectors", split_predicated_vectors, "predicated vector loops whole where every lane is real"),
    Stage("mark register blocks", mark_register_blocks, "the register blocks' buffers named by their write-backs"),
)
# after TVM's lowering (before its host finalisation)
AFTER_LOWERING = (
    Stage("version tiles", version_tiles, "two versions of each scratchpad tile marked for double buffering"),
    Stage("register blocks on stack", keep_register_blocks_on_stack, "register blocks kept off the heap"),
    Stage("fence products", fence_products, "a fused epilogue's float products rounded before they are added"),
    Stage("byte lookups", vector_byte_lookups, "vector lookups into 256-entry byte tables as vpermi2b"),
)


def as_pass(stage: Stage):
    """``stage`` as a TVM PrimFunc pass (named ``tirbyoc.<stage>``), dumped as every pipeline's
    stages are (`tirbyoc.rewrite.foundation.pipeline`) where it changed the function."""
    def apply(func, _mod, _ctx):
        out = stage.fn(func)
        if not out.same_as(func):
            name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"
            dump_after(f"lowering.{name}", stage.name, out.script)
        return out

    return tirx.transform.prim_func_pass(apply, opt_level=0, name=f"tirbyoc.{stage.name.replace(' ', '_')}")


def tirbyoc_passes() -> list:
    """The passes run after TVM's default lowering (before its host finalisation)."""
    return [as_pass(s) for s in AFTER_LOWERING]


def tirbyoc_pre_passes() -> list:
    """The passes run before TVM's default lowering (blocks still there)."""
    return [as_pass(s) for s in BEFORE_LOWERING]


register_tir_pipeline(PIPELINE, tirbyoc_passes, tirbyoc_pre_passes)

__all__ = ["AFTER_LOWERING", "BEFORE_LOWERING", "PIPELINE", "as_pass", "tirbyoc_passes", "tirbyoc_pre_passes"]
