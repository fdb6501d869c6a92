"""Tensor-core kernels from `tirbyoc.offload(func, "cuda_mma")`.

Two CUDA schedules. A plain GEMM one of the group's declared block tiles divides becomes the
tensor-core kernel (`tirbyoc.rewrite.block.tensor_core`: 2x2 warps, ldmatrix + mma.sync, a cp.async
pipeline through dynamic shared memory). Everything else gets one warp per thread block owning
2x2 output fragments, tiles staged global -> shared (the warp's 32 threads copy) -> WMMA
fragments, mma_sync, the accumulator stored after the reduction; every copy tensorized with
the group's intrinsics.
Codegen, the CUDA compiler (NVRTC from the ``cuda`` extra's wheels, or a toolkit's nvcc) and
the disassembler run here without a GPU: every kernel becomes machine code for Ampere and
Hopper whose instructions include the tensor-core MMA (HMMA for fp16, IMMA for int8). The
numeric check needs a GPU.
"""

import re
from pathlib import Path

import pytest
from workloads import conv2d, matmul, shared_weight_matmul

import tirbyoc
from tirbyoc._tvm import build, cuda_source
from tirbyoc.offloading import cuda_toolchain
from tirbyoc.rewrite.functions import gpu_threads

CASES = {
    "f16 64^3": lambda: matmul(64, 64, 64, "float16", "float16", "float32"),
    "f16 100x200x300 (padded)": lambda: matmul(100, 200, 300, "float16", "float16", "float32"),
    "f16 100x256x320 (rows padded)": lambda: matmul(100, 256, 320, "float16", "float16", "float32"),
    "i8 64^3": lambda: matmul(64, 64, 64, "int8", "int8", "int32"),
    "f16 weights [N, K]": lambda: matmul(64, 96, 64, "float16", "float16", "float32", trans_b=True),
    "f16 batched": lambda: matmul(32, 32, 64, "float16", "float16", "float32", batch=2),
    "f16 conv NHWC 3x3": lambda: conv2d(1, 32, 9, 9, 32, 3, 3, layout="NHWC", dtype="float16",
                                        acc="float32"),
    "f16 M, N, K at run time (padded)": lambda: matmul(0, 0, 0, "float16", "float16", "float32", symbolic="mnk"),
    "f16 256^3": lambda: matmul(256, 256, 256, "float16", "float16", "float32"),
    "f16 512x256x128 weights [N, K]": lambda: matmul(512, 256, 128, "float16", "float16", "float32", trans_b=True),
    "i8 256^3 weights [N, K]": lambda: matmul(256, 256, 256, "int8", "int8", "int32", trans_b=True),
    "f16 batch of one x weight": lambda: shared_weight_matmul(1, 128, 96, 64),
    "f16 batch of 4 x one weight": lambda: shared_weight_matmul(4, 32, 64, 64),
}
# the cases the tensor-core kernel takes (GEMMs of static sizes, padded to a declared block tile
# where it does not divide them, as long as the padding adds rows, not columns inside a row of
# 16-byte vectors; int8 with B as [N, K]); the others get one warp per block
KERNEL = {"f16 64^3", "f16 100x256x320 (rows padded)", "f16 weights [N, K]", "f16 batched",
          "f16 256^3", "f16 512x256x128 weights [N, K]", "i8 256^3 weights [N, K]", "f16 batch of one x weight",
          "f16 batch of 4 x one weight"}


@pytest.fixture(scope="module")
def cuda_mma():
    return tirbyoc.get_template("cuda_mma")


def offloaded(case):
    out = tirbyoc.offload(CASES[case](), "cuda_mma")
    (block,) = out.blocks
    assert block.offloaded, block.reason
    names = block.intrinsic.split(", ")
    if case in KERNEL:  # TVM's own ldmatrix / mma.sync intrinsics
        kinds = {name.split("_")[1] if name.startswith("mma_") else name for name in names}
        assert {"fill", "ldmatrix", "store"} <= kinds and len(names) == 5, block.intrinsic
        assert any("tensor-core kernel:" in str(step) for step in block.steps), block.steps
    else:
        roles = {name.split(".")[1].split("_")[0] for name in names}
        assert roles == {"mma", "fill", "load", "store"}, block.intrinsic
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_offload_builds_a_tensor_core_kernel(cuda_mma, case):
    out = offloaded(case)
    source = cuda_source(build(out.func, cuda_mma.tvm_target()))
    if case in KERNEL:
        for ptx in ("ldmatrix.sync.aligned", "mma.sync.aligned", "cp.async"):
            assert ptx in source, ptx
        assert "nvcuda::wmma" not in source
    else:
        for call in ("fill_fragment", "load_matrix_sync", "mma_sync", "store_matrix_sync"):
            assert f"nvcuda::wmma::{call}" in source, call
    assert "__shared__" in source and "threadIdx.x" in source and "blockIdx" in source
    if not cuda_mma.runs_here():
        # offload itself built the kernel before saying it cannot run it
        assert out.verification.passed is None and "built for CUDA" in out.verification.reason
        chain = cuda_toolchain.toolchain()
        if chain is not None:  # and compiled on to machine code, read where a disassembler exists
            expected = ("machine code with tensor-core " if cuda_toolchain.disassembler() is not None
                        else f"compiled by {chain.compiler} to sm_80 machine code")
            assert expected in out.verification.reason, out.verification.reason


