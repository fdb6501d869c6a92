"""The fast tensor-core kernel: ldmatrix + mma.sync, many warps, a cp.async pipeline.

Where a group declares a `TensorCoreKernel` and one of its block tiles fits the block, the
"fragments" stage schedules the GEMM as the kernels a cuBLAS user gets, not one warp per block:

    blockIdx.x over (batch, C's block tiles):                 block_m x block_n outputs
      threadIdx.z, threadIdx.y over warps_m x warps_n warps:  each keeps its C tiles in registers
        accumulators = 0                                      (mma fill)
        for k0 in K / block_k:                                software-pipelined, `stages` deep
          A, B tiles: global -> shared.dyn, 16 bytes a thread (cp.async), XOR-swizzled
          for k1 in block_k / mma_k:
            A, B fragments: shared -> registers (ldmatrix; .trans for a [K, N] fp16 B)
            mma.sync on every (i, j) fragment pair of the warp
      C tiles: registers -> shared.dyn -> global, 16 bytes a thread

Everything is TVM's own: the schedule primitives, the ``permuted_layout`` and
``software_pipeline_*`` annotations its lowering acts on (cp.async needs the build option
``tirx.use_async_copy``, set by `tirbyoc._tvm.build` for CUDA targets), and the intrinsics of
``tvm.s_tir.tensor_intrin.cuda`` (``get_mma_intrin_group``, imported on first use: ~15 s). The block must be a plain GEMM:
A[(b,) i, k], B[(b,) k, j] or B[(b,) j, k], C[(b,) i, j] in the kernel's types, static sizes
that the chosen block tile divides; `fit` says why not otherwise, and the caller keeps the
one-warp schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tirbyoc._tvm import TensorIntrin, cuda_intrinsics
from tirbyoc.decl.tensor_core import WARP, BlockTiling, TensorCoreKernel
from tirbyoc.decl.tvm_registry import register_tensor_intrin
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.rewrite.block.gemm_form import (VECTOR_BYTES, fold_staged_inputs, fold_window, inline_consumers, inline_into_copy,
                                       pad_waste, padded, squeeze, whole_loops)
from tirbyoc.rewrite.foundation.state import RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind

SHARED_DYN = "shared.dyn"


@dataclass(frozen=True)
class KernelPlan:
    """What `fit` found: the kernel, its block tile, B's layout and the GEMM's sizes."""

    kernel: TensorCoreKernel
    tiling: BlockTiling
    b_layout: str  # "kn" or "nk"
    raster: int  # block rows per group in the thread blocks' order (1: row order)
    m: int
    n: int
    k: int
    batch: int

    @property
    def padded(self) -> tuple[int, int, int]:
        """(M, N, K) rounded up to the block tile (the sizes themselves where it divides them)."""
        t = self.tiling
        return padded(self.m, t.block_m), padded(self.n, t.block_n), padded(self.k, t.block_k)

    @property
    def blocks(self) -> int:
        m, n, _ = self.padded
        return self.batch * (m // self.tiling.block_m) * (n // self.tiling.block_n)


def _plain_indices(region) -> list[str] | None:
    """The block iterator each dimension of ``region`` is indexed by, or None when an index is
    anything but one iterator (an offset, a sum: a window, not a plain GEMM operand). A
    dimension of size 1 read at 0 (a batch of one whose loop the layout folded away) is left
    out."""
    names = []
    for r, size in zip(region.region, region.source.shape):
        if int(r.extent) != 1:
            return None
        if hasattr(r.min, "name"):
            names.append(str(r.min.name))
        elif not (_is_zero(r.min) and _is_zero(size - 1)):
            return None
    return names


def _is_zero(expr) -> bool:
    return hasattr(expr, "value") and int(expr.value) == 0


def _operand_layouts(state: RewriteState) -> tuple[str | None, str]:
    """(B's layout "kn" / "nk", or None with the reason the block is not a plain GEMM)."""
    block = state.sch.get(state.block)
    names = [str(iv.var.name) for iv in block.iter_vars]
    *outer, vi, vj, vk = names
    by_buffer = {str(r.source.name): _plain_indices(r) for r in block.reads}
    out = _plain_indices(block.writes[0])
    ops = {op.operand: op for op in state.match.operands}
    want_a = outer + [vi, vk]
    a = by_buffer.get(state.feeding(ops["A"], "read"))
    b = by_buffer.get(state.feeding(ops["B"], "read"))
    if out != outer + [vi, vj]:
        return None, "C is not written as C[(b,) i, j]"
    if a != want_a:
        return None, "A is not read as A[(b,) i, k]"
    # B per batch, or one B for the whole batch (a weight: A[b, i, k] . W[k, j])
    if b in (outer + [vk, vj], [vk, vj]):
        return "kn", ""
    if b in (outer + [vj, vk], [vj, vk]):
        return "nk", ""
    return None, "B is not read as B[(b,) k, j] or B[(b,) j, k]"


def _sizes(state: RewriteState) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of the block, or None when one is known only at run time."""
    block = state.sch.get(state.block)
    extents = []
    for iv in block.iter_vars:
        if not hasattr(iv.dom.extent, "value"):
            return None
        extents.append(int(iv.dom.extent.value))
    *outer, m, n, k = extents
    return prod(outer), m, n, k


MOST_PADDING = 1.125  # padded work / real work a tile may cost before a smaller tile is taken


def _choose_tiling(kernel: TensorCoreKernel, batch: int, m: int, n: int, k: int) -> BlockTiling:
    """The first declared tile that divides the GEMM and leaves ``min_blocks`` thread blocks;
    else the first that leaves them with at most 12.5% padded work; else the last that
    divides it; else the one that pads least."""
    def blocks(t):
        return batch * (padded(m, t.block_m) // t.block_m) * (padded(n, t.block_n) // t.block_n)

    def waste(t):
        return pad_waste((m, n, k), (t.block_m, t.block_n, t.block_k))

    fitting = [t for t in kernel.tilings if t.divides(m, n, k)]
    enough = [t for t in kernel.tilings if blocks(t) >= kernel.min_blocks]
    return (next((t for t in fitting if t in enough), None)
            or next((t for t in enough if waste(t) <= MOST_PADDING), None)
            or (fitting[-1] if fitting else min(kernel.tilings, key=waste)))


def fit(state: RewriteState) -> KernelPlan | str:
    """The plan for this block, or why the group's kernel does not take it."""
    group = state.match.group
    kernel = group.kernel if group is not None else None
    if kernel is None:
        return "the group declares no tensor-core kernel"
    dtypes = {op.operand: str(state.match.intrinsic.operand(op.operand).dtype) for op in state.match.operands}
    if (dtypes.get("A"), dtypes.get("B"), dtypes.get("C")) != (kernel.in_dtype, kernel.in_dtype, kernel.acc_dtype):
        return f"the kernel is declared for {kernel.in_dtype} -> {kernel.acc_dtype}"
    sizes = _sizes(state)
    if sizes is None:
        return "a size is known only at run time"
    batch, m, n, k = sizes
    b_layout, why = _operand_layouts(state)
    if b_layout is None:
        return why
    if b_layout not in kernel.b_layouts:
        return (f"B is [{'K, N' if b_layout == 'kn' else 'N, K'}]; the kernel's {kernel.in_dtype} ldmatrix "
                f"reads B only as {' or '.join(kernel.b_layouts)}")
    tiling = _choose_tiling(kernel, batch, m, n, k)
    shared = state.template.scope(SHARED_DYN, missing_ok=True) if state.template is not None else None
    need = kernel.shared_bytes(tiling, dtype_bytes(kernel.in_dtype), dtype_bytes(kernel.acc_dtype))
    if shared is None or (shared.capacity is not None and need > shared.capacity):
        return f"the {tiling.describe()} tile needs {need} bytes of {SHARED_DYN}; the template declares " \
               f"{shared.capacity if shared else 0}"
    rows = padded(m, tiling.block_m) // tiling.block_m
    raster = kernel.raster if kernel.raster > 1 and rows % kernel.raster == 0 else 1
    return KernelPlan(kernel, tiling, b_layout, raster, m, n, k, batch)


def _tvm_intrinsics(plan: KernelPlan) -> dict:
    """TVM's mma intrinsic group for this kernel (init, load_a, load_b, compute, store),
    registering the shared.dyn forms TVM 0.27 declares but does not register (int8's)."""
    tc = cuda_intrinsics()
    kern = plan.kernel
    kdim, nk = kern.mma_shape[2], plan.b_layout == "nk"
    names = tc.get_mma_intrin_group(SHARED_DYN, SHARED_DYN, kern.in_dtype, kern.acc_dtype, False, nk)
    pairs = {names["load_a"]: lambda: tc.get_ldmatrix_intrin(kdim, kern.in_dtype, "A", False, SHARED_DYN),
             names["load_b"]: lambda: tc.get_ldmatrix_intrin(kdim, kern.in_dtype, "B", nk, SHARED_DYN),
             names["store"]: lambda: tc.get_mma_store_intrin(kern.acc_dtype, 8, SHARED_DYN, False)}
    for name, make in pairs.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            register_tensor_intrin(name, *make())
    return names


def _fragment_layout(plan: KernelPlan, operand: str):
    """(rows, cols, the 16 x k tile -> (lane, element) map ldmatrix leaves in registers) of an
    operand's fragment, as TVM's intrinsics declare it."""
    tc = cuda_intrinsics()
    tm, _, tk = plan.kernel.mma_shape
    if tk == 16:
        rows, cols = (tk, tm) if operand == "B" and plan.b_layout == "kn" else (tm, tk)
        return rows, cols, tc.shared_16x16_to_ldmatrix_32x8_layout
    if operand == "B" and plan.b_layout == "kn":
        return tk, tm, tc.shared_32x16_to_ldmatrix_32x16_layout
    return tm, tk, tc.shared_16x32_to_ldmatrix_32x16_layout


def _gemm_loops(state: RewriteState, plan: KernelPlan):
    """The whole (i, j, k) axes padded to the block tile where it does not divide them
    (``pad_einsum``), cut into the kernel's mma tiles; the mma tile blockized. Returns
    (outer loops, i, j, k, tile block)."""
    sch, t = state.sch, plan.tiling
    outer = len(sch.get(state.block).iter_vars) - 3
    if plan.padded != (plan.m, plan.n, plan.k):
        sch.pad_einsum(state.block, [1] * outer + [t.block_m, t.block_n, t.block_k])
    *outer_loops, i, j, k = sch.get_loops(state.block)[-(outer + 3):]
    tm, tn, tk = plan.kernel.mma_shape
    i, i_in = sch.split(i, [None, tm])
    j, j_in = sch.split(j, [None, tn])
    k, k_in = sch.split(k, [None, tk])
    sch.reorder(i, j, k, i_in, j_in, k_in)
    tile = sch.blockize(i_in)
    return outer_loops, i, j, k, tile


def _block_and_warps(sch, plan: KernelPlan, outer, i, j, k):
    """Cut i, j, k into (block, warp, per-warp) and bind them; returns (block axis, k0, k1)."""
    t, (tm, tn, tk) = plan.tiling, plan.kernel.mma_shape
    i0, i1, i2 = sch.split(i, [None, t.warps_m, t.block_m // t.warps_m // tm])
    j0, j1, j2 = sch.split(j, [None, t.warps_n, t.block_n // t.warps_n // tn])
    k0, k1 = sch.split(k, [None, t.block_k // tk])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    if plan.raster > 1:  # groups of `raster` block rows, walked column by column
        group, i0 = sch.split(i0, [None, plan.raster])
        sch.reorder(group, j0, i0)
        bx = sch.fuse(*outer, group, j0, i0)
    else:
        bx = sch.fuse(*outer, i0, j0)
    sch.bind(bx, "blockIdx.x")
    sch.bind(i1, "threadIdx.z")
    sch.bind(j1, "threadIdx.y")
    return bx, k0, k1


def _threads_copy(sch, block, plan: KernelPlan, elem_bytes: int) -> None:
    """A shared-memory tile copy spread over the block's threads, 16 bytes per thread access."""
    t = plan.tiling
    fused = sch.fuse(*sch.get_loops(block)[-2:])
    _, tz, ty, tx, vec = sch.split(fused, [None, t.warps_m, t.warps_n, WARP, VECTOR_BYTES // elem_bytes])
    sch.bind(tz, "threadIdx.z")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)


def _stage_input(state: RewriteState, plan: KernelPlan, tile, operand: str, k0, k1):
    """One input: global -> shared.dyn per k0 step (swizzled or padded), shared -> ldmatrix
    fragments per k1 step. Returns the fragment copy block (tensorized later)."""
    sch, kern = state.sch, plan.kernel
    op = next(o for o in state.match.operands if o.operand == operand)
    index = [str(r.source.name) for r in sch.get(tile).reads].index(state.feeding(op, "read"))
    shared = sch.cache_read(tile, index, SHARED_DYN)
    squeeze(sch, shared)
    inline_into_copy(sch, shared)
    sch.compute_at(shared, k0)
    _threads_copy(sch, shared, plan, dtype_bytes(kern.in_dtype))
    if kern.swizzle:
        sch.annotate(shared, "permuted_layout", f"g2s_{operand}")
    else:
        sch.storage_align(shared, 0, axis=-2, factor=16, offset=kern.pad)
    frag = sch.cache_read(tile, index, "warp")
    sch.compute_at(frag, k1)
    rows, cols, lane_map = _fragment_layout(plan, operand)
    r, c = sch.get_loops(frag)[-2:]
    r0, r1 = sch.split(r, [None, rows])
    c0, c1 = sch.split(c, [None, cols])
    sch.reorder(r0, c0, r1, c1)
    sch.transform_layout(frag, ("write", 0), lambda *ix: (
        *ix[:-2], ix[-2] // rows, ix[-1] // cols, *lane_map(ix[-2] % rows, ix[-1] % cols)))
    if kern.swizzle:
        sch.annotate(sch.blockize(sch.get_loops(frag)[-2]), "permuted_layout", f"s2l_{operand}")
    return frag


def _stage_output(state: RewriteState, plan: KernelPlan, tile, bx):
    """C: mma accumulators -> shared.dyn (per warp, in the fragment layout) -> global, 16 bytes
    a thread. Returns the register -> shared copy block (tensorized later)."""
    sch, t, (tm, tn, _) = state.sch, plan.tiling, plan.kernel.mma_shape
    out = sch.cache_write(tile, 0, SHARED_DYN)
    fused = inline_consumers(sch, out)
    if fused:
        state.record(StepKind.EPILOGUE, f"{', '.join(fused)} fused into C's write to global")
    sch.reverse_compute_at(out, bx)
    _threads_copy(sch, out, plan, dtype_bytes(plan.kernel.acc_dtype))
    sch.annotate(out, "permuted_layout", "s2g_C")
    regs = sch.cache_write(tile, 0, "warp")
    r, c = sch.get_loops(regs)[-2:]
    r1, r2, r3 = sch.split(r, [t.warps_m, None, tm])
    c1, c2, c3 = sch.split(c, [t.warps_n, None, tn])
    sch.reorder(r1, c1, r2, c2, r3, c3)
    sch.bind(r1, "threadIdx.z")
    sch.bind(c1, "threadIdx.y")
    tc = cuda_intrinsics()
    sch.transform_layout(regs, ("read", 0), lambda *ix: (
        *ix[:-2], ix[-2] // tm, ix[-1] // tn, *tc.shared_16x16_to_ldmatrix_32x8_layout(ix[-2] % tm, ix[-1] % tn)))
    sch.annotate(sch.blockize(sch.get_loops(regs)[-2]), "permuted_layout", "l2s_C")
    return regs


def _tensorize_all(state: RewriteState, plan: KernelPlan, tile, k0, k1, frags, regs) -> list[str]:
    """The init split off at k0; fill, ldmatrix, mma and the accumulator store tensorized with
    TVM's intrinsics; the k0 loop software-pipelined (cp.async for the shared copies), and the
    k1 loop too where the kernel double-buffers its fragments (ldmatrix one step ahead)."""
    sch = state.sch
    names = _tvm_intrinsics(plan)
    init = sch.get_child_blocks(sch.decompose_reduction(tile, k0))[0]
    sch.tensorize(sch.get_loops(init)[-2], names["init"])
    sch.tensorize(sch.get_loops(frags["A"])[-2], names["load_a"])
    sch.tensorize(sch.get_loops(frags["B"])[-2], names["load_b"])
    sch.tensorize(sch.get_loops(state.block)[-3], names["compute"])
    sch.tensorize(sch.get_loops(regs)[-2], names["store"])
    # k0's body: A's and B's shared copies, then the k1 loop - which the inner pipeline, injected
    # first, turns into three statements (its prologue, steady state and epilogue)
    computes = 3 if plan.kernel.fragment_pipeline else 1
    sch.annotate(k0, "software_pipeline_stage", [0, 0] + [plan.kernel.stages] * computes)
    sch.annotate(k0, "software_pipeline_order", list(range(2 + computes)))
    sch.annotate(k0, "software_pipeline_async_stages", [0])
    if plan.kernel.fragment_pipeline:
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    return [names[r] for r in ("compute", "init", "load_a", "load_b", "store")]


def apply_kernel(state: RewriteState) -> str | None:
    """Schedule the block as its group's tensor-core kernel; None when done, else why not
    (the state then is as it was, for the one-warp schedule)."""
    if len(state.loops.axis_spatial) != 2 or len(state.loops.axis_reduce) != 1:
        return "the kernel expects an (i, j, k) intrinsic"
    saved = state.sch
    state.sch = saved.copy()  # the copy keeps the block and loop handles
    try:
        why, note = _gemm_form(state)
    except Exception as err:  # noqa: BLE001 - TVM refuses an inline or a re-layout with its own error kinds
        why, note = f"the block could not be put in GEMM form ({type(err).__name__}: {str(err)[-160:]})", ""
    plan = why or fit(state)
    if isinstance(plan, str):
        state.sch = saved
        return plan
    steps, used = len(state.steps), len(state.intrinsics)
    try:
        if note:
            state.record(StepKind.IN_PLACE, note)
        schedule_kernel(state, plan)
    except Exception as err:  # noqa: BLE001 - a primitive TVM refuses here leaves the one-warp schedule
        state.sch = saved
        del state.steps[steps:], state.intrinsics[used:]
        state.compute_tensorized = False
        return f"TVM refused a step of its schedule ({type(err).__name__}: {str(err).strip()[-160:]})"
    return None


def _gemm_form(state: RewriteState) -> tuple[str | None, str]:
    """Whole i, j, k loops over a plain GEMM block: a window folded into K (the staged copies
    then stay, to be read in place by the shared-memory copies), else the staged copies of the
    inputs folded back. Returns (why not, or None; what was done, for the steps)."""
    if state.loops.outer_reduce:
        whole_loops(state)
        why = fold_window(state)
        return why, "" if why else "the window folded into K: the convolution runs as an implicit GEMM"
    folded = fold_staged_inputs(state)
    whole_loops(state)
    note = f"{' and '.join(folded)} read in place by the tensor-core kernel (the staged copy folded back)"
    return None, note if folded else ""


def schedule_kernel(state: RewriteState, plan: KernelPlan) -> None:
    """Carry out ``plan`` on the state's block (see the module's docstring); records its steps."""
    sch, t = state.sch, plan.tiling
    order = f", in groups of {plan.raster} block rows" if plan.raster > 1 else ""
    with state.step(StepKind.SPLIT, f"tensor-core kernel: {t.describe()}, {plan.blocks} thread blocks{order}"):
        outer, i, j, k, tile = _gemm_loops(state, plan)
        bx, k0, k1 = _block_and_warps(sch, plan, outer, i, j, k)
    how = "XOR-swizzled" if plan.kernel.swizzle else f"rows padded by {plan.kernel.pad}"
    with state.step(StepKind.STAGE, f"A and B through {SHARED_DYN} ({how}, 16-byte copies) into ldmatrix "
                                    f"fragments; B read as [{'K, N' if plan.b_layout == 'kn' else 'N, K'}]"):
        frags = {name: _stage_input(state, plan, tile, name, k0, k1) for name in ("A", "B")}
    with state.step(StepKind.STAGE, f"C from registers through {SHARED_DYN} to global"):
        regs = _stage_output(state, plan, tile, bx)
    ahead = ", ldmatrix one mma step ahead" if plan.kernel.fragment_pipeline else ""
    with state.step(StepKind.TENSORIZE, f"ldmatrix + mma.sync, a {plan.kernel.stages + 1}-buffer cp.async "
                                        f"pipeline over K{ahead}"):
        state.intrinsics.extend(_tensorize_all(state, plan, tile, k0, k1, frags, regs))
    state.compute_tensorized = True


__all__ = ["KernelPlan", "apply_kernel", "fit", "schedule_kernel"]
