"""The rewrite engine: every rewrite is built, run and compared with the untouched function."""

import pytest
from tvm.sym.analyzer import Analyzer
from tvm.tirx import ForKind
from vnni import NAME, NATIVE, VNNI
from workloads import conv2d, matmul, parse

import tirbyoc
from tirbyoc import RewriteError, offload, tensorize, verify



def only(result_blocks):
    (block,) = result_blocks
    return block


def assert_offloaded(func, template, intrinsic_prefix):
    out = offload(func, template)
    block = only([b for b in out.blocks if b.block in ("C", "conv")])
    assert block.offloaded, block.reason
    assert block.intrinsic.startswith(intrinsic_prefix)
    assert out.verification.passed, out.verification.describe()
    return out


# ------------------------------------------------------------------------- x86 VNNI
@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (16, 16, 4), (1, 16, 4), (30, 50, 36), (17, 33, 7),
                                   (3, 15, 17)])
def test_vnni_int8_dense_any_size(m, n, k):
    assert_offloaded(matmul(m, n, k, "uint8", "int8", "int32", trans_b=True), VNNI, f"{NAME}.dot")


@pytest.mark.parametrize("trans_b", [False, True])
def test_vnni_weights_either_layout_are_packed_once(trans_b):
    out = assert_offloaded(matmul(32, 48, 64, "uint8", "int8", "int32", trans_b=trans_b), VNNI, NAME)
    steps = " ".join(out.offloaded[0].steps)
    assert "pack 16x4 tiles B" in steps or "pack B into 16x4 tiles" in steps
    assert "register-blocked" in steps


def _copy_blocks(func):
    """(block, its loops) of every block writing a staging buffer (``*_global``)."""
    from tirbyoc._tvm import s_tir, tirx
    from tirbyoc._tvm import child_stmts

    found = []

    def walk(stmt, loops):
        if isinstance(stmt, tirx.For):
            loops = loops + [stmt]
        elif isinstance(stmt, s_tir.SBlock):
            if stmt.writes and str(stmt.writes[0].source.name).endswith("_global"):
                found.append((stmt, loops))
            if stmt.name_hint == "root":
                loops = []
        for child in child_stmts(stmt):
            walk(child, loops)

    walk(func.body, [])
    return found


@pytest.mark.parametrize("trans_b", [False, True])
def test_vnni_weight_pack_writes_in_order_in_parallel(trans_b):
    """The packed weight copy iterates over the packed layout (its write indices are its own
    iterators: contiguous stores, not scattered bytes) and its outer loop runs in parallel."""
    out = assert_offloaded(matmul(64, 64, 128, "uint8", "int8", "int32", trans_b=trans_b), VNNI, NAME)
    packs = [(b, loops) for b, loops in _copy_blocks(out.func) if len(b.writes[0].region) == 4]
    assert packs, out.func.script()
    block, loops = packs[0]
    ana = Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)
    written = [ana.simplify(r.min) for r in block.writes[0].region]
    assert all(w.same_as(iv.var) for w, iv in zip(written, block.iter_vars)), written
    assert loops and loops[0].kind == ForKind.PARALLEL, [str(l.kind) for l in loops]
    assert "staging cop" in " ".join(out.offloaded[0].steps)


def test_vnni_batched_matmul():
    assert_offloaded(matmul(16, 32, 64, "uint8", "int8", "int32", batch=3), VNNI, NAME)


@pytest.mark.parametrize("layout,c,oc,stride", [("NHWC", 16, 32, 1), ("NCHW", 16, 32, 2), ("NHWC", 3, 24, 1),
                                                ("NCHW", 8, 17, 1)])
def test_vnni_conv2d(layout, c, oc, stride):
    f = conv2d(1, c, 9, 9, oc, 3, 3, layout=layout, stride=stride, dtype="uint8", wdtype="int8", acc="int32")
    assert_offloaded(f, VNNI, NAME)