@pytest.mark.parametrize("case", list(CASES))
def test_no_loop_nest_is_left_on_the_host(case):
    # an unbound nest runs in the host function over device pointers: the process dies on a GPU
    out = offloaded(case)
    assert gpu_threads.bind_unbound_nests(out.func)[1] == []


def test_unbound_copies_get_gpu_threads():
    case = "f16 M, N, K at run time (padded)"  # one warp per block: its padded copies stay
    steps = [str(s) for s in offloaded(case).blocks[0].steps]
    assert "A_pad, B_pad, C_pad on the GPU (256 threads per block)" in steps, steps
    source = cuda_source(build(offloaded(case).func, tirbyoc.get_template("cuda_mma").tvm_target()))
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert len(kernels) == 4, kernels  # the two pads, the MMA kernel, the un-pad


def test_the_kernel_reads_a_padded_gemm_in_place():
    """100 rows padded to the block tile: the padding is a predicate on the kernel's copies
    (zero-filling cp.async past the last row), not three more kernels and their buffers."""
    func = offloaded("f16 100x256x320 (rows padded)").func
    source = cuda_source(build(func, tirbyoc.get_template("cuda_mma").tvm_target()))
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert len(kernels) == 1, kernels
    assert "ptx_cp_async_legacy_pred" in source and "mma.sync.aligned.m16n8k16" in source


ARCHES = ("sm_80", "sm_90")  # Ampere (the template's target) and Hopper
needs_compiler = pytest.mark.skipif(cuda_toolchain.toolchain() is None,
                                    reason=str(cuda_toolchain.unavailable_reason()))


@pytest.fixture(scope="module")
def kernel_sources(cuda_mma):
    """Each case's generated CUDA C, built once for every architecture's test."""
    return {case: cuda_source(build(offloaded(case).func, cuda_mma.tvm_target())) for case in CASES}


@needs_compiler
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("case", list(CASES))
def test_offloaded_kernel_is_tensor_core_machine_code(kernel_sources, case, arch):
    cubin = cuda_toolchain.compile_cubin(kernel_sources[case], {"kind": "cuda", "arch": arch})
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image
    if cuda_toolchain.disassembler() is None:
        pytest.skip(f"no CUDA disassembler to read the machine code: {cuda_toolchain.CUDA_EXTRA}")
    assembly = cuda_toolchain.sass(cubin)
    mma = cuda_toolchain.tensor_core_ops(assembly)
    expected = "IMMA" if case.startswith("i8") else "HMMA"
    assert mma and all(op.startswith(expected) for op in mma), (case, arch, mma)
    if case in KERNEL:  # shared -> registers by ldmatrix, global -> shared by cp.async
        ops = {op.split(".")[0] for op in cuda_toolchain.opcodes(assembly)}
        assert {"LDSM", "LDGSTS"} <= ops, (case, arch, sorted(ops))


def test_the_kernel_says_why_it_does_not_take_a_block():
    steps = [str(s) for s in tirbyoc.offload(CASES["i8 64^3"](), "cuda_mma").blocks[0].steps]
    assert any("tensor-core kernel does not fit: B is [K, N]; the kernel's int8 ldmatrix reads B only as nk"
               in s for s in steps), steps
    steps = [str(s) for s in tirbyoc.offload(CASES["f16 conv NHWC 3x3"](), "cuda_mma").blocks[0].steps]
    assert any("tensor-core kernel does not fit: the block could not be put in GEMM form" in s for s in steps), steps


