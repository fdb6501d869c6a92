"""Staging copies that move nothing become views of the parameter (tirbyoc.rewrite.functions.in_place):
removed where they are provably the identity in memory and nothing else can see the
difference, kept everywhere else; every result built and compared with TVM's build."""

import numpy as np
import pytest
from tvm.script import tirx as T
from workloads import conv2d, matmul

import tirbyoc
from tirbyoc._tvm import TensorLoad, iter_blocks, tirx, tvm_ffi
from tirbyoc.offloading.verification import verify
from tirbyoc.rewrite.functions.in_place import read_in_place
from tirbyoc.rewrite.foundation.steps import StepKind

HOST = {"kind": "llvm"}


def copy_blocks(func) -> set[str]:
    """Names of the blocks that only copy (a store of a bare load): the staging copies."""
    return {b.name_hint for b in iter_blocks(func.body)
            if isinstance(b.body, tirx.BufferStore) and isinstance(b.body.value, TensorLoad)}


def views(func) -> list[str]:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.DeclBuffer, lambda d: found.append(str(d.buffer.name))))
    return sorted(found)


def in_place_steps(out) -> list[str]:
    return [str(s) for b in out.blocks for s in b.steps if getattr(s, "kind", None) is StepKind.IN_PLACE]


def test_a_1x1_convolution_on_blas_reads_and_writes_its_tensors_in_place():
    # NCHW 1x1: D[0, c, y, x] is D as [C, H*W], the OIHW weight is W as [O, C], the [O, H*W]
    # result is O itself: three copies, each a pass over a tensor per call, for nothing
    out = tirbyoc.offload(conv2d(1, 64, 14, 14, 128, 1, 1), "blas")
    assert out.verification.passed is True
    assert views(out.func) == ["D_global", "O_global", "W_global"]
    assert not copy_blocks(out.func)
    (note,) = in_place_steps(out)
    assert "D as [64, 196]" in note and "O as [128, 196]" in note and "W as [1, 1, 128, 64]" in note


def test_a_3x3_convolution_keeps_its_im2col_copy_and_drops_the_others():
    out = tirbyoc.offload(conv2d(1, 32, 16, 16, 64, 3, 3), "blas")
    assert out.verification.passed is True
    assert views(out.func) == ["O_global", "W_global"]  # the weight as [O, C*3*3], the result
    assert copy_blocks(out.func) == {"D_global"}  # the windows overlap: a real copy


def test_copies_that_move_elements_stay():
    # a transposed operand and a padded one: other addresses, more elements
    for func in (matmul(64, 48, 32, trans_a=True), matmul(50, 30, 20)):
        before = tirbyoc.offload(func, "blas")
        assert before.verification.passed is True
        assert not views(before.func)
        assert not in_place_steps(before)


