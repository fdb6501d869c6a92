"""cuda_mma: tensor-core fragments through WMMA (16x16x16, fp16 -> fp32 and int8 -> int32).

Each group also declares its fast kernel (`KERNELS`: ldmatrix + mma.sync, 2x2 warps of
64x64 per 128x128 block, a 4-buffer cp.async pipeline), which every GEMM one of its block
tiles divides is scheduled as; the WMMA intrinsics below take the rest (one warp per block).

Groups follow TVM's ``MultiLevelTilingTensorCore`` shape: ``init`` fills the accumulator
fragment, ``load_a`` / ``load_b`` move shared-memory tiles into ``wmma.matrix_a/b``
fragments, ``compute`` is one ``mma_sync``, ``store`` writes the accumulator fragment back.
Tile windows are read row-strided (the leading stride is passed to the WMMA call).
"""

from functools import cache
from typing import Optional

from tirbyoc import (BlockTiling, Call, Cost, Intrinsic, IntrinsicGroup, Layout, Operand, Role, Runtime, Scope,
                     Template, TensorCoreKernel, declare, tile_copy_signature)

NAME = "cuda_mma"
M = N = K = 16
SHARED = "shared"
FRAG_A, FRAG_B, ACC = "wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator"
TARGET = {"kind": "cuda", "arch": "sm_80"}
STRIDED = Layout.row_strided()


def _frag_index(buf, stride, rows, cols):
    """Index of a fragment inside a fragment buffer (as TVM's own WMMA intrinsics compute it)."""
    offset = buf.elem_offset
    return offset // stride // rows * (stride // cols) + offset % stride // cols


def _copy(role: Role, src: str, dst: str, dtype: str, call, block: str, doc: str, name: str) -> Intrinsic:
    """A [16, 16] copy between a fragment and memory (the tile-copy family), both row-strided."""
    return declare(name, role, tile_copy_signature((16, 16), dtype, src, dst), lambda T, S, D, i, j: T.cast(S[i, j], dtype),
                   Call(call, offset_factor=16), accumulate=False, block=block, cost=Cost(cycles=4), doc=doc)


@cache
def load(operand: str, dtype: str) -> Intrinsic:
    """Shared [16, 16] tile -> ``wmma.matrix_a`` / ``matrix_b`` fragment (row-major)."""
    frag = FRAG_A if operand == "a" else FRAG_B
    return _copy(Role.LOAD, SHARED, frag, dtype,
                 lambda T, S, D: T.tvm_load_matrix_sync(D.data, M, N, K, _frag_index(D, D.strides[0], 16, 16),
                                                        S.access_ptr("r"), S.strides[0], "row_major", dtype="void"),
                 "load", f"wmma::load_matrix_sync shared -> {frag}", f"{NAME}.load_{operand}_16x16_{dtype}")


@cache
def store(acc_dtype: str, scope: str = "global") -> Intrinsic:
    """Accumulator fragment [16, 16] -> ``scope`` (row-major)."""
    return _copy(Role.STORE, ACC, scope, acc_dtype,
                 lambda T, S, D: T.tvm_store_matrix_sync(S.data, M, N, K, _frag_index(S, S.strides[0], 16, 16),
                                                         D.access_ptr("w"), D.strides[0], "row_major", dtype="void"),
                 "store", f"wmma::store_matrix_sync -> {scope}", f"{NAME}.store_16x16_{acc_dtype}_{scope}")


@cache
def fill(acc_dtype: str) -> Intrinsic:
    """Accumulator fragment [16, 16] = 0."""
    return declare(f"{NAME}.fill_16x16_{acc_dtype}", Role.INIT,
                   ([Operand("C", (16, 16), acc_dtype, ACC, STRIDED)], [("i", 16, "S"), ("j", 16, "S")]),
                   lambda T, C, i, j: T.cast(0, acc_dtype),
                   Call(lambda T, C: T.tvm_fill_fragment(C.data, M, N, K, _frag_index(C, C.strides[0], 16, 16),
                                                         T.cast(0, acc_dtype), dtype="void"), offset_factor=16),
                   accumulate=False, doc="wmma::fill_fragment 0")