def test_thread_blocks_can_run_in_groups_of_block_rows(cuda_mma):
    from dataclasses import replace

    groups = tuple(replace(g, kernel=replace(g.kernel, raster=4)) if g.kernel else g for g in cuda_mma.groups)
    out = tirbyoc.offload(matmul(1024, 512, 64, "float16", "float16", "float32"), replace(cuda_mma, groups=groups),
                          verify=False)
    steps = [str(s) for s in out.blocks[0].steps]
    assert any("thread blocks, in groups of 4 block rows" in s for s in steps), steps
    source = cuda_source(build(out.func, cuda_mma.tvm_target()))
    assert "mma.sync.aligned" in source and "cp.async" in source
    # 1024 / 64 = 16 block rows of 64x64 tiles: 4 divides them; 3 does not, and row order stays
    groups = tuple(replace(g, kernel=replace(g.kernel, raster=3)) if g.kernel else g for g in cuda_mma.groups)
    out = tirbyoc.offload(matmul(1024, 512, 64, "float16", "float16", "float32"), replace(cuda_mma, groups=groups),
                          verify=False)
    assert not any("groups of" in str(s) for s in out.blocks[0].steps)


def test_fragments_can_be_loaded_one_mma_step_ahead(cuda_mma):
    from dataclasses import replace

    def kernel_source(ahead: bool) -> str:
        groups = tuple(replace(g, kernel=replace(g.kernel, fragment_pipeline=ahead)) if g.kernel else g
                       for g in cuda_mma.groups)
        out = tirbyoc.offload(matmul(256, 256, 128, "float16", "float16", "float32"), replace(cuda_mma, groups=groups),
                              verify=False)
        assert any("ldmatrix one mma step ahead" in str(s) for s in out.blocks[0].steps) == ahead
        return cuda_source(build(out.func, cuda_mma.tvm_target()))

    # the k1 loop (two mma steps a stage) becomes prologue / steady state / epilogue: each
    # ldmatrix and mma.sync appears in two places of the main loop's body instead of one
    plain, ahead = kernel_source(False), kernel_source(True)
    for ptx in ("ldmatrix.sync.aligned", "mma.sync.aligned"):
        assert ahead.count(ptx) == 2 * plain.count(ptx), ptx


def test_the_kernel_picks_the_largest_tile_that_fills_the_gpu():
    steps = [str(s) for s in tirbyoc.offload(matmul(2048, 2048, 64, "float16", "float16", "float32"),
                                              "cuda_mma", verify=False).blocks[0].steps]
    assert "tensor-core kernel: 128x128x32 block, 2x2 warps of 64x64, 256 thread blocks" in steps, steps


def test_sass_opcodes_are_read_with_predicates_and_modifiers():
    text = """        /*0140*/                   LDSM.16.M88.4 R12, [R2] ;
        /*0150*/              @!P0 HMMA.16816.F32 R4, R12, R16, R4 ;
        /*0160*/                   IMMA.16816.S8.S8 R8, R12.ROW, R16.COL, R8 ;
        /*0170*/                   EXIT ;"""
    assert cuda_toolchain.opcodes(text) == {"LDSM.16.M88.4", "HMMA.16816.F32", "IMMA.16816.S8.S8", "EXIT"}
    assert cuda_toolchain.tensor_core_ops(text) == ["HMMA.16816.F32", "IMMA.16816.S8.S8"]


def test_the_wheel_headers_are_laid_out_as_one_cuda_path():
    home = cuda_toolchain.wheel_cuda_home()
    if home is None:
        pytest.skip(f"the CUDA header wheels are not installed: {cuda_toolchain.CUDA_EXTRA}")
    include = Path(home) / "include"
    assert (include / "cuda_runtime.h").is_file() and (include / "mma.h").is_file()
    assert (include / "crt" / "host_defines.h").is_file()  # from the nvcc wheel
    assert (Path(home) / "targets" / "x86_64-linux" / "include" / "cccl" / "cuda" / "std" / "cstdint").is_file()


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_offloaded_kernel_matches_the_default_build(cuda_mma, case):
    if not cuda_mma.runs_here():
        pytest.skip(cuda_mma.unavailable_reason())
    out = offloaded(case)
    assert out.verification.passed, out.verification.describe()


def test_a_kernel_declaration_is_checked_when_it_is_made():
    from tirbyoc import BlockTiling, IntrinsicError, TensorCoreKernel

    ok = TensorCoreKernel("float16", "float32", (16, 16, 16), [BlockTiling(128, 128, 32)])
    assert ok.describe().startswith("ldmatrix + mma.sync 16x16x16 float16 -> float32; tiles 128x128x32")
    for bad, why in [(dict(tilings=[BlockTiling(100, 128, 32, 2, 2)]), "whole 16x16x16 tiles"),
                     (dict(tilings=[]), "at least one BlockTiling"),
                     (dict(raster=0), "raster must be a positive int"),
                     (dict(b_layouts=("km",)), "b_layouts must be some of")]:
        args = dict(in_dtype="float16", acc_dtype="float32", mma_shape=(16, 16, 16),
                    tilings=[BlockTiling(128, 128, 32)]) | bad
        with pytest.raises(IntrinsicError, match=why):
            TensorCoreKernel(**args)
