"""The rewrite of one block, stage by stage: `STAGES`, written here once, each row the
function itself. A stage takes the rewrite's state and returns the state it changed, or None
when it does not apply (nothing to stage, no scratchpad, not a CUDA target). A new stage is a
function in the module of its kind and a row here, at its place."""

from __future__ import annotations

from tirbyoc.rewrite.block import cast_staging, cuda, dma, epilogue, stages, staging
from tirbyoc.rewrite.cpu import cpu_epilogue
from tirbyoc.rewrite.foundation.pipeline import Stage, run_in_order
from tirbyoc.rewrite.foundation.state import RewriteState

STAGES = (
    Stage("cast", cast_staging.stage_casts, "operands the block casts copied ahead in the dtype the intrinsic reads"),
    Stage("commute", stages.commute, "the multiply-add's operands in the intrinsic's order"),
    Stage("canonicalize", stages.canonicalize, "transform_block_layout to (outer loops, intrinsic axes)"),
    Stage("stage", staging.stage_operands, "a copy of every operand that cannot be read in place"),
    Stage("pad", staging.pad_and_pack, "pad_einsum to the intrinsic's widths; pack the reindexed copies"),
    Stage("tile", stages.tile, "split each intrinsic axis into tiles"),
    Stage("scratchpad", dma.stage_scratchpads, "tiles staged per tile into bounded scratchpads"),
    Stage("epilogue", epilogue.fuse_epilogue,
          "the chain after the core on its accumulator tile (an accelerator's ALU)"),
    Stage("fragments", cuda.stage_fragments,
          "the group's tensor-core kernel, or warp tiles and their fragment copies", ("cuda",)),
    Stage("schedule", stages.schedule_outer_loops,
          "the target's default schedule (register blocks, parallel loops) or the caller's"),
    Stage("dma copies", dma.tensorize_dma_copies, "tile copies tensorized with the template's DMA intrinsics"),
    Stage("fragment copies", cuda.tensorize_fragment_copies, "fragment copies tensorized in 16x16 tiles", ("cuda",)),
    Stage("cpu epilogue", cpu_epilogue.fuse_cpu_epilogue,
          "the chain after the core fused into the register block's write-back", ("llvm",)),
    Stage("decompose", stages.decompose, "the reduction's init split off"),
    Stage("tensorize", stages.tensorize_compute, "the compute tensorized with the intrinsic"),
    Stage("init", stages.tensorize_init, "the init tensorized with its intrinsic, where the template has one"),
    Stage("link", stages.link_libraries, "the result function, with the libraries it calls"),
)


def stage_names() -> list[str]:
    return [s.name for s in STAGES]


def rewrite(state: RewriteState) -> RewriteState:
    """Every stage of `STAGES` that serves the state's target, in order (dumped as
    `run_in_order` says, by the block's function and name)."""
    m = state.match

    def script(s: RewriteState) -> str:
        return (s.func if s.func is not None else s.sch.mod["main"]).script()

    return run_in_order(STAGES, state, lambda st, s: st.fn(s), target=state.target,
                        label=f"{m.function}.{m.block}", script=script)


__all__ = ["STAGES", "rewrite", "stage_names"]
