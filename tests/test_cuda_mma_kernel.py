"""Tensor-core kernels from `tirbyoc.offload(func, "cuda_mma")`.

The engine's CUDA schedule: one warp per thread block owning 2x2 output fragments, tiles
staged global -> shared (the warp's 32 threads copy) -> WMMA fragments, mma_sync, the
accumulator stored after the reduction; every copy tensorized with the group's intrinsics.
Codegen and ``nvcc`` run here without a GPU; the numeric check needs one.
"""

import pytest
from workloads import conv2d, matmul

import tirbyoc
from tirbyoc._tvm import build, compile_cuda, cuda_source, nvcc_path

CASES = {
    "f16 64^3": lambda: matmul(64, 64, 64, "float16", "float16", "float32"),
    "f16 100x200x300 (padded)": lambda: matmul(100, 200, 300, "float16", "float16", "float32"),
    "i8 64^3": lambda: matmul(64, 64, 64, "int8", "int8", "int32"),
    "f16 weights [N, K]": lambda: matmul(64, 96, 64, "float16", "float16", "float32", trans_b=True),
    "f16 batched": lambda: matmul(32, 32, 64, "float16", "float16", "float32", batch=2),
    "f16 conv NHWC 3x3": lambda: conv2d(1, 32, 9, 9, 32, 3, 3, layout="NHWC", dtype="float16",
                                        acc="float32"),
}


@pytest.fixture(scope="module")
def cuda_mma():
    return tirbyoc.get_template("cuda_mma")


def offloaded(case):
    out = tirbyoc.offload(CASES[case](), "cuda_mma")
    (block,) = out.blocks
    assert block.offloaded, block.reason
    roles = {name.split(".")[1].split("_")[0] for name in block.intrinsic.split(", ")}
    assert roles == {"mma", "fill", "load", "store"}, block.intrinsic
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_offload_builds_a_wmma_kernel(cuda_mma, case):
    out = offloaded(case)
    source = cuda_source(build(out.func, cuda_mma.tvm_target()))
    for call in ("fill_fragment", "load_matrix_sync", "mma_sync", "store_matrix_sync"):
        assert f"nvcuda::wmma::{call}" in source, call
    assert "__shared__" in source and "threadIdx.x" in source and "blockIdx" in source
    if not cuda_mma.runs_here():
        # offload itself built the kernel before saying it cannot run it
        assert out.verification.passed is None and "built for CUDA" in out.verification.reason


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("case", ["f16 100x200x300 (padded)", "i8 64^3"])
def test_offloaded_kernel_compiles_with_nvcc(cuda_mma, case):
    out = offloaded(case)
    cubin = compile_cuda(cuda_source(build(out.func, cuda_mma.tvm_target())), cuda_mma.tvm_target())
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_offloaded_kernel_matches_the_default_build(cuda_mma, case):
    if not cuda_mma.runs_here():
        pytest.skip(cuda_mma.unavailable_reason())
    out = offloaded(case)
    assert out.verification.passed, out.verification.describe()
