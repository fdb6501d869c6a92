"""Hexagon HVX (128-byte vectors): vrmpy dot products, VTCM scratchpad, DMA into VTCM.

``vrmpy`` multiplies 32 groups of 4 bytes by 4 bytes and accumulates into 32 x i32:
C[32] += A[4] . B[32, 4]. The ``u8u8`` form is ``vrmpyub.acc`` (vector x scalar), the
``u8i8`` form ``vrmpybusv.acc`` (vector x vector). Each compute intrinsic comes in a DRAM
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

from functools import cache
from typing import Optional

from tirbyoc import Cost, Intrinsic, IntrinsicGroup, Operand, Role, Runtime, Scope, Template

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


@cache
def vrmpy(dtype_a: str = "uint8", dtype_b: str = "uint8", mem_scope: str = "global") -> Intrinsic:
    """C[32] += A[4] . B[32, 4] with one 128-byte vrmpy, operands in ``mem_scope``."""
    llvm_name = _VRMPY[(dtype_a, dtype_b)]
    vector_scalar = dtype_b == "uint8"

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def desc(
            A: T.Buffer((4,), dtype_a, offset_factor=1, scope=mem_scope),
            B: T.Buffer((32, 4), dtype_b, offset_factor=1, scope=mem_scope),
            C: T.Buffer((32,), "int32", offset_factor=1, scope=mem_scope),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:32], A[0:4], B[0:32, 0:4])
                T.writes(C[0:32])
                for i, k in T.grid(32, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

        @T.prim_func(s_tir=True)
        def impl(
            A: T.Buffer((4,), dtype_a, offset_factor=1, scope=mem_scope),
            B: T.Buffer((32, 4), dtype_b, offset_factor=1, scope=mem_scope),
            C: T.Buffer((32,), "int32", offset_factor=1, scope=mem_scope),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:32], A[0:4], B[0:32, 0:4])
                T.writes(C[0:32])
                a_i32 = T.reinterpret(A.vload([0], dtype_a + "x4"), dtype="int32")
                b_i32 = T.reinterpret(B.vload([0, 0], dtype=dtype_b + "x128"), dtype="int32x32")
                if vector_scalar:
                    C[T.ramp(T.int32(0), 1, 32)] = T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(llvm_name),
                        C[T.ramp(T.int32(0), 1, 32)], b_i32, a_i32, dtype="int32x32",
                    )
                else:
                    C[T.ramp(T.int32(0), 1, 32)] = T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(llvm_name),
                        C[T.ramp(T.int32(0), 1, 32)], T.broadcast(a_i32, 32), b_i32,
                        dtype="int32x32",
                    )

        return desc, impl

    where = "vtcm" if mem_scope == VTCM else "ddr"
    ab = f"{'u8' if dtype_a == 'uint8' else 'i8'}{'u8' if dtype_b == 'uint8' else 'i8'}"
    return Intrinsic(
        f"{NAME}.vrmpy_32x4_{ab}i32_{where}",
        Role.COMPUTE,
        [Operand("A", (4,), dtype_a, mem_scope), Operand("B", (32, 4), dtype_b, mem_scope),
         Operand("C", (32,), "int32", mem_scope)],
        [("i", 32, "S"), ("k", 4, "R")],
        build,
        cost=Cost(cycles=1),
        doc=f"{llvm_name.split('.')[-2]}: C[32] += A[4] . B[32,4] in {mem_scope}",
    )


@cache
def zero_fill(mem_scope: str = "global") -> Intrinsic:
    """C[32] = 0 (one HVX vector of i32)."""

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def desc(C: T.Buffer((32,), "int32", offset_factor=1, scope=mem_scope)) -> None:
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:32])
                for i in T.serial(32):
                    with T.sblock("init"):
                        vi = T.axis.remap("S", [i])
                        C[vi] = T.int32(0)

        @T.prim_func(s_tir=True)
        def impl(C: T.Buffer((32,), "int32", offset_factor=1, scope=mem_scope)) -> None:
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:32])
                C[T.ramp(T.int32(0), 1, 32)] = T.broadcast(T.int32(0), 32)

        return desc, impl

    where = "vtcm" if mem_scope == VTCM else "ddr"
    return Intrinsic(f"{NAME}.zero_32_i32_{where}", Role.INIT, [Operand("C", (32,), "int32", mem_scope)],
                     [("i", 32, "S")], build, doc=f"zero one i32 HVX vector in {mem_scope}")


@cache
def dma_load(size: int, dtype: str = "uint8") -> Intrinsic:
    """Copy a contiguous ``size``-element tile from DRAM into VTCM with the Hexagon DMA engine."""

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def desc(
            A: T.Buffer((size,), dtype, offset_factor=1),
            C: T.Buffer((size,), dtype, offset_factor=1, scope=VTCM),
        ) -> None:
            with T.sblock("root"):
                T.reads(A[0:size])
                T.writes(C[0:size])
                for i in T.serial(size):
                    with T.sblock("load"):
                        vi = T.axis.remap("S", [i])
                        C[vi] = A[vi]

        @T.prim_func(s_tir=True)
        def impl(
            A: T.Buffer((size,), dtype, offset_factor=1),
            C: T.Buffer((size,), dtype, offset_factor=1, scope=VTCM),
        ) -> None:
            with T.sblock("root"):
                T.reads(A[0:size])
                T.writes(C[0:size])
                T.evaluate(
                    T.tvm_call_packed(
                        "device_api.hexagon.dma_copy_dltensor",
                        T.tvm_stack_make_array(
                            T.address_of(C[0], dtype="handle"),
                            T.tvm_stack_make_shape(size, dtype="handle"),
                            0, 1, C.dtype, 0, dtype="handle",
                        ),
                        T.tvm_stack_make_array(
                            T.address_of(A[0], dtype="handle"),
                            T.tvm_stack_make_shape(size, dtype="handle"),
                            0, 1, A.dtype, 0, dtype="handle",
                        ),
                        T.cast(size, dtype="int"),
                        False,
                        dtype="int32",
                    )
                )

        return desc, impl

    return Intrinsic(
        f"{NAME}.dma_load_{size}_{dtype}",
        Role.LOAD,
        [Operand("A", (size,), dtype), Operand("C", (size,), dtype, VTCM)],
        [("i", size, "S")],
        build,
        cost=Cost(cycles=64 + size // 32),
        doc=f"DMA {size} x {dtype} DRAM -> VTCM",
    )


def _requires() -> Optional[str]:
    from tirbyoc.decl.host import hexagon_emulator_missing

    return hexagon_emulator_missing()


def make_template(vtcm_bytes: int = 4 * 1024 * 1024, dma_tile: int = 128, arch: str = "v66") -> Template:
    """The HVX template; ``vtcm_bytes`` sizes the VTCM scope, ``dma_tile`` the DMA copies,
    ``arch`` the DSP generation (`ARCHS`)."""
    groups = []
    for a, b in _VRMPY:
        for scope in ("global", VTCM):
            loads = (dma_load(dma_tile, a), dma_load(dma_tile, b)) if scope == VTCM else ()
            intrin = vrmpy(a, b, scope)
            groups.append(IntrinsicGroup(intrin.name.split(".", 1)[1], compute=intrin,
                                         init=zero_fill(scope), loads=tuple(dict.fromkeys(loads))))
    return Template(
        name=NAME,
        target=hexagon_target(arch),
        runtime=Runtime.DEVICE,
        groups=tuple(groups),
        scopes=(Scope(VTCM, vtcm_bytes, 128, "vector tightly coupled memory"),),
        requires=_requires,
        doc="Hexagon HVX 128B vrmpy dot products with VTCM staging and DMA",
        params={"vtcm_bytes": vtcm_bytes, "dma_tile": dma_tile, "arch": arch},
    )


TEMPLATE = make_template()