@pytest.mark.parametrize("trans_b", [False, True])
def test_vnni_operands_in_the_other_order(trans_b):
    """C += B * A: TVM's tensorize compares expressions literally, so the block's product
    is put in the intrinsic's order first."""
    out = assert_offloaded(matmul(48, 40, 36, "uint8", "int8", "int32", swap_mul=True, trans_b=trans_b),
                           VNNI, f"{NAME}.dot")
    assert any("order the block's operands" in s for s in out.offloaded[0].steps)


def test_vnni_separate_init_block():
    f = matmul(32, 32, 32, "uint8", "int8", "int32", trans_b=True, init="outside")
    assert_offloaded(f, VNNI, NAME)


def test_tensorize_structure_without_schedule():
    """Before / Expected: the canonical rewrite of a 16x16x8 int8 GEMM, loops as tiled."""
    f = matmul(2, 16, 8, "uint8", "int8", "int32", trans_b=True)
    (m,) = [x for x in tirbyoc.match(f, NATIVE) if x.intrinsic.role.value == "compute"]
    got = tensorize(f, m, schedule=False).func
    expected = parse('''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((2, 8), "uint8"), B: T.Buffer((16, 8), "int8"), C: T.Buffer((2, 16), "int32")):
    B_global = T.sblock_alloc_buffer((1, 2, 16, 4), "int8")
    for ax0, ax1 in T.grid(16, 8):
        with T.sblock("B_global"):
            v0, v1 = T.axis.remap("SS", [ax0, ax1])
            T.reads(B[v0, v1])
            T.writes(B_global[0, v1 // 4, v0, v1 % 4])
            B_global[0, v1 // 4, v0, v1 % 4] = B[v0, v1]
    for ax0, ax1_0 in T.grid(2, 1):
        with T.sblock("C_init_o"):
            v0_o, v1_o = T.axis.remap("SS", [ax0, ax1_0])
            T.reads()
            T.writes(C[v0_o, 0:16])
            C_1 = T.match_buffer(C[v0_o, 0:16], (16,), "int32", offset_factor=1)
            C_1[0:16] = T.Broadcast(0, 16)
        for ax2_0 in range(2):
            with T.sblock("C_update_o"):
                v0_o, v1_o, v2_o = T.axis.remap("SSR", [ax0, ax1_0, ax2_0])
                T.reads(C[v0_o, 0:16], A[v0_o, v2_o * 4:v2_o * 4 + 4], B_global[0, v2_o, 0:16, 0:4])
                T.writes(C[v0_o, 0:16])
                A_1 = T.match_buffer(A[v0_o, v2_o * 4:v2_o * 4 + 4], (4,), "uint8", offset_factor=1)
                B_1 = T.match_buffer(B_global[0, v2_o, 0:16, 0:4], (16, 4), "int8", offset_factor=1)
                C_1 = T.match_buffer(C[v0_o, 0:16], (16,), "int32", offset_factor=1)
                C_1[0:16] = T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", C_1[T.Ramp(0, 1, 16)], T.reinterpret("int8x64", T.Broadcast(T.reinterpret("int32", A_1[T.Ramp(0, 1, 4)]), 16)), B_1[0, T.Ramp(0, 1, 64)])
''')
    assert tirbyoc._tvm.structural_equal(got, expected), got.script()


def _gemm_only():
    from tirbyoc_intrinsics.blas import _gemm_group

    return tirbyoc.Template("blas", {"kind": "llvm"}, tirbyoc.Runtime.EXTERN_C, groups=(_gemm_group(False),))


def test_rewrite_refusal_is_a_clean_fallback():
    # A GEMV (N = 1) under a GEMM-only template: no iterator for N; the block stays, with the
    # reason (the matcher's: such a match would be refused by every rewrite, so it is none).
    f = matmul(64, 1, 64)
    out = offload(f, _gemm_only())
    block = only(out.blocks)
    assert not block.offloaded and "no iterator plays the role of intrinsic axis" in block.reason
    assert out.func.same_as(f) and out.verification is None


