"""GPU staging for warp-level intrinsics (tensor-core fragments): the CUDA schedule.

Where the group declares a tensor-core kernel and it fits the block (a plain GEMM a block
tile divides), the block is scheduled as that kernel (`tirbyoc.rewrite.block.tensor_core`: many
warps, ldmatrix + mma.sync, a cp.async pipeline). Otherwise, the one-warp schedule below.

A WMMA-style template computes on fragments (``wmma.matrix_a/b``, ``wmma.accumulator``)
that its load intrinsics fill from shared memory and its store intrinsic drains to global.
The rewrite gives each thread block one warp that owns ``bm x bn`` output tiles (fragments
reused across the reduction, ``bm + bn`` loads per ``bm * bn`` MMAs):

    blockIdx.y, blockIdx.x over warp tiles:
        acc fragments = 0
        for k tiles:
            A, B tiles: global -> shared (the warp's 32 threads copy) -> fragments (load)
            bm x bn mma_sync
        acc fragments -> global (store)

All with TVM's primitives (`cache_read`/`cache_write` into the template's scopes,
`compute_at`, `bind`) and every copy tensorized with the group's own intrinsics.
"""

from __future__ import annotations

from tirbyoc.decl.tensor_core import WARP
from tirbyoc.errors import RewriteError
from tirbyoc.ir.tir_walk import loop_extent
from tirbyoc.rewrite.foundation.state import Loops, RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind
from tirbyoc.rewrite.block.tensor_core import apply_kernel


def _per_warp(tiles: int | None, most: int = 2) -> int:
    """Output tiles one warp keeps along an axis: the largest divisor up to ``most`` (one
    where the tile count is known only at run time: a symbolic M padded to the tile)."""
    if tiles is None:
        return 1
    return max(d for d in range(1, most + 1) if tiles % d == 0)


def _copy_intrinsic(group, src_scope: str, dst_scope: str, dtype: str):
    for intrin in (*group.loads, *((group.store,) if group.store is not None else ())):
        (s, d) = intrin.operands[:2]
        if (s.scope, d.scope) == (src_scope, dst_scope) and s.dtype == dtype:
            return intrin
    raise RewriteError(f"the template's group {group.name!r} has no copy {src_scope} -> "
                       f"{dst_scope} for {dtype}")


def stage_fragments(state: RewriteState) -> RewriteState | None:
    """The warp schedule above, after tiling: one warp per thread block, its output tiles'
    fragments kept across the reduction, input tiles staged through shared memory."""
    if not state.fragment_operands:
        return None
    sch, m, loops = state.sch, state.match, state.loops
    group = m.group
    if group is None or not group.loads or group.store is None:
        raise RewriteError(f"{state.where}: a fragment intrinsic needs its group's loads and store "
                           "to move tiles in and out")
    if len(loops.axis_spatial) != 2 or len(loops.axis_reduce) != 1:
        raise RewriteError(f"{state.where}: the CUDA schedule expects an (i, j, k) intrinsic")
    if group.kernel is not None:
        why_not = apply_kernel(state)
        if why_not is None:
            return state
        state.record(StepKind.SCHEDULE, f"one warp per block (the tensor-core kernel does not fit: {why_not})")
    io, jo = loops.axis_spatial
    bm, bn = _per_warp(loop_extent(sch, io)), _per_warp(loop_extent(sch, jo))
    with state.step(StepKind.SPLIT, f"one warp per block computing {bm}x{bn} "
                                    f"{m.intrinsic.name.split('.')[-1]} tiles"):
        io_o, io_i = sch.split(io, [None, bm])
        jo_o, jo_i = sch.split(jo, [None, bn])
        sch.reorder(*loops.outer_spatial, io_o, jo_o, *loops.outer_reduce, *loops.axis_reduce,
                    io_i, jo_i, *loops.inner)
        rows = sch.fuse(*loops.outer_spatial, io_o) if loops.outer_spatial else io_o
        sch.bind(rows, "blockIdx.y")
        sch.bind(jo_o, "blockIdx.x")
    k_loops = loops.outer_reduce + [loops.axis_reduce[0]]
    for op in m.operands:
        state.fragment_copies.append(_stage_operand(state, op, jo_o, k_loops))
    state.loops = Loops([rows, jo_o], loops.outer_reduce, [io_i, jo_i], [loops.axis_reduce[0]],
                        loops.inner, loops.outer_names)
    return state


def _stage_operand(state: RewriteState, op, warp_loop, k_loops) -> tuple:
    """Stage one operand: the output accumulates in its fragment and is stored after the
    reduction; an input goes global -> shared (the warp's 32 threads copy) -> fragment per k
    tile. Returns (the copy into or out of the fragment, the intrinsic that tensorizes it)."""
    sch, m, group = state.sch, state.match, state.match.group
    kind = "write" if op.is_output else "read"
    src = state.feeding(op, kind)
    if op.is_output:
        with state.step(StepKind.STAGE, f"accumulate {op.operand} in {op.scope}, store after the "
                                        "reduction", op.operand):
            frag = sch.cache_write(state.block, state.region(kind, src), op.scope)
            sch.reverse_compute_at(frag, warp_loop)
        dtype = m.intrinsic.operand(op.operand).dtype
        return frag, _copy_intrinsic(group, op.scope, op.workload_scope, dtype)
    load = next(i for i in group.loads if i.operands[1].scope == op.scope)
    shared = load.operands[0].scope
    with state.step(StepKind.STAGE, f"stage {op.operand} through {shared} into {op.scope} per k "
                                    "tile", op.operand):
        frag = sch.cache_read(state.block, state.region(kind, src), op.scope)
        staged = sch.cache_read(frag, 0, shared)
        sch.compute_at(frag, k_loops[-1])
        sch.compute_at(staged, k_loops[-1])
        around = 2 + len(k_loops)  # blockIdx.y, blockIdx.x, the reduction loops
        fused = sch.fuse(*sch.get_loops(staged)[around:])
        _, lane = sch.split(fused, [None, WARP])
        sch.bind(lane, "threadIdx.x")
    return frag, _copy_intrinsic(group, shared, op.scope, load.operands[0].dtype)


def tensorize_fragment_copies(state: RewriteState) -> RewriteState | None:
    """Cut each fragment copy into 16x16 tiles and tensorize it with its intrinsic."""
    if not state.fragment_copies:
        return None
    sch = state.sch
    for block, intrin in state.fragment_copies:
        rows, cols = intrin.operands[0].shape
        r, c = sch.get_loops(block)[-2:]
        ro, ri = sch.split(r, [None, rows])
        co, ci = sch.split(c, [None, cols])
        sch.reorder(ro, co, ri, ci)
        intrin.register()
        with state.step(StepKind.TENSORIZE, f"tensorize the copy into {intrin.operands[1].scope} "
                                            f"with {intrin.name}"):
            sch.tensorize(ri, intrin.name)
        state.copy_intrinsics.append(intrin.name)
    return state


__all__ = ["stage_fragments", "tensorize_fragment_copies"]
