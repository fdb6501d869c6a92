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

from tirbyoc import (Cost, Intrinsic, IntrinsicGroup, Role, Runtime, Template, dot_product_desc,
                     dot_product_signature, requires_cpu, zero_fill_desc, zero_fill_signature)

NAME = "x86_vnni"
TARGET = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
EMULATED_NAME = "x86_vnni_emulated"
EMULATED_TARGET = {"kind": "llvm", "num-cores": 2}  # this CPU (`tirbyoc run` names its mcpu)


@cache
def dot_product(lanes: int = 16, k: int = 4, emulated: bool = False) -> Intrinsic:
    """C[lanes] += sum_k u8 A[k] * i8 B[lanes, k], one vpdpbusd (lanes=16, k=4); ``emulated``:
    the same values from portable vector code (`make_template`)."""
    if (lanes, k) != (16, 4):
        raise ValueError("vpdpbusd zmm computes exactly 16 lanes x 4 bytes")
    name = EMULATED_NAME if emulated else NAME

    def build():
        from tvm.script import tirx as T

        desc = dot_product_desc(16, 4, "uint8", "int8", "int32")

        @T.prim_func(s_tir=True)
        def impl(
            A: T.Buffer((4,), "uint8", offset_factor=1),
            B: T.Buffer((16, 4), "int8", offset_factor=1),
            C: T.Buffer((16,), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:16], A[0:4], B[0:16, 0:4])
                T.writes(C[0:16])
                if emulated:  # a Python bool: TVMScript parses only the branch taken
                    for i in T.vectorized(16):
                        C[i] = C[i] + (T.cast(A[0], "int32") * T.cast(B[i, 0], "int32")
                                       + T.cast(A[1], "int32") * T.cast(B[i, 1], "int32")
                                       + T.cast(A[2], "int32") * T.cast(B[i, 2], "int32")
                                       + T.cast(A[3], "int32") * T.cast(B[i, 3], "int32"))
                else:
                    C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                        C.vload([0], dtype="int32x16"),
                        T.reinterpret(
                            T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16),
                            dtype="int8x64",
                        ),
                        B.vload([0, 0], dtype="int8x64"),
                        dtype="int32x16",
                    )

        return desc, impl

    return Intrinsic(f"{name}.dot_16x4_u8i8i32", Role.COMPUTE,
                     *dot_product_signature(16, 4, "uint8", "int8", "int32"), build, cost=Cost(cycles=1),
                     doc=("vpdpbusd zmm" + (" emulated" if emulated else "")
                          + ": C[16] += u8 A[4] . i8 B[16,4] (B packed [N/16, K/4, 16, 4])"))


@cache
def zero_fill(lanes: int = 16, dtype: str = "int32", name: str = NAME) -> Intrinsic:
    """C[lanes] = 0 as one vector store."""

    def build():
        from tvm.script import tirx as T

        desc = zero_fill_desc(lanes, dtype)

        @T.prim_func(s_tir=True)
        def impl(C: T.Buffer((lanes,), dtype, offset_factor=1)) -> None:
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:lanes])
                C[T.ramp(T.int32(0), 1, lanes)] = T.broadcast(T.cast(0, dtype), lanes)

        return desc, impl

    return Intrinsic(
        f"{name}.zero_{lanes}_{dtype}",
        Role.INIT,
        *zero_fill_signature(lanes, dtype),
        build,
        cost=Cost(cycles=1),
        doc=f"zero {lanes} x {dtype} accumulator lanes",
    )


def make_template(emulated: bool = False) -> Template:
    """The VNNI template; ``emulated``: ``x86_vnni_emulated``, its dot product as portable
    vector code for this CPU (values verified here, times not VNNI's)."""
    name = EMULATED_NAME if emulated else NAME
    return Template(
        name=name,
        target=EMULATED_TARGET if emulated else TARGET,
        runtime=Runtime.LLVM,
        groups=(IntrinsicGroup("dot_u8i8i32", compute=dot_product(emulated=emulated),
                               init=zero_fill(name=name)),),
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
ZERO = zero_fill()
TEMPLATE = make_template()
EMULATED = make_template(emulated=True)