def _refuse_batched(sch, block, loops, m, target):
    """A user schedule TVM refuses for the batched-GEMM group only (it names no such block)."""
    if "batched" in m.intrinsic.name:
        sch.get_sblock("no_such_block")


def test_a_refused_rewrite_falls_back_to_the_next_match():
    # the batched GEMM comes first for a batched matmul; TVM refuses its schedule, so the next
    # match (one GEMM per batch) takes the block
    f = matmul(16, 32, 64, batch=3)
    out = offload(f, "blas", schedule=_refuse_batched)
    block = only(out.blocks)
    assert block.intrinsic.startswith("blas.sgemm_") and "batched" not in block.intrinsic
    assert out.verification.passed


def test_tensorize_raises_rewrite_error_naming_the_step():
    f = matmul(16, 32, 64, batch=3)
    m = next(m for m in tirbyoc.match(f, "blas") if "batched" in m.intrinsic.name)
    with pytest.raises(RewriteError, match="main/C with blas.*default schedule for the target"):
        tensorize(f, m, schedule=_refuse_batched)


# ------------------------------------------------------------------------------- blas
@pytest.mark.parametrize("m,n,k", [(2, 2, 2), (7, 13, 5), (64, 64, 64), (127, 255, 97), (1023, 3, 1021),
                                   (61, 1023, 2)])
def test_blas_exact_shape_single_call(m, n, k):
    out = offload(matmul(m, n, k, trans_b=(m % 2 == 1)), "blas", target={"kind": "llvm", "num-cores": 1})
    block = only(out.offloaded)
    assert out.verification.passed, out.verification.describe()
    assert block.intrinsic.startswith(f"blas.sgemm_{m}x{n}x{k}")
    assert any("links tirbyoc_blas_shim" in s for s in block.steps)


@pytest.mark.parametrize("m,n,k,call", [(64, 64, 64, "32x64x64"), (49, 512, 40, "49x256x40"),
                                        (7, 13, 5, "7x13x5"), (2, 30, 3, "2x30x3")])
def test_blas_splits_a_block_into_one_call_per_core(m, n, k, call):
    """A library call inside a PrimFunc runs single-threaded on one of TVM's threads: on two
    cores the largest spatial axis two divides into parts of 16 or more is halved, and the
    two calls run in parallel; where none divides so, one call does it all."""
    out = offload(matmul(m, n, k), "blas", target={"kind": "llvm", "num-cores": 2})
    assert out.verification.passed, out.verification.describe()
    assert only(out.offloaded).intrinsic.startswith(f"blas.sgemm_{call}_")
    split = call != f"{m}x{n}x{k}"
    assert ("T.parallel(2)" in out.func.script()) == split


def test_blas_batched():
    assert_offloaded(matmul(16, 32, 64, batch=3, trans_b=True), "blas", "blas.sgemm")


# ------------------------------------------------------------------------ verification
def test_verify_catches_a_wrong_rewrite():
    f = matmul(16, 16, 16, "uint8", "int8", "int32", trans_b=True)
    # Same signature, B read as [K, N] instead of [N, K]: a plausible layout bug.
    wrong = matmul(16, 16, 16, "uint8", "int8", "int32", trans_b=False)
    result = verify(f, wrong)
    assert result.passed is False and result.max_abs_err > 0


def test_verify_float_tolerance_and_signature_check():
    f = matmul(8, 8, 8)
    assert verify(f, matmul(8, 8, 8, order="kji")).passed
    with pytest.raises(tirbyoc.VerificationError, match="signatures differ"):
        verify(f, matmul(8, 8, 9))


