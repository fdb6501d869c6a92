"""x86 AVX-512 VNNI: u8 x i8 -> i32 dot products with ``vpdpbusd``.

One ``vpdpbusd zmm`` multiplies 16 groups of 4 unsigned bytes by 4 signed bytes and adds
each group's sum to a 32-bit lane: C[16] += A[4] . B[16, 4]. The products are summed in
32 bits, so full-range data never saturates (unlike ``vpmaddubsw``, which TVM's
``dot_16x4_avx512`` uses and which saturates at int16).

LLVM 22 declares the intrinsic as ``(<16 x i32>, <64 x i8>, <64 x i8>)``: A's 4 bytes are
broadcast as one i32 to 16 lanes and reinterpreted as 64 bytes; B's 64 bytes load as they are.
(TVM's ``dot_16x4_vnni`` still passes ``<16 x i32>`` and no longer builds.)

``x86_vnni_emulated`` (``make_template(emulated=True)``) is the same template with
``vpdpbusd`` written as portable vector code (widen, multiply, add in 32 bits: the
instruction's values, bit for bit), built for this CPU. It runs the whole rewrite - tiles,
packed weights, fused epilogues, views - on a CPU without AVX-512 VNNI so that what tirbyoc
does with VNNI is verified there too; its times are not VNNI's, and `tirbyoc run` reports none.
"""

from functools import cache

from tirbyoc import Intrinsic, IntrinsicGroup, Runtime, Template, requires_cpu, zero_fill
from tirbyoc import dot_product as family_dot_product

NAME = "x86_vnni"
TARGET = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
EMULATED_NAME = "x86_vnni_emulated"
EMULATED_TARGET = {"kind": "llvm", "num-cores": 2}  # this CPU (`tirbyoc run` names its mcpu)


def vpdpbusd(T, A, B, C):
    """LLVM's vpdpbusd: A's 4 bytes broadcast as one i32 to 16 lanes, read as 64 bytes."""
    a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="int8x64")
    return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                                   C.vload([0], dtype="int32x16"), a, B.vload([0, 0], dtype="int8x64"), dtype="int32x16")


def vpdpbusd_emulated(T, A, B, C, i):
    """Lane ``i`` of vpdpbusd as portable code: four products widened to 32 bits, summed."""
    return C[i] + sum((T.cast(A[k], "int32") * T.cast(B[i, k], "int32") for k in range(1, 4)),
                      T.cast(A[0], "int32") * T.cast(B[i, 0], "int32"))


@cache
def dot_product(emulated: bool = False) -> Intrinsic:
    """C[16] += sum_k u8 A[k] * i8 B[16, k] over k < 4: one vpdpbusd zmm; ``emulated``: the same
    values from portable vector code (`make_template`)."""
    return family_dot_product(f"{EMULATED_NAME if emulated else NAME}.dot_16x4_u8i8i32", 16, 4,
                              ("uint8", "int8", "int32"), vpdpbusd_emulated if emulated else vpdpbusd,
                              per_lane=emulated, doc=("vpdpbusd zmm" + (" emulated" if emulated else "")
                                                      + ": C[16] += u8 A[4] . i8 B[16,4] (B packed [N/16, K/4, 16, 4])"))


def make_template(emulated: bool = False) -> Template:
    """The VNNI template; ``emulated``: ``x86_vnni_emulated``, its dot product as portable
    vector code for this CPU (values verified here, times not VNNI's)."""
    name = EMULATED_NAME if emulated else NAME
    return Template(
        name=name,
        target=EMULATED_TARGET if emulated else TARGET,
        runtime=Runtime.LLVM,
        groups=(IntrinsicGroup("dot_u8i8i32", compute=dot_product(emulated=emulated), init=zero_fill(name, 16, "int32")),),
        # portable code runs on any LLVM host
        requires=None if emulated else requires_cpu(
            "avx512vnni", what="AVX-512 VNNI", instead=f"-t {EMULATED_NAME} runs the same rewrite with vpdpbusd "
                                                       "emulated (its values, bit for bit; not its times)"),
        doc=("AVX-512 VNNI int8 dot products (u8 activations x i8 weights -> i32)"
             + (", vpdpbusd emulated in portable vector code" if emulated else "")),
        emulates="vpdpbusd (AVX-512 VNNI)" if emulated else "",
        channels_last=True,  # four input channels per lane, sixteen output channels per store
        fuses_epilogues=True,  # requantized in the register block's write-back, stored as 8 bits
    )


DOT = dot_product()
ZERO = zero_fill(NAME, 16, "int32")
TEMPLATE = make_template()
EMULATED = make_template(emulated=True)
