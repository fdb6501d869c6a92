"""tirbyoc against TVM's own matching checks on the same blocks."""

import pytest
from workloads import conv2d, matmul

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