def test_policies():
    from tirbyoc.offloading.offloader import estimated_cycles

    f = matmul(16, 32, 64, batch=4, trans_b=True)
    matches = [m for m in tirbyoc.match(f, "blas") if m.intrinsic.role.value == "compute"]
    assert len(matches) >= 2
    out = offload(f, "blas", policy="cost", verify=False)
    assert out.offloaded
    assert min(estimated_cycles(m) for m in matches) <= estimated_cycles(matches[0])
    with pytest.raises(tirbyoc.TirbyocError, match="unknown offload policy"):
        offload(f, "blas", policy="fastest")


# ------------------------------------------------------------------- device templates
def test_hexagon_rewrite_tensorizes_vrmpy():
    """vrmpy tensorizes (whether it then runs under QEMU is tests/test_hexagon.py's)."""
    out = offload(matmul(64, 64, 64, "uint8", "uint8", "int32", trans_b=True), "hexagon_hvx",
                  verify=False)
    block = only(out.blocks)
    assert block.offloaded and block.intrinsic.startswith("hexagon_hvx.vrmpy_32x4")
    assert "vrmpy" in out.func.script()


# ----------------------------------------------------------------- separate init blocks
def test_separate_init_is_folded_into_the_reduction_exactly():
    from tvm_ffi import structural_equal

    from tirbyoc.ir.init_merge import merge_separate_init

    outside = matmul(5, 65, 63, "uint8", "int8", "int32", init="outside")
    merged = merge_separate_init(outside, "C_init", "C")
    assert structural_equal(merged, matmul(5, 65, 63, "uint8", "int8", "int32"))
    assert merge_separate_init(outside, "C", "C_init") is None  # the "init" must store a constant


@pytest.mark.parametrize("template,dtypes", [
    (NAME, ("uint8", "int8", "int32")),
    ("blas", ("float32",) * 3), ("vta", ("int8", "int8", "int32"))])
def test_staged_output_with_a_separate_init_offloads(template, dtypes):
    # transposed A and a padded, staged output: two writers of C used to stop cache_write
    f = matmul(5, 65, 63, *dtypes, trans_a=True, init="outside", order="kji")
    out = offload(f, template)
    (update,) = [b for b in out.blocks if b.block == "C"]
    assert update.offloaded and out.verification.passed


# ------------------------------------------------------------------- CPU copy schedule
def test_an_im2col_copy_is_split_at_its_divisors_and_still_copies_the_same():
    """`schedule_copies`: the loops of a staging copy whose indices divide by constants are
    split at them (TVM's simplifier then drops every per-element division), the outermost run
    in parallel; the copy still writes the same numbers."""
    import numpy as np
    import tvm
    from tvm.script import tirx as T

    from tirbyoc._tvm import s_tir
    from tirbyoc.rewrite.cpu.register_blocks import schedule_copies

    @T.prim_func(s_tir=True)
    def func(X: T.Buffer((4, 18, 18), "float32"), Y: T.Buffer((256, 36), "float32")):
        col = T.sblock_alloc_buffer((256, 36))
        for p, k in T.grid(256, 36):
            with T.sblock("col"):
                vp, vk = T.axis.remap("SS", [p, k])
                col[vp, vk] = X[vk // 9, vp // 16 + vk % 9 // 3, vp % 16 + vk % 3]
        for i, j in T.grid(256, 36):
            with T.sblock("use"):
                vi, vj = T.axis.remap("SS", [i, j])
                Y[vi, vj] = col[vi, vj] * T.float32(2)

    sch = s_tir.Schedule(func)
    assert schedule_copies(sch, sch.get_sblock("use")) == 1
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("col"))]
    assert [int(loop.extent) for loop in loops] == [16, 16, 4, 3, 3]
    assert loops[0].kind == ForKind.PARALLEL
    x = np.random.default_rng(0).standard_normal((4, 18, 18)).astype("float32")
    outs = []
    for f in (func, sch.mod["main"]):
        y = tvm.runtime.tensor(np.zeros((256, 36), "float32"))
        tvm.compile(f, target=tvm.target.Target({"kind": "llvm"}))(tvm.runtime.tensor(x), y)
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
