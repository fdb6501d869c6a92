"""Rows of known extent that no block of twelve accumulators divides (a 7 x 7 or 14 x 14
output) padded at compile time on a 16-register target: the output's height and width folded
into one row count, padded to a multiple of 12, each block run on its real rows only."""

import numpy as np
import pytest
from cpu_templates import run_built, runnable

import tirbyoc
from tirbyoc.testing.workloads import conv2d

AVX2 = "x86_fp32_avx2"


def _schedule(out) -> str:
    (core,) = out.offloaded
    return " ".join(str(s) for s in core.steps)


def _conv(hw, oc, stride=1, c=16, k=3):
    """A k x k NHWC convolution whose output is ``hw`` (an int: square; or (height, width))."""
    h, w = (hw, hw) if isinstance(hw, int) else hw
    return conv2d(1, c, (h - 1) * stride + k, (w - 1) * stride + k, oc, k, k, layout="NHWC", stride=stride)


@pytest.mark.parametrize("hw, oc, stride", [(7, 256, 1), (14, 256, 2), (7, 512, 1)])
def test_a_seven_wide_output_gets_a_block_of_twelve(hw, oc, stride):
    """A 7 x 7 output (49 rows: 7 x 1 blocks before) and a 14 x 14 one (196 rows: 2 x 4) take
    blocks of twelve accumulators over rows padded to a multiple of 12, verified against TVM."""
    runnable(AVX2)
    out = tirbyoc.offload(_conv(hw, oc, stride), AVX2)
    assert out.coverage == 1.0 and out.verification.passed, out.table()
    steps = _schedule(out)
    assert "rows padded to a multiple of 12 (no block of twelve divided them)" in steps, steps
    assert "each row block run on its real rows only" in steps, steps
    assert any(f"register-blocked {b} accumulator" in steps for b in ("6x2", "3x4", "4x3")), steps


@pytest.mark.parametrize("h, w", [(7, 7), (7, 5)])
def test_every_real_row_is_written_and_the_padding_never_is(h, w):
    """Built through tirbyoc's pipeline into an output pre-filled with NaN: every real row
    holds numpy's sums - 49 rows end in a block of one real row, 35 in one of two."""
    runnable(AVX2)
    out = tirbyoc.offload(_conv((h, w), 256), AVX2)
    assert "rows padded to a multiple of 12" in _schedule(out)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((1, h + 2, w + 2, 16)).astype("float32")
    weight = rng.standard_normal((3, 3, 16, 256)).astype("float32")
    nan = np.full((1, h, w, 256), np.nan, "float32")
    got = run_built(out.func, dict(tirbyoc.get_template(AVX2).target), [data, weight, nan])
    want = np.zeros((1, h, w, 256), "float32")
    for y in range(3):
        for x in range(3):
            want += np.einsum("nhwc,co->nhwo", data[:, y:y + h, x:x + w, :], weight[y, x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_plain_rows_are_padded_and_staged_block_by_block():
    """A 1x1 convolution of even width (28 x 28, 128 -> 128): its rows' staging is a plain copy,
    made per row block inside the parallel loop over them, feeding a block of twelve."""
    runnable(AVX2)
    out = tirbyoc.offload(_conv(28, 128, c=128, k=1), AVX2)
    assert out.coverage == 1.0 and out.verification.passed, out.table()
    steps = _schedule(out)
    assert "rows padded to a multiple of 12" in steps and "the rows' staging per row block" in steps, steps


@pytest.mark.parametrize("what, make, template", [
    ("a 1x1 convolution of 64 steps: the copy costs what the block gains", lambda: _conv(28, 256, c=64, k=1),
     AVX2),
    ("64 columns: the staging copy would cost more than the block gains", lambda: _conv(7, 64), AVX2),
    ("a 56-wide output already has its 4-row block", lambda: _conv(56, 256, c=8, k=1), AVX2),
    ("32 registers hold 7 x 3 accumulators", lambda: _conv(7, 256), "x86_fp32_avx512"),
])
def test_rows_that_need_no_padding_keep_their_loops(what, make, template):
    out = tirbyoc.offload(make(), template, verify=False)
    steps = _schedule(out)
    assert "register-blocked" in steps and "rows padded" not in steps, (what, steps)
