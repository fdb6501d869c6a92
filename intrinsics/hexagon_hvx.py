"""Hexagon HVX (128-byte vectors): vrmpy dot products, VTCM scratchpad, DMA into VTCM.

``vrmpy`` multiplies 32 groups of 4 bytes by 4 bytes and accumulates into 32 x i32:
C[32] += A[4] . B[32, 4]. The ``u8u8`` form is ``vrmpyub.acc`` (vector x scalar; also read
as u8 x u8 -> u32), the ``u8i8`` form ``vrmpybusv.acc`` (vector x vector). ``dmpy`` is the
int16 dot product C[32] += A[2] . B[32, 2] (``vmpyhv``, exact). Each compute intrinsic comes in a DRAM
(``global``) and a VTCM (``global.vtcm``) variant; ``dma_load_*`` copies a contiguous tile
into VTCM through TVM's Hexagon runtime (``device_api.hexagon.dma_copy_dltensor``).

The default target is what this TVM and QEMU handle: an ``llvm`` target with
``mtriple=hexagon``, HVX v66, 128-byte vectors. Its code runs under ``qemu-hexagon`` (Debian's
``qemu-user``, QEMU 7.2: HVX v66/v67), linked with tirbyoc's freestanding harness, and is
verified bit-exact against TVM's CPU build (`tirbyoc.offloading.hexagon`). ``arch="v68"``,
``"v69"`` or ``"v73"`` declare newer DSPs: TVM builds their code, QEMU 7.2 cannot run it, so
it is built only. TVM's own ``hexagon`` target kind is not used: it aborts this TVM's LLVM
on vrmpy.
"""

from functools import cache, partial
from typing import Optional

from tirbyoc import (Call, Cost, Intrinsic, IntrinsicGroup, Role, Runtime, Scope, Template, declare, dot_product,
                     tile_copy_signature, vector_intrinsic, zero_fill_signature)

NAME = "hexagon_hvx"
VTCM = "global.vtcm"
ARCHS = ("v66", "v67", "v68", "v69", "v73")  # v66/v67 run under QEMU 7.2; the rest build only


def hexagon_target(arch: str = "v66") -> dict:
    """The LLVM target for HVX ``arch`` with 128-byte vectors."""
    if arch not in ARCHS:
        raise ValueError(f"unknown Hexagon architecture {arch!r}; one of {', '.join(ARCHS)}")
    return {"kind": "llvm", "mtriple": "hexagon", "mcpu": f"hexagon{arch}",
            "mattr": [f"+hvx{arch}", "+hvx-length128b"], "num-cores": 4}


TARGET = hexagon_target()

_VRMPY = {
    ("uint8", "uint8"): "llvm.hexagon.V6.vrmpyub.acc.128B",
    ("uint8", "int8"): "llvm.hexagon.V6.vrmpybusv.acc.128B",
}
_SHORT = {"uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32", "uint32": "u32"}


def _where(mem_scope: str) -> str:
    return "vtcm" if mem_scope == VTCM else "ddr"


@cache
def vrmpy(dtype_a: str = "uint8", dtype_b: str = "uint8", mem_scope: str = "global",
          dtype_c: str = "int32") -> Intrinsic:
    """C[32] += A[4] . B[32, 4] with one 128-byte vrmpy, operands in ``mem_scope``.
    ``dtype_c="uint32"`` (u8 x u8 only) is the same instruction read as unsigned words:
    ``vrmpyub`` accumulates ``Vx.uw``."""
    llvm_name = _VRMPY[(dtype_a, dtype_b)]
    vector_scalar = dtype_b == "uint8"
    if dtype_c == "uint32" and not vector_scalar:
        raise ValueError("vrmpy accumulates u8 x i8 products into signed words only")

    def value(T, A, B, C):
        acc = T.reinterpret(C[T.ramp(T.int32(0), 1, 32)], dtype="int32x32")
        a_i32 = T.reinterpret(A.vload([0], dtype_a + "x4"), dtype="int32")
        b_i32 = T.reinterpret(B.vload([0, 0], dtype=dtype_b + "x128"), dtype="int32x32")
        if vector_scalar:  # vrmpyub: the vector of B by A's 4 bytes as one scalar word
            return T.reinterpret(T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(llvm_name), acc, b_i32, a_i32,
                                                         dtype="int32x32"), dtype=dtype_c + "x32")
        return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(llvm_name), acc, T.broadcast(a_i32, 32), b_i32,
                                       dtype="int32x32")

    abc = _SHORT[dtype_a] + _SHORT[dtype_b] + _SHORT[dtype_c]
    return dot_product(f"{NAME}.vrmpy_32x4_{abc}_{_where(mem_scope)}", 32, 4, (dtype_a, dtype_b, dtype_c), value,
                       scope=mem_scope, doc=f"{llvm_name.split('.')[-2]}: C[32] += A[4] . B[32,4] in {mem_scope}")


