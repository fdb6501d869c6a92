"""x86_avx512_bf16: bf16 x bf16 -> float32 GEMM with AVX512_BF16's ``vdpbf16ps``.

``vdpbf16ps zmm`` multiplies 16 pairs of bf16 by 16 pairs and adds each pair's two products to
a float32 lane: C[16] += A[2] . B[16, 2], twice the multiply-adds of an fp32 ``vfmadd231ps``
per instruction (AMD Zen 4 / 5, Intel Cooper Lake, Sapphire Rapids and later). It is the
bf16 core where AMX is missing, and what ``x86_amx_bf16`` hands the reductions too short for
tiles (`tirbyoc.app.running.run.FALLBACKS`).

The kernel (``csrc/bf16_shim.c``) is declared like AMX's (`x86_amx.kernel_group`): 32 x 32
outputs a call over the block's whole reduction, activations read in place, the weight packed
once as [N/16, K/2, 16, 2], the write-back (bias, ReLU, the next layer's bf16 cast) fused after
it. It is C rather than a TIR intrinsic because TVM 0.27 stores bfloat16 vectors as 16-bit
integers before LLVM sees them, and LLVM's ``vdpbf16ps`` takes ``<32 x bfloat>``.
``x86_amx_bf16_emulated`` (the same call, the same packed layout, in portable C) verifies this
rewrite on CPUs without AVX512_BF16.
"""

from __future__ import annotations

from pathlib import Path

from tirbyoc import ExternLibrary, Template

from .x86_amx import BF16, BF16_EMULATED, Kernel, kernel_template, native_requires

# Zen 4 / 5 and Sapphire Rapids run every instruction of Cooper Lake (AVX-512 with BF16, no AMX)
TARGET = {"kind": "llvm", "mcpu": "cooperlake", "num-cores": 2}
KERNEL = Kernel("x86_avx512_bf16", "tirbyoc_avx512bf16_gemm", "bfloat16", "bfloat16", "float32", "vdpbf16ps",
                ("avx512f", "avx512bf16"), pads_k=True, any_rows=True)
LIBRARY = ExternLibrary(name="tirbyoc_bf16_shim", sources=[Path(__file__).parent / "csrc" / "bf16_shim.c"],
                        symbols=[KERNEL.symbol])
assert KERNEL.group == BF16.group  # the same packed weight as AMX-BF16's


def make_template() -> Template:
    return kernel_template(KERNEL, TARGET, LIBRARY, native_requires(KERNEL, BF16_EMULATED),
                           "AVX512_BF16 bf16 GEMM (bf16 x bf16 -> float32, --precision bf16), a kernel on packed weights")


TEMPLATE = make_template()