@cache
def mma(in_dtype: str, acc_dtype: str) -> Intrinsic:
    """C[16, 16] += A[16, 16] @ B[16, 16] on fragments (one mma_sync)."""
    def call(T, A, B, C):
        c = (C.data, _frag_index(C, C.strides[0], 16, 16))
        return T.tvm_mma_sync(*c, A.data, _frag_index(A, A.strides[0], 16, 16),
                              B.data, _frag_index(B, B.strides[0], 16, 16), *c, dtype="void")

    return declare(f"{NAME}.mma_16x16x16_{in_dtype}_{acc_dtype}", Role.COMPUTE,
                   ([Operand("A", (16, 16), in_dtype, FRAG_A, STRIDED), Operand("B", (16, 16), in_dtype, FRAG_B, STRIDED),
                     Operand("C", (16, 16), acc_dtype, ACC, STRIDED)], [("i", 16, "S"), ("j", 16, "S"), ("k", 16, "R")]),
                   lambda T, A, B, C, i, j, k: C[i, j] + T.cast(A[i, k], acc_dtype) * T.cast(B[k, j], acc_dtype),
                   Call(call, offset_factor=16), cost=Cost(cycles=8), doc=f"wmma::mma_sync {in_dtype} -> {acc_dtype}")


# The fast kernel's block tiles, largest first: BitBLAS's and TVM dlight's 128x128 with 2x2
# warps of 64x64, smaller ones for GEMMs that would leave most multiprocessors idle; block_k:
# two mma steps per pipeline stage. Measured on an H100 (bench/results/cuda_mma_h100.json,
# every tile timed at every size): 128x128 is the fastest from 2048^3 up, 128x64 and 64x64 at
# 1024^3 (0.8-1.2x cuBLAS); 8 warps of 64x64 (256x128, 128x256) were slower at every size, and
# a deeper block_k or pipeline gained nothing (bench/results/cuda_mma_h100_stages.json).
def _tilings(mma_k: int) -> tuple[BlockTiling, ...]:
    k = 2 * mma_k
    return (BlockTiling(128, 128, k, 2, 2), BlockTiling(128, 64, k, 2, 2), BlockTiling(64, 64, k, 2, 2),
            BlockTiling(32, 32, k, 1, 1))


KERNELS = {
    "float16": TensorCoreKernel("float16", "float32", (16, 16, 16), _tilings(16), stages=3, swizzle=True,
                                doc="ldmatrix(.trans) + mma.sync.m16n8k16, 4 buffers of A/B in flight"),
    # int8's ldmatrix has no transposing form: B must be [N, K] (a weight packed once);
    # TVM 0.27's permuted layout does not vectorize 8-bit copies, so rows are padded instead
    "int8": TensorCoreKernel("int8", "int32", (16, 16, 32), _tilings(32), stages=3, swizzle=False, pad=16,
                             b_layouts=("nk",), doc="ldmatrix + mma.sync.m16n8k32, B as [N, K], 4 buffers in flight"),
}


def _group(in_dtype: str, acc_dtype: str) -> IntrinsicGroup:
    return IntrinsicGroup(f"wmma_{in_dtype}_{acc_dtype}", compute=mma(in_dtype, acc_dtype),
                          init=fill(acc_dtype), loads=(load("a", in_dtype), load("b", in_dtype)),
                          store=store(acc_dtype), kernel=KERNELS[in_dtype])


def _requires() -> Optional[str]:
    from tirbyoc.decl.host import cuda_available

    return None if cuda_available() else "no CUDA GPU is visible to TVM on this machine"


TEMPLATE = Template(
    name=NAME,
    target=TARGET,
    runtime=Runtime.DEVICE,
    groups=(_group("float16", "float32"), _group("int8", "int32")),
    scopes=(Scope(SHARED, 48 * 1024, 16, "per-block shared memory"),
            Scope("shared.dyn", 163 * 1024, 16, "per-block dynamic shared memory (sm_80's most)"),
            Scope(FRAG_A, None, 16, "WMMA A fragments (registers)"),
            Scope(FRAG_B, None, 16, "WMMA B fragments (registers)"),
            Scope(ACC, None, 16, "WMMA accumulator fragments (registers)")),
    requires=_requires,
    # NHWC: a convolution is then an implicit GEMM whose A rows are pixels and whose K runs
    # along the channels in memory (16-byte copies straight from the activation)
    channels_last=True,
    # the elementwise work after a GEMM or convolution (cast, bias, ReLU, GELU, a residual add)
    # runs on the tile on its way out of the kernel: C written once, in the model's dtype
    fuses_epilogues=True,
    doc="CUDA tensor cores through WMMA 16x16x16 (fp16 -> fp32, int8 -> int32)",
)