def vmpyhv(T, A, B, C):
    """The widening ``vmpyhv`` (even products in the low vector of the pair, odd in the high)
    and two wrapping adds."""
    products = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.hexagon.V6.vmpyhv.128B"),
                                       T.broadcast(T.reinterpret(A.vload([0], "int16x2"), dtype="int32"), 32),
                                       T.reinterpret(B.vload([0, 0], dtype="int16x64"), dtype="int32x32"),
                                       dtype="int32x64")
    even, odd = (T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(f"llvm.hexagon.V6.{half}.128B"), products,
                                         dtype="int32x32") for half in ("lo", "hi"))
    return C[T.ramp(T.int32(0), 1, 32)] + even + odd


@cache
def dmpy_i16(mem_scope: str = "global") -> Intrinsic:
    """C[32] += A[2] . B[32, 2] in int16 x int16 -> int32, exactly (wrapping like the
    description). TVM's own ``dot_product_32x2_i16i16i32_vdmpy`` uses ``vdmpyhvsat``, which
    saturates where a sum leaves int32 ((-32768)^2 + (-32768)^2, or an accumulator at its
    limit) while its description wraps; this one is `vmpyhv`."""
    return dot_product(f"{NAME}.dmpy_32x2_i16i16i32_{_where(mem_scope)}", 32, 2, ("int16", "int16", "int32"),
                       vmpyhv, scope=mem_scope, cost=Cost(cycles=2),
                       doc=f"vmpyhv + 2 adds: C[32] += A[2] . B[32,2], int16 -> int32 in {mem_scope}")


@cache
def zero_fill(mem_scope: str = "global", dtype: str = "int32") -> Intrinsic:
    """C[32] = 0 (one HVX vector of 32-bit words)."""
    short = _SHORT[dtype]
    return vector_intrinsic(f"{NAME}.zero_32_{short}_{_where(mem_scope)}", Role.INIT,
                            zero_fill_signature(32, dtype, mem_scope), lambda T, C, i: T.cast(0, dtype),
                            lambda T, C: T.broadcast(T.cast(0, dtype), 32), accumulate=False,
                            doc=f"zero one {short} HVX vector in {mem_scope}")


@cache
def dma_load(size: int, dtype: str = "uint8") -> Intrinsic:
    """Copy a contiguous ``size``-element tile from DRAM into VTCM with the Hexagon DMA engine."""
    nbytes = {"uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4}[dtype]

    def dltensor(T, X):
        return T.tvm_stack_make_array(T.address_of(X[0], dtype="handle"), T.tvm_stack_make_shape(size, dtype="handle"),
                                      0, 1, X.dtype, 0, dtype="handle")

    return declare(f"{NAME}.dma_load_{size}_{dtype}", Role.LOAD,
                   tile_copy_signature((size,), dtype, "global", VTCM, axes=("i",)), lambda T, S, D, i: T.cast(S[i], dtype),
                   Call(lambda T, S, D: T.tvm_call_packed("device_api.hexagon.dma_copy_dltensor", dltensor(T, D),
                                                          dltensor(T, S), T.cast(size * nbytes, dtype="int"),  # bytes
                                                          False, dtype="int32")),
                   accumulate=False, block="load", cost=Cost(cycles=64 + size // 32),
                   doc=f"DMA {size} x {dtype} DRAM -> VTCM")


def _requires(arch: str) -> Optional[str]:
    """Why this DSP's code cannot run here: not emulated by this QEMU, or its tools missing."""
    from tirbyoc.decl.host import hexagon_emulator_missing

    return hexagon_emulator_missing(f"hexagon{arch}")


def make_template(vtcm_bytes: int = 4 * 1024 * 1024, dma_tile: int = 128, arch: str = "v66") -> Template:
    """The HVX template; ``vtcm_bytes`` sizes the VTCM scope, ``dma_tile`` the DMA copies,
    ``arch`` the DSP generation (`ARCHS`)."""
    groups = []
    for scope in ("global", VTCM):
        computes = [vrmpy(a, b, scope) for a, b in _VRMPY]
        computes += [vrmpy("uint8", "uint8", scope, "uint32"), dmpy_i16(scope)]
        for intrin in computes:
            a, b, c = (op.dtype for op in intrin.operands)
            loads = (dma_load(dma_tile, a), dma_load(dma_tile, b)) if scope == VTCM else ()
            groups.append(IntrinsicGroup(intrin.name.split(".", 1)[1], compute=intrin,
                                         init=zero_fill(scope, c), loads=tuple(dict.fromkeys(loads))))
    return Template(
        name=NAME,
        target=hexagon_target(arch),
        runtime=Runtime.DEVICE,
        groups=tuple(groups),
        scopes=(Scope(VTCM, vtcm_bytes, 128, "vector tightly coupled memory"),),
        requires=partial(_requires, arch),
        doc="Hexagon HVX 128B vrmpy dot products with VTCM staging and DMA",
        params={"vtcm_bytes": vtcm_bytes, "dma_tile": dma_tile, "arch": arch},
        factory=make_template,
    )


TEMPLATE = make_template()
