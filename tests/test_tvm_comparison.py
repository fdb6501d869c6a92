"""tirbyoc against TVM's own matching checks on the same blocks."""

import pytest
from workloads import conv2d, matmul, parse

import tirbyoc
from tirbyoc.matching.compare import _tvm_loop_mapping, compare

U8 = ("uint8", "int8", "int32")


@pytest.fixture(scope="module")
def blas():
    return tirbyoc.get_template("blas").intrinsic("sgemm_64x64x64_nn")


@pytest.fixture(scope="module")
def vnni():
    return tirbyoc.get_template("x86_vnni").intrinsic("dot_16x4_u8i8i32")


@pytest.mark.parametrize("kwargs", [{}, {"swap_mul": True}, {"trans_a": True}, {"batch": 2}],
                         ids=["plain", "swapped", "transposed-A", "batched"])
def test_where_tvm_maps_tirbyoc_maps_the_same_iterators(blas, kwargs):
    c = compare(matmul(64, 64, 64, **kwargs), "C", blas)
    assert c.tvm_loop_mapping and c.tirbyoc and c.agree


def test_tvm_exact_tensorize_needs_the_exact_shape(blas):
    assert compare(matmul(64, 64, 64), "C", blas).tvm_exact
    odd = compare(matmul(17, 63, 65), "C", blas)
    assert not odd.tvm_exact and odd.tirbyoc and odd.staging == "A:pad; B:pad; C:pad"


@pytest.mark.parametrize("order", ["kji", "kij"])
def test_loop_order_defeats_tvm_loop_mapping_not_tirbyoc(blas, order):
    c = compare(matmul(64, 64, 64, order=order), "C", blas)
    assert not c.tvm_loop_mapping and c.tirbyoc and c.tirbyoc_direct


def test_tvm_conv_mapping_ignores_operand_roles(blas):
    # TVM pairs the intrinsic's N axis (read by B and C) with whatever loop is innermost;
    # tirbyoc pairs it with the output channel, the only iterator that indexes the weights.
    f = conv2d(1, 32, 16, 16, 64, 3, 3, layout="NHWC")
    tvm_map = _tvm_loop_mapping(f, "conv", blas)
    assert tvm_map["vj"] != "vf"
    c = compare(f, "conv", blas)
    assert c.tirbyoc and c.agree is False


def test_tvm_maps_a_window_the_impl_cannot_read_in_place(vnni):
    c = compare(matmul(64, 64, 64, *U8, trans_b=True), "C", vnni)
    assert c.tvm_loop_mapping and c.tvm_auto
    assert c.tirbyoc and not c.tirbyoc_direct and c.staging == "B:pack"


# ---------------------------------------------- workloads of TVM's own tensorize tests
PRE_SPLIT_INT64 = '''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((T.int64(128), T.int64(128)), "float32"), B: T.Buffer((T.int64(128), T.int64(128)), "float32"),
         C: T.Buffer((T.int64(128), T.int64(128)), "float32")):
    for i_0, j_0 in T.grid(T.int64(8), T.int64(8)):
        for i_1_init, j_1_init in T.grid(T.int64(16), T.int64(16)):
            with T.sblock("init"):
                vi = T.axis.spatial(T.int64(128), i_0 * T.int64(16) + i_1_init)
                vj = T.axis.spatial(T.int64(128), j_0 * T.int64(16) + j_1_init)
                C[vi, vj] = T.float32(0)
        for k_0, i_1, j_1, k_1 in T.grid(T.int64(8), T.int64(16), T.int64(16), T.int64(16)):
            with T.sblock("update"):
                vi = T.axis.spatial(T.int64(128), i_0 * T.int64(16) + i_1)
                vj = T.axis.spatial(T.int64(128), j_0 * T.int64(16) + j_1)
                vk = T.axis.reduce(T.int64(128), k_0 * T.int64(16) + k_1)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]
'''


@pytest.mark.parametrize("template", ["blas", "x86_fp32_avx2"])
def test_tvms_pre_split_int64_matmul_offloads(template):
    """test_tensorize_matmul_mixed_dtype's workload: int64 extents, loops already split by 16,
    the init a nest of its own inside the shared outer loops. The init folds into the update
    (each (i_0, j_0) instance initialises exactly the tile it then reduces into), the loops
    become one per iterator, and the block offloads."""
    out = tirbyoc.offload(parse(PRE_SPLIT_INT64), template)
    update = next(b for b in out.blocks if b.block == "update")
    assert update.offloaded and out.verification.passed, out.table()


def test_a_pre_split_init_that_covers_another_tile_is_not_folded():
    from tirbyoc.ir.init_merge import merge_separate_init

    shifted = PRE_SPLIT_INT64.replace("vi = T.axis.spatial(T.int64(128), i_0 * T.int64(16) + i_1_init)",
                                      "vi = T.axis.spatial(T.int64(128), (i_0 + T.int64(1)) % T.int64(8) * T.int64(16) + i_1_init)")
    assert merge_separate_init(parse(PRE_SPLIT_INT64), "init", "update") is not None
    assert merge_separate_init(parse(shifted), "init", "update") is None


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_an_fp16_conv_on_blas_casts_its_operands_in_staging_copies(layout):
    """TVM's tensorize tests' fp16 conv (float32 accumulation) under blas's float32 sgemm:
    the casts move into the staging copies, and the offload verifies."""
    func = conv2d(1, 16, 10, 10, 32, 3, 3, layout=layout, dtype="float16", acc="float32")
    best = tirbyoc.explain(func, "blas")[0].best
    assert [o.staging[0] for o in best.operands if not o.is_output] == ["cast", "cast"]
    reasons = " ".join(o.reason for o in best.operands if not o.is_output)
    assert "cast D to float32 in a staging copy" in reasons and "cast W to float32" in reasons
    out = tirbyoc.offload(func, "blas")
    assert out.offloaded and out.verification.passed, out.table()
    assert "cast D to float32 in a staging copy" in out.table()


def test_a_float16_output_is_still_a_reason():
    out = tirbyoc.offload(matmul(64, 64, 64, "float16", "float16", "float16"), "blas")
    assert not out.offloaded and "output C is float16, intrinsic writes float32" in out.blocks[0].reason
