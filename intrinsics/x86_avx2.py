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

from tirbyoc import Intrinsic, IntrinsicGroup, Template, VectorVariant, variants, zero_fill
from tirbyoc import dot_product as family_dot_product

K = 2  # bytes of A per lane and call: vpmaddwd sums pairs of products
VARIANTS = variants(
    VectorVariant("x86_avx2", 8, "haswell", ("avx2",), "vpmaddwd ymm", llvm="llvm.x86.avx2.pmadd.wd"),
    VectorVariant("x86_avx512bw", 16, "skylake-avx512", ("avx512bw",), "vpmaddwd zmm",
                  llvm="llvm.x86.avx512.pmaddw.d.512"),
)


def vpmaddwd(lanes: int, llvm_name: str):
    """vpmaddwd on operands widened to 16 bits, added to C: A's two bytes broadcast as one u16,
    then widened (one vpbroadcastw and one vpmovzxbw; widening first costs three more)."""
    wide = 2 * lanes

    def value(T, A, B, C):
        a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x2"), dtype="uint16"), lanes),
                          dtype=f"uint8x{wide}")
        return C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(llvm_name), T.cast(a, f"int16x{wide}"),
            T.cast(B.vload([0, 0], f"int8x{wide}"), f"int16x{wide}"), dtype=f"int32x{lanes}")

    return value


@cache
def dot_product(name: str = "x86_avx2") -> Intrinsic:
    """C[lanes] += sum_k u8 A[k] * i8 B[lanes, k] over k < 2: one ``vpmaddwd`` on operands
    widened to 16 bits (exact), then one 32-bit add."""
    v = VARIANTS[name]
    return family_dot_product(f"{name}.dot_{v.lanes}x{K}_u8i8i32", v.lanes, K, ("uint8", "int8", "int32"),
                              vpmaddwd(v.lanes, v.llvm),
                              doc=(f"{v.instruction} on operands widened to 16 bits: C[{v.lanes}] += u8 A[2] . "
                                   f"i8 B[{v.lanes},2] (B packed [N/{v.lanes}, K/2, {v.lanes}, 2])"))


def make_template(name: str = "x86_avx2") -> Template:
    """The exact ``vpmaddwd`` int8 template: ``x86_avx2`` (ymm) or ``x86_avx512bw`` (zmm)."""
    v = VARIANTS[name]
    return v.template(IntrinsicGroup("dot_u8i8i32", compute=dot_product(name), init=zero_fill(name, v.lanes, "int32")),
                      doc=(f"exact int8 dot products without VNNI: u8 activations x i8 weights -> i32 with "
                           f"{v.instruction} on 16-bit operands"))


TEMPLATE = make_template("x86_avx2")
AVX512BW = make_template("x86_avx512bw")
