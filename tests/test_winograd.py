"""Winograd's form F(m x m, 3 x 3) of a float 3x3 convolution (`tirbyoc.rewrite.cpu.winograd`):
exact transforms, the rewritten function against TVM's build of the direct sum, the matrix
products on the fp32 cores with the epilogue in the output transform, and what stays direct."""

import random
from fractions import Fraction

import numpy as np
import pytest
from tvm import relax
from cpu_templates import runnable

import tirbyoc
from tirbyoc._tvm import iter_blocks, root_block
from tirbyoc.relax.bridge import fuse
from tirbyoc.rewrite.cpu.winograd import MATRICES, MIN_TILES, TILES, Conv3x3, conv3x3, tile_for, winograd_form
from tirbyoc.rewrite.foundation.steps import StepKind
from tirbyoc.testing.workloads import conv2d

TEMPLATES = ["x86_fp32_avx512", "x86_fp32_avx2"]


def padded_conv(size=7, channels=64, stride=1, seed=0):
    """conv2d NHWC / OHWI, 3x3, padding 1, + bias + ReLU, legalized and fused as a float
    model's layer, its weight and bias marked constant (layout-free) as the Relax bridge marks
    a model's constants."""
    rng = np.random.default_rng(seed)
    const = lambda *s: relax.const(rng.standard_normal(s).astype("float32"))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, size, size, channels], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, const(channels, 3, 3, channels), strides=stride, padding=1,
                                           data_layout="NHWC", kernel_layout="OHWI"))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(y, const(channels)))))
        bb.emit_func_output(out)
    mod = fuse(relax.transform.LegalizeOps()(bb.get()))
    (func,) = [f for f in mod.functions.values() if not isinstance(f, relax.Function)]
    return func.with_attr("global_symbol", "main").with_attr("layout_free_buffers", [1, 2])


def blocks(func):
    return [str(b.name_hint) for b in iter_blocks(root_block(func).body)]


@pytest.mark.parametrize("m", TILES)
def test_the_transforms_compute_a_three_tap_correlation_exactly(m):
    """A^T [(G g) * (B^T d)] = the correlation of d with g, in exact rationals (1-d; the 2-d
    form applies the same matrices on both sides)."""
    bt, g, at = MATRICES[m]
    rnd = random.Random(m)
    for _ in range(20):
        d = [Fraction(rnd.randint(-9, 9)) for _ in range(m + 2)]
        w = [Fraction(rnd.randint(-9, 9)) for _ in range(3)]
        gw = [sum(gi[k] * w[k] for k in range(3)) for gi in g]
        bd = [sum(bi[k] * d[k] for k in range(m + 2)) for bi in bt]
        y = [sum(ai[k] * gw[k] * bd[k] for k in range(m + 2)) for ai in at]
        assert y == [sum(d[i + k] * w[k] for k in range(3)) for i in range(m)]


def test_the_form_computes_the_convolution_tvm_builds():
    """The rewritten function (odd size: the last tiles read past the padding) against TVM's
    build of the direct sum, on this CPU, with no template involved."""
    func = padded_conv()
    form, (done,) = winograd_form(func, 2, 4)
    assert done.shape == (1, 7, 7, 64, 64) and done.macs == 7 * 7 * 64 * 64 * 9
    assert done.winograd_macs == 16 * 16 * 64 * 64  # 4 x 4 tiles of 2 x 2, 16 positions each
    assert done.block in blocks(form) and "pad_temp" not in blocks(form)  # the padding read through
    check = tirbyoc.verify(func, form)
    assert check.passed, check.describe()


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_matrix_products_run_on_the_core_and_the_epilogue_in_the_output_transform(name):
    runnable(name)
    func = padded_conv(size=24)
    out = tirbyoc.offload(func, name)
    assert out.coverage == 1.0 and out.verification.passed, [b.reason for b in out.blocks]
    (core,) = out.offloaded
    assert core.block == conv3x3_block(func)  # the products carry the convolution's name
    (note,) = [s for s in core.steps if s.kind is StepKind.WINOGRAD]
    assert "F(4x4, 3x3): 36 matrix products of 36 tiles x 64 x 64" in note, note
    # bias and ReLU run in the output transform: no nest of their own, and the report says so
    assert not {"T_add", "compute"} & set(blocks(out.func)), blocks(out.func)
    assert not [s for s in core.steps if s.kind is StepKind.EPILOGUE_LEFT] and "output transform" in note


def conv3x3_block(func):
    return next(str(b.name_hint) for b in iter_blocks(root_block(func).body) if b.init is not None)


def test_what_stays_direct():
    """A weight that may change per call, too few channels, a stride of 2, float16: each
    convolution comes back as it was (the last two with the reason `conv3x3` gives)."""
    run_time_weight = padded_conv().without_attr("layout_free_buffers")
    assert winograd_form(run_time_weight, 2, 4) == (run_time_weight, ())
    narrow = padded_conv(channels=16)
    assert winograd_form(narrow, 2, 4) == (narrow, ())
    strided = next(b for b in iter_blocks(root_block(padded_conv(stride=2)).body) if b.init is not None)
    assert "stride 1" in conv3x3(strided)
    half = conv2d(1, 64, 8, 8, 64, 3, 3, layout="NHWC", dtype="float16", acc="float16")
    assert conv3x3(next(b for b in iter_blocks(root_block(half).body) if b.init is not None)) == "not float32"


def test_the_four_by_four_form_computes_the_convolution_tvm_builds():
    """F(4x4, 3x3): 36 positions, 4x fewer multiply-adds, sixths in its coefficients."""
    func = padded_conv(size=23)  # 6 x 6 tiles of 4 x 4, the last row and column past the output
    form, (done,) = winograd_form(func, 4, 4)
    assert done.tile == 4 and done.winograd_macs == 36 * 36 * 64 * 64
    check = tirbyoc.verify(func, form)
    assert check.passed, check.describe()


def test_few_tiles_take_the_smaller_form():
    """Each of a position's matrix products reuses the transformed weight over its tiles; with
    fewer than MIN_TILES at m = 4 (ResNet's 7 x 7 and 14 x 14 layers) the form is m = 2, whose
    weight is 16 / 9 of the direct one's instead of 4x."""
    def conv(size):
        return Conv3x3("c", _Shaped((1, size, size, 512)), _Shaped((1, size + 2, size + 2, 512)), None, ())

    assert [tile_for(conv(s), 4) for s in (56, 28, 14, 7)] == [4, 4, 2, 2]
    assert tile_for(conv(56), 2) == 2 and MIN_TILES == 32


class _Shaped:
    def __init__(self, shape):
        self.shape = shape


def test_iterators_in_any_order_no_padding_a_batch_and_an_hwio_weight():
    """A convolution written by hand (iterators n, f, y, x, rc, ry, rx; no padding copy: the
    input is the parameter; weight [kh, kw, c, k]; two images of 9 x 11 outputs)."""
    func = conv2d(2, 64, 9, 11, 96, 3, 3, layout="NHWC").with_attr("layout_free_buffers", [1])
    form, (done,) = winograd_form(func, 4, 4)
    assert done.shape == (2, 7, 9, 96, 64) and done.tile == 2  # 2 x 2 x 3 tiles at m = 4: under MIN_TILES
    check = tirbyoc.verify(func, form)
    assert check.passed, check.describe()
