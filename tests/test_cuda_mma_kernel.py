"""A whole tensor-core GEMM kernel built from the cuda_mma template's group.

global -> shared (all 32 threads of the warp copy) -> WMMA fragments -> mma_sync -> global,
hand-scheduled with TVM's own primitives and tensorized with every intrinsic of the group.
Codegen and ``nvcc`` run here without a GPU; the numeric check needs one.
"""

import numpy as np
import pytest

import tirbyoc
from tirbyoc._tvm import T, Schedule, build, compile_cuda, cuda_source, nvcc_path

GROUPS = ["wmma_float16_float32", "wmma_int8_int32"]


def wmma_gemm(group, m=64, n=64, k=64):
    """C[m, n] = A[m, k] @ B[k, n] with one warp per 16x16 output tile."""
    in_dtype, acc_dtype = group.compute.operands[0].dtype, group.compute.operands[2].dtype

    @T.prim_func(s_tir=True)
    def gemm(A: T.Buffer((m, k), in_dtype), B: T.Buffer((k, n), in_dtype), C: T.Buffer((m, n), acc_dtype)):
        for i, j, r in T.grid(m, n, k):
            with T.sblock("C"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    C[vi, vj] = T.cast(0, acc_dtype)
                C[vi, vj] = C[vi, vj] + T.cast(A[vi, vr], acc_dtype) * T.cast(B[vr, vj], acc_dtype)

    sch = Schedule(gemm)
    blk = sch.get_sblock("C")
    i, j, r = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, 16])
    j0, j1 = sch.split(j, [None, 16])
    r0, _ = sch.split(r, [None, 16])
    sch.reorder(i0, j0, r0, i1, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    store = sch.cache_write(blk, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, j0)
    frag_a = sch.cache_read(blk, 0, "wmma.matrix_a")
    frag_b = sch.cache_read(blk, 1, "wmma.matrix_b")
    sh_a = sch.cache_read(frag_a, 0, "shared")
    sh_b = sch.cache_read(frag_b, 0, "shared")
    for producer in (frag_a, frag_b, sh_a, sh_b):
        sch.compute_at(producer, r0)
    for copy in (sh_a, sh_b):
        fused = sch.fuse(*sch.get_loops(copy)[-2:])
        _, lane = sch.split(fused, [None, 32])
        sch.bind(lane, "threadIdx.x")
    init = sch.decompose_reduction(blk, r0)
    sch.tensorize(sch.get_loops(init)[-2], group.init.name)
    sch.tensorize(sch.get_loops(frag_a)[-2], group.loads[0].name)
    sch.tensorize(sch.get_loops(frag_b)[-2], group.loads[1].name)
    sch.tensorize(i1, group.compute.name)
    sch.tensorize(sch.get_loops(store)[-2], group.store.name)
    return sch.mod


@pytest.fixture(scope="module")
def cuda_mma():
    template = tirbyoc.get_template("cuda_mma")
    template.register()
    return template


@pytest.mark.parametrize("group_name", GROUPS)
def test_wmma_kernel_codegen(cuda_mma, group_name):
    mod = wmma_gemm(cuda_mma.group(group_name))
    source = cuda_source(build(mod, cuda_mma.tvm_target()))
    for call in ("fill_fragment", "load_matrix_sync", "mma_sync", "store_matrix_sync"):
        assert f"nvcuda::wmma::{call}" in source, call
    assert "__shared__" in source and "threadIdx.x" in source


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("group_name", GROUPS)
def test_wmma_kernel_compiles_with_nvcc(cuda_mma, group_name):
    mod = wmma_gemm(cuda_mma.group(group_name))
    cubin = compile_cuda(cuda_source(build(mod, cuda_mma.tvm_target())), cuda_mma.tvm_target())
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image


@pytest.mark.gpu
@pytest.mark.parametrize("group_name", GROUPS)
def test_wmma_kernel_matches_numpy(cuda_mma, group_name):
    if not cuda_mma.runs_here():
        pytest.skip(cuda_mma.unavailable_reason())
    import tvm

    group = cuda_mma.group(group_name)
    in_dtype, acc_dtype = group.compute.operands[0].dtype, group.compute.operands[2].dtype
    rng = np.random.default_rng(0)
    if in_dtype == "int8":
        a, b = (rng.integers(-128, 128, (64, 64)).astype("int8") for _ in range(2))
    else:
        a, b = (rng.uniform(-1, 1, (64, 64)).astype("float16") for _ in range(2))
    lib = build(wmma_gemm(group), cuda_mma.tvm_target())
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(x, dev) for x in (a, b, np.zeros((64, 64), acc_dtype))]
    lib(*args)
    expected = a.astype(acc_dtype) @ b.astype(acc_dtype)
    np.testing.assert_allclose(args[2].numpy(), expected, rtol=1e-3, atol=1e-3)
