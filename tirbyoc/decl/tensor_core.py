"""`TensorCoreKernel`: how a GPU template's tensor cores are driven at full rate, declared.

A group of WMMA-shaped intrinsics (`IntrinsicGroup`) says *what* a warp computes on 16x16
fragments; it says nothing of the schedule that makes tensor cores fast. That schedule is a
handful of choices, which this record declares so that a template (``intrinsics/cuda_mma``)
states them as data and the rewrite (`tirbyoc.rewrite.block.tensor_core`) carries them out:

- the PTX instructions: ``ldmatrix`` from shared memory into registers in the fragment layout
  ``mma.sync`` reads, ``mma.sync`` itself (m16n8k16 for fp16, m16n8k32 for int8), named by
  TVM's own intrinsic group (``tvm.s_tir.tensor_intrin.cuda.get_mma_intrin_group``);
- the block tiles (`BlockTiling`), largest first: the first whose tile divides the workload
  and leaves enough thread blocks to fill the GPU is used;
- the software pipeline over the reduction (``stages`` tiles in flight, copied with
  ``cp.async``) and how shared memory avoids bank conflicts (``swizzle``: TVM's
  ``permuted_layout``; otherwise rows padded by ``pad`` elements);
- the weight layouts the instruction can read: int8's ``ldmatrix`` has no transposing form, so
  an int8 B operand must be [N, K] (``b_layouts=("nk",)``);
- the order thread blocks are numbered in (``raster``): 1 walks C's block tiles row by row;
  g > 1 walks groups of g block rows column by column, so that blocks running together share
  B's columns as well as A's rows in L2;
- whether the fragments are double-buffered in registers (``fragment_pipeline``): the
  ldmatrix of the next mma step issued before the current step's mma.sync, as TVM's
  MetaSchedule tensor-core rule and CUTLASS do, so shared-memory latency hides behind math.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirbyoc.errors import IntrinsicError

WARP = 32


@dataclass(frozen=True)
class BlockTiling:
    """One thread block's share of C: ``block_m x block_n`` outputs, ``block_k`` of the
    reduction per pipeline step, ``warps_m x warps_n`` warps (each ``block_m / warps_m`` x
    ``block_n / warps_n`` outputs held in registers across the whole reduction)."""

    block_m: int
    block_n: int
    block_k: int
    warps_m: int = 2
    warps_n: int = 2

    @property
    def size(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k}"

    def divides(self, m: int, n: int, k: int) -> bool:
        """Whether a GEMM of m x n x k is made of whole blocks of this tile."""
        return m % self.block_m == 0 and n % self.block_n == 0 and k % self.block_k == 0

    def describe(self) -> str:
        return (f"{self.size} block, {self.warps_m}x{self.warps_n} warps of "
                f"{self.block_m // self.warps_m}x{self.block_n // self.warps_n}")


@dataclass(frozen=True)
class TensorCoreKernel:
    """The fast tensor-core kernel of one group (see the module's docstring).

    ``mma_shape``: (m, n, k) of one tensorized tile (16, 16, 16 for fp16; 16, 16, 32 for int8).
    ``in_dtype`` / ``acc_dtype``: the operands' and accumulator's types. ``tilings``: the block
    tiles, tried in order. ``stages``: pipeline depth over the reduction. ``swizzle``: XOR-
    permuted shared memory (else ``pad`` elements per row). ``b_layouts``: "kn" (B[k, n]) and /
    or "nk" (B[n, k]). ``min_blocks``: fewest thread blocks a tiling may leave (a tiling with
    fewer is passed over for the next, smaller one; the last one is always allowed). ``raster``:
    block rows per group in the thread blocks' order (a GEMM whose block rows it does not
    divide keeps row order). ``fragment_pipeline``: ldmatrix one mma step ahead of mma.sync.
    """

    in_dtype: str
    acc_dtype: str
    mma_shape: tuple[int, int, int]
    tilings: tuple[BlockTiling, ...]
    stages: int = 3
    swizzle: bool = True
    pad: int = 8
    b_layouts: tuple[str, ...] = ("kn", "nk")
    min_blocks: int = 132
    raster: int = 1
    fragment_pipeline: bool = False
    doc: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "tilings", tuple(self.tilings))
        object.__setattr__(self, "mma_shape", tuple(self.mma_shape))
        tm, tn, tk = self.mma_shape
        if not self.tilings:
            raise IntrinsicError("a TensorCoreKernel needs at least one BlockTiling")
        for t in self.tilings:
            per_m, per_n = t.block_m // max(t.warps_m, 1), t.block_n // max(t.warps_n, 1)
            if (t.block_m % t.warps_m or t.block_n % t.warps_n or per_m % tm or per_n % tn
                    or t.block_k % tk):
                raise IntrinsicError(f"tiling {t.describe()} is not made of whole {tm}x{tn}x{tk} "
                                     "tiles per warp")
        if isinstance(self.raster, bool) or not isinstance(self.raster, int) or self.raster < 1:
            raise IntrinsicError(f"raster must be a positive int (block rows per group), got {self.raster!r}")
        if self.stages < 1:
            raise IntrinsicError(f"pipeline stages must be >= 1, got {self.stages}")
        bad = set(self.b_layouts) - {"kn", "nk"}
        if bad or not self.b_layouts:
            raise IntrinsicError(f"b_layouts must be some of 'kn', 'nk'; got {self.b_layouts}")

    def describe(self) -> str:
        """One line for listings (`tirbyoc intrinsics`)."""
        m, n, k = self.mma_shape
        smem = "XOR-swizzled" if self.swizzle else f"rows padded by {self.pad}"
        tiles = ", ".join(t.size for t in self.tilings)
        ahead = "; ldmatrix one step ahead" if self.fragment_pipeline else ""
        return (f"ldmatrix + mma.sync {m}x{n}x{k} {self.in_dtype} -> {self.acc_dtype}; tiles {tiles}; "
                f"{self.stages + 1} buffers in flight ({smem}){ahead}; B as {' or '.join(self.b_layouts)}")

    def shared_bytes(self, t: BlockTiling, in_bytes: int, acc_bytes: int) -> int:
        """Shared memory one block needs: the pipeline's A and B tiles, or the C tile staged on
        its way out (they are never live together, and TVM's merging of dynamic shared
        allocations lets them share)."""
        inputs = (self.stages + 1) * (t.block_m + t.block_n) * (t.block_k + (0 if self.swizzle else self.pad))
        return max(inputs * in_bytes, t.block_m * t.block_n * acc_bytes)


__all__ = ["BlockTiling", "TensorCoreKernel"]
