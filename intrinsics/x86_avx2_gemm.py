"""x86_avx2_gemm: exact int8 GEMM blocks on AVX2 as a kernel call, its operands widened once a call.

AVX2 has no exact 8-bit dot product (``vpmaddubsw`` saturates), so x86_avx2's intrinsic widens
both operands to 16 bits for ``vpmaddwd`` inside its loop: per step, two shuffles for each row
of A and one for each column tile of B beside each pair of ``vpmaddwd`` / ``vpaddd``, and
the shuffles, not the multiplies, bound it (about two thirds of the ``vpmaddwd`` peak on a
large layer). This template calls a kernel (``csrc/avx2_gemm.c``) declared like AMX's
(`x86_amx.kernel_group`): a call takes a 32-row block of outputs over the block's whole
reduction, the activations read in place, the weight packed once into x86_vnni's
[N/16, K/4, 16, 4] layout; inside, each call widens its rows and each 16-column panel once
per 256 steps of the reduction into 24 KB that stay in L1, and its 4 x 2 register block reads
them with broadcast loads: 8 ``vpmaddwd`` and 8 ``vpaddd`` a step. The write-back
(requantization, ReLU, the residual add) is fused after the call, as for AMX. Reductions
shorter than `MIN_K` and convolution windows of fewer than 16 bytes a pixel (the stem) go to
x86_avx2, which the default list puts after it (`tirbyoc.app.running.run.FALLBACKS`).

Every value is exact (the same 32-bit sums as TVM's build); AVX2 is on every x86-64 CPU of the
last decade, so there is no emulated twin.
"""

from pathlib import Path

from tirbyoc import ExternLibrary, Template, requires_cpu

from .x86_amx import MIN_PIXEL_BYTES, Kernel, kernel_template

TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
MIN_K = 64  # shorter reductions: the call's widening and write-back outweigh its loop
KERNEL = Kernel("x86_avx2_gemm", "tirbyoc_avx2_gemm_u8s8", "uint8", "int8", "int32", "vpmaddwd ymm",
                ("avx2",), MIN_K, shorter="x86_avx2's vpmaddwd intrinsic", min_pixel_bytes=MIN_PIXEL_BYTES)
LIBRARY = ExternLibrary(name="tirbyoc_avx2_gemm", sources=[Path(__file__).parent / "csrc" / "avx2_gemm.c"],
                        symbols=[KERNEL.symbol])


def make_template() -> Template:
    return kernel_template(KERNEL, TARGET, LIBRARY, requires_cpu(*KERNEL.flags, instruction=KERNEL.instruction),
                           "exact int8 GEMM blocks on AVX2 (u8 x i8 -> i32, vpmaddwd on operands widened once a "
                           "call), a kernel on packed weights")


TEMPLATE = make_template()
