"""x86 int8 without VNNI: u8 x i8 -> i32 dot products with ``vpmaddwd``, exact.

Most x86 CPUs in service have no AVX-512 VNNI (AMD Zen 2 and 3, Intel before Ice Lake). Their
int8 instruction, ``vpmaddubsw``, adds two u8 x i8 products in a *saturating* 16-bit lane
(255 * 127 * 2 > 32767), which is what ONNX Runtime's AVX2 kernels use and why their outputs
can leave the ONNX semantics. This template widens both operands to 16 bits first and uses
``vpmaddwd``: each 32-bit lane gets the sum of two 16 x 16-bit products, computed in 32 bits,
so every value is exact for the full u8 and i8 ranges.

One call: C[lanes] += A[2] . B[lanes, 2]. A's two bytes are zero-extended to two i16 and
broadcast as one i32 to every lane; B's ``2 x lanes`` bytes (packed once, at compile time, as
[N/lanes, K/2, lanes, 2], so a tile is contiguous) are sign-extended to i16 on load.

* ``x86_avx2``: ``vpmaddwd ymm``, 8 lanes (AVX2: every x86-64 CPU since 2013-2015).
* ``x86_avx512bw``: ``vpmaddwd zmm``, 16 lanes (AVX-512 BW without VNNI: Skylake-SP/X,
  Cascade Lake's predecessors; where VNNI exists x86_vnni is faster and is chosen first).

Both use the same machinery as x86_vnni (matching, packed weights, register blocking,
epilogues fused into the write-back, channels-last models); only the core and its
reduction tile (2 input channels, not 4) differ.
"""

from functools import cache

from tirbyoc import (Cost, Intrinsic, IntrinsicGroup, Role, Runtime, Template, VectorVariant, dot_product_desc,
                     dot_product_signature, variants)

from .x86_vnni import zero_fill

K = 2  # bytes of A per lane and call: vpmaddwd sums pairs of products
VARIANTS = variants(
    VectorVariant("x86_avx2", 8, "haswell", ("avx2",), "vpmaddwd ymm", llvm="llvm.x86.avx2.pmadd.wd"),
    VectorVariant("x86_avx512bw", 16, "skylake-avx512", ("avx512bw",), "vpmaddwd zmm",
                  llvm="llvm.x86.avx512.pmaddw.d.512"),
)


@cache
def dot_product(name: str = "x86_avx2") -> Intrinsic:
    """C[lanes] += sum_k u8 A[k] * i8 B[lanes, k] over k < 2: one ``vpmaddwd`` on operands
    widened to 16 bits (exact), then one 32-bit add."""
    variant = VARIANTS[name]
    lanes, llvm_name, instruction = variant.lanes, variant.llvm, variant.instruction
    wide = 2 * lanes

    def build():
        from tvm.script import tirx as T

        desc = dot_product_desc(lanes, K, "uint8", "int8", "int32")

        @T.prim_func(s_tir=True)
        def impl(
            A: T.Buffer((K,), "uint8", offset_factor=1),
            B: T.Buffer((lanes, K), "int8", offset_factor=1),
            C: T.Buffer((lanes,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:K], B[0:lanes, 0:K])
                T.writes(C[0:lanes])
                # A's two bytes broadcast as one u16, then widened: one vpbroadcastw and one
                # vpmovzxbw (widening first costs a scalar load, a move and a shuffle more)
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(llvm_name),
                    T.cast(T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x2"), dtype="uint16"),
                                                     lanes), dtype=f"uint8x{wide}"), f"int16x{wide}"),
                    T.cast(B.vload([0, 0], f"int8x{wide}"), f"int16x{wide}"),
                    dtype=f"int32x{lanes}",
                )

        return desc, impl

    return Intrinsic(
        f"{name}.dot_{lanes}x{K}_u8i8i32",
        Role.COMPUTE,
        *dot_product_signature(lanes, K, "uint8", "int8", "int32"),
        build,
        cost=Cost(cycles=1),
        doc=(f"{instruction} on operands widened to 16 bits: C[{lanes}] += u8 A[2] . i8 B[{lanes},2] "
             f"(B packed [N/{lanes}, K/2, {lanes}, 2])"),
    )


def make_template(name: str = "x86_avx2") -> Template:
    """The exact ``vpmaddwd`` int8 template: ``x86_avx2`` (ymm) or ``x86_avx512bw`` (zmm)."""
    variant = VARIANTS[name]
    lanes, instruction = variant.lanes, variant.instruction
    return Template(
        name=name,
        target=variant.target,
        runtime=Runtime.LLVM,
        groups=(IntrinsicGroup("dot_u8i8i32", compute=dot_product(name),
                               init=zero_fill(lanes, name=name)),),
        requires=variant.requires(),
        doc=(f"exact int8 dot products without VNNI: u8 activations x i8 weights -> i32 with "
             f"{instruction} on 16-bit operands"),
        channels_last=True,  # two input channels per lane, `lanes` output channels per store
        fuses_epilogues=True,  # requantized in the register block's write-back, stored as 8 bits
    )


TEMPLATE = make_template("x86_avx2")
AVX512BW = make_template("x86_avx512bw")
