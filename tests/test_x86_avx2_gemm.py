"""x86_avx2_gemm: the exact AVX2 int8 kernel call (operands widened once a call, vpmaddwd):
bit for bit equal to TVM's build on full-range data, for GEMMs with row and reduction
remainders and NHWC convolutions; short reductions and thin convolution windows refused for
x86_avx2 with the reason; the kernel's machine code holds the widening-free loop."""

import shutil
import subprocess

import numpy as np
import pytest
from cpu_templates import run_built, runnable

import tirbyoc
from tirbyoc.app.running.run import FALLBACKS
from tirbyoc.testing.workloads import conv2d, matmul


def _full_range(shapes, seed):
    rng = np.random.default_rng(seed)
    a = rng.choice(np.array([0, 1, 128, 254, 255], "uint8"), shapes[0])
    b = rng.choice(np.array([-128, -127, -1, 0, 126, 127], "int8"), shapes[1])
    return a, b


@pytest.mark.parametrize("workload", ["gemm", "gemm_remainders", "conv3x3", "conv1x1"])
def test_offload_is_exact_on_full_range_data(workload):
    """Offloaded to the kernel, verified by tirbyoc, and equal to TVM's build of the untouched
    function on inputs at the ends of their ranges (2 x 255 x -128 overflows 16 bits: a
    saturating vpmaddubsw would differ)."""
    t = runnable("x86_avx2_gemm")
    target = dict(t.target)
    func = {
        "gemm": lambda: matmul(64, 64, 512, "uint8", "int8", "int32", trans_b=True),
        # 37 rows (a padded 32-row block), K = 260 (a 256-long widening pass and a 4-long one)
        "gemm_remainders": lambda: matmul(37, 48, 260, "uint8", "int8", "int32", trans_b=True),
        "conv3x3": lambda: conv2d(1, 32, 10, 10, 32, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32"),
        "conv1x1": lambda: conv2d(1, 64, 9, 9, 48, 1, 1, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32"),
    }[workload]()
    off = tirbyoc.offload(func, "x86_avx2_gemm", target=target)
    assert off.coverage == 1.0, off.blocks[0].reason
    assert "x86_avx2_gemm.gemm" in off.blocks[0].intrinsic
    assert off.verification.passed and off.verification.max_abs_err == 0
    shapes = [tuple(int(x) for x in p.shape) for p in list(func.params)[:2]]
    a, b = _full_range(shapes, seed=len(workload))
    out = np.zeros(tuple(int(x) for x in func.params[-1].shape), "int32")
    got = run_built(off.func, target, [a, b, out.copy()])
    want = run_built(func, target, [a, b, out.copy()])
    assert np.array_equal(got, want)
    assert np.abs(want).max() > 2 ** 15  # the data reaches past 16 bits


def test_short_reduction_goes_to_the_vector_template():
    """A reduction under MIN_K is refused, saying which template takes it, and the default
    fallback after the kernel is x86_avx2."""
    from tirbyoc_intrinsics.x86_avx2_gemm import MIN_K

    runnable("x86_avx2_gemm")
    assert FALLBACKS["x86_avx2_gemm"] == "x86_avx2"
    func = matmul(64, 64, MIN_K // 2, "uint8", "int8", "int32", trans_b=True)
    off = tirbyoc.offload(func, "x86_avx2_gemm")
    assert not off.offloaded
    assert "x86_avx2's vpmaddwd intrinsic" in off.blocks[0].reason
    after = tirbyoc.offload(func, "x86_avx2")
    assert after.coverage == 1.0 and after.verification.passed


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_kernel_machine_code():
    """The built library holds the AVX2 kernel: the widening passes (vpmovzxbw for A,
    vpshufb + vpmovsxbw for B's panels) and a loop of broadcast loads and vpmaddwd on ymm."""
    from tirbyoc_intrinsics.x86_avx2_gemm import LIBRARY

    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(LIBRARY.build())],
                         capture_output=True, text=True, check=True).stdout
    for insn in ("vpmaddwd", "vpbroadcastd", "vpmovzxbw", "vpmovsxbw", "vpshufb"):
        assert insn in asm, insn
    assert any("vpmaddwd" in line and "%ymm" in line for line in asm.splitlines())
