"""x86 fp32: C[lanes] += A[0] * B[lanes] with one fused multiply-add, register-blocked.

The float core every fast CPU convolution library is built on (MLAS's, oneDNN's, BLIS's
micro-kernels): a row's activation broadcast to every lane, multiplied by ``lanes`` output
channels' weights and added to their accumulators in one ``vfmadd231ps``. Declared as a tensor
intrinsic, it goes through the machinery the int8 templates use - matching (convolutions read
in place, NHWC, no im2col copy), weights packed once at compile time as
``[N/lanes, K, lanes]`` (the reduction is a loop around the intrinsic, one step a call:
TVM's tensorize matches no unit-extent description loop), register blocks of accumulators, the elementwise chain after the
core (bias, ReLU, a residual add) fused into the block's write-back - where the ``blas``
template calls a library GEMM on an im2col copy and writes back per call.

* ``x86_fp32_avx2``: ``vfmadd231ps ymm``, 8 lanes (AVX2 + FMA3: every x86-64 CPU since
  2013-2015).
* ``x86_fp32_avx512``: ``vfmadd231ps zmm``, 16 lanes (AVX-512F).

The core's fused multiply-add rounds once per step, as TVM's own build does where LLVM
contracts its multiply and add; the sums run in the same order per output, so outputs agree
with TVM's build to float32 rounding (each offload is checked at a float tolerance).
"""

from functools import cache

from tirbyoc import (Intrinsic, IntrinsicGroup, Operand, Role, Template, VectorVariant, variants, vector_intrinsic,
                     zero_fill)

VARIANTS = variants(
    VectorVariant("x86_fp32_avx2", 8, "haswell", ("avx2", "fma"), "vfmadd231ps ymm"),
    VectorVariant("x86_fp32_avx512", 16, "skylake-avx512", ("avx512f",), "vfmadd231ps zmm"),
)


@cache
def fma(name: str = "x86_fp32_avx512") -> Intrinsic:
    """C[lanes] += A[0] * B[lanes]: one broadcast and one fused multiply-add (an explicit fma,
    not a multiply and an add: the fences a fused write-back puts on float products,
    `tirbyoc.rewrite.cpu.cpu_epilogue`, leave the core alone)."""
    lanes, instruction = VARIANTS[name].lanes, VARIANTS[name].instruction
    vec = f"float32x{lanes}"
    return vector_intrinsic(
        f"{name}.fma_{lanes}_f32", Role.COMPUTE,
        ([Operand("A", (1,), "float32"), Operand("B", (lanes,), "float32"), Operand("C", (lanes,), "float32")],
         [("i", lanes, "S")]),
        lambda T, A, B, C, i: C[i] + A[0] * B[i],
        lambda T, A, B, C: T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(f"llvm.fma.v{lanes}f32"),
                                                   T.broadcast(A[0], lanes), B.vload([0], vec), C.vload([0], vec),
                                                   dtype=vec),
        doc=f"{instruction}: C[{lanes}] += A[0] * B[{lanes}] (B packed [N/{lanes}, K, {lanes}])",
    )


def make_template(name: str = "x86_fp32_avx512") -> Template:
    """The fp32 fused multiply-add template: ``x86_fp32_avx2`` (ymm) or ``x86_fp32_avx512`` (zmm)."""
    v = VARIANTS[name]
    return v.template(IntrinsicGroup("fma_f32", compute=fma(name), init=zero_fill(name, v.lanes, "float32")),
                      doc=f"fp32 convolutions and matmuls as register-blocked {v.instruction} micro-kernels",
                      winograd=4)  # 3x3 convolutions as 36 matrix products of their 4x4 output tiles


TEMPLATE = make_template("x86_fp32_avx512")
AVX2 = make_template("x86_fp32_avx2")