@T.prim_func(s_tir=True)
def _copy_then_modify(A: T.Buffer((4, 8), "float32"), B: T.Buffer((32,), "float32")):
    # G is A flattened (an identity copy) but a later nest writes G: as a view, that write
    # would change the caller's A. The write-back into B is an identity after G's last use.
    G = T.sblock_alloc_buffer((32,))
    for i in range(32):
        with T.sblock("copy_in"):
            v = T.axis.spatial(32, i)
            G[v] = A[v // 8, v % 8]
    for i in range(32):
        with T.sblock("scale"):
            v = T.axis.spatial(32, i)
            G[v] = G[v] * T.float32(2.0)
    for i in range(32):
        with T.sblock("copy_out"):
            v = T.axis.spatial(32, i)
            B[v] = G[v]


@T.prim_func(s_tir=True)
def _transposed_and_reused(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4, 8), "float32"),
                           C: T.Buffer((32,), "float32")):
    G = T.sblock_alloc_buffer((32,))
    H = T.sblock_alloc_buffer((32,))
    for i in range(32):
        with T.sblock("transposed"):  # G[v] = A read column by column: not the identity
            v = T.axis.spatial(32, i)
            G[v] = A[v % 4, v // 4]
    for i in range(32):
        with T.sblock("copy_b"):  # an identity, but B is read again below
            v = T.axis.spatial(32, i)
            H[v] = B[v // 8, v % 8]
    for i in range(32):
        with T.sblock("sum"):
            v = T.axis.spatial(32, i)
            C[v] = G[v] + H[v] + B[v // 8, v % 8]


def test_only_provable_identities_become_views_and_results_stay_equal():
    new, done = read_in_place(_copy_then_modify)
    # the read copy stays (G is written after it); the write-back goes, B is written directly
    assert [(d.copy, d.param, d.kind) for d in done] == [("G", "B", "write")]
    assert copy_blocks(new) == {"copy_in"}
    assert verify(_copy_then_modify, new, HOST).passed is True
    a = np.arange(32, dtype="float32").reshape(4, 8)
    assert verify(_copy_then_modify, new, HOST, inputs={"A": a}).passed is True

    same, done = read_in_place(_transposed_and_reused)
    assert done == [] and same is _transposed_and_reused


def test_a_models_1x1_convolution_is_offloaded_in_place_and_the_model_still_matches():
    from tirbyoc.app.model_in.legalize import legalized_model
    from tirbyoc.app.running.run import run_model
    from tirbyoc.relax.bridge import offload_module

    mod = legalized_model("builtin:cnn", ["blas"], constant_weights=True).mod
    offloaded, _ = offload_module(mod, ["blas"])
    viewed = {gv.name_hint: views(f) for gv, f in offloaded.functions_items()
              if isinstance(f, tirx.PrimFunc) and views(f)}
    # every convolution writes its result and reads its weight in place; c3, the 1x1 one, its
    # input too (TOPI's zero padding, a plain copy at padding 0, then the GEMM's staging of the
    # padded buffer: a chain of two views); the 3x3 ones keep im2col
    convs = {name: v for name, v in viewed.items() if name.startswith("conv2d")}
    assert len(convs) == 3 and all("conv2d_nchw_global" in v and len(v) >= 2 for v in convs.values()), viewed
    assert sorted(len(v) for v in convs.values()) == [2, 2, 4], viewed
    assert {"pad_temp", "pad_temp_global"} <= set(max(convs.values(), key=len)), viewed
    result = run_model("builtin:cnn", ["blas"], repeat=1)
    assert result.verified is True and result.report.coverage == pytest.approx(1.0)


@T.prim_func(s_tir=True)
def _copy_of_a_copy(A: T.Buffer((2, 4, 8), "float32"), B: T.Buffer((8, 8), "float32")):
    # P is A (a pad of zero width), G is P as [8, 8] (the GEMM's staging): both identities in
    # memory, the second only once the first is a view of A
    P = T.sblock_alloc_buffer((2, 4, 8))
    G = T.sblock_alloc_buffer((8, 8))
    for i, j, k in T.grid(2, 4, 8):
        with T.sblock("pad"):
            vi, vj, vk = T.axis.remap("SSS", [i, j, k])
            P[vi, vj, vk] = A[vi, vj, vk]
    for r, k in T.grid(8, 8):
        with T.sblock("stage"):
            vr, vk = T.axis.remap("SS", [r, k])
            G[vr, vk] = P[vr // 4, vr % 4, vk]
    for r, k in T.grid(8, 8):
        with T.sblock("use"):
            vr, vk = T.axis.remap("SS", [r, k])
            B[vr, vk] = G[vr, vk] * T.float32(3.0)


@T.prim_func(s_tir=True)
def _copy_of_a_copy_beside_its_source(A: T.Buffer((2, 4, 8), "float32"), B: T.Buffer((8, 8), "float32")):
    # the same chain, but A is read again by the last nest: the first copy stays (A is not
    # alone), so the second reads an allocation, not a view, and stays too
    P = T.sblock_alloc_buffer((2, 4, 8))
    G = T.sblock_alloc_buffer((8, 8))
    for i, j, k in T.grid(2, 4, 8):
        with T.sblock("pad"):
            vi, vj, vk = T.axis.remap("SSS", [i, j, k])
            P[vi, vj, vk] = A[vi, vj, vk]
    for r, k in T.grid(8, 8):
        with T.sblock("stage"):
            vr, vk = T.axis.remap("SS", [r, k])
            G[vr, vk] = P[vr // 4, vr % 4, vk]
    for r, k in T.grid(8, 8):
        with T.sblock("use"):
            vr, vk = T.axis.remap("SS", [r, k])
            B[vr, vk] = G[vr, vk] + A[vr // 4, vr % 4, vk]


def test_a_copy_of_a_view_becomes_a_view_of_the_parameter():
    new, done = read_in_place(_copy_of_a_copy)
    assert [(d.copy, d.param, d.shape) for d in done] == [("P", "A", (2, 4, 8)), ("G", "A", (8, 8))]
    assert copy_blocks(new) == set() and views(new) == ["G", "P"]
    a = np.random.default_rng(0).standard_normal((2, 4, 8)).astype("float32")
    assert verify(_copy_of_a_copy, new, HOST, inputs={"A": a}).passed is True

    same, done = read_in_place(_copy_of_a_copy_beside_its_source)
    assert done == [] and same is _copy_of_a_copy_beside_its_source
