"""x86_amx: Intel AMX tiles, u8 x i8 -> i32 (``tdpbusd``), as a destination-passing GEMM kernel.

AMX is a matrix engine inside the CPU (Intel Xeon since Sapphire Rapids): eight tile registers
of 16 rows x 64 bytes, loaded and stored row-strided (``tileloadd`` / ``tilestored``), and one
instruction ``tdpbusd`` that adds A[16 x 64 u8] . B[16 x 64 i8 in 4-byte groups] to a
16 x 16 int32 tile - 16,384 multiply-adds, about 6x what AVX-512 VNNI's ``vpdpbusd`` does in
the same time on the same core (`bench/gemm.py --amx-peak`).

The kernel (``csrc/amx_shim.c``) keeps 2 x 2 accumulator tiles in the tile registers over
the whole reduction, so the template declares it as a library call that takes a block's
exact M, N and K (``resize``): activations are read in place, row-strided; the weight is
packed into the [N/16, K/4, 16, 4] layout both VNNI and AMX read (``Layout.packed``), once,
at compile time where it is a constant. N must be a multiple of 16 and K of 4; rows and
reductions of any other length run in the kernel (remainders through a zero-padded block,
the last K % 64 columns with ``vpdpbusd``). A reduction under 128 (a 1x1 convolution of 64
channels, MobileNetV2's narrow ones) is refused for ``x86_vnni``, which the default template
list puts after it: one or two ``tdpbusd`` a call leave the block's zeroing and write-back
the whole cost (ResNet-50's res2 1x1 expansion: 404 GOPS on AMX, 605 on VNNI, one thread).

Linux gives a process the tile registers only when asked (``arch_prctl``): the library asks
when it is loaded, in whatever process loads it. ``x86_amx_emulated`` is the same template
with the kernel built as portable C (the same 32-bit sums): it verifies every AMX rewrite on
a CPU without AMX; its times are not AMX's, and `tirbyoc run` reports none.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from pathlib import Path
from typing import Optional

from tirbyoc import Cost, ExternLibrary, Intrinsic, IntrinsicGroup, Layout, Operand, Role, Runtime, Template, TirbyocError


NAME = "x86_amx"
EMULATED_NAME = "x86_amx_emulated"
TARGET = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
EMULATED_TARGET = {"kind": "llvm", "num-cores": 2}
PANEL, GROUP = 16, 4  # B's packing: 16 output channels x 4 reduction bytes per 64-byte row
# The matcher's first tile; `resize` re-declares the kernel for a block's exact extents. A
# reduction tile wider than a convolution's channels makes the matcher fuse (kh, kw, c) into
# one reduction of 9 x c, so that the accumulators stay in tiles over all of it.
TILE, TILE_K = 32, 1024
MIN_K = 128  # shorter reductions are refused: `x86_vnni`, next in the list, is faster there (below)
WEIGHT = Layout.packed((PANEL, GROUP))
STRIDED = Layout.row_strided()
SOURCE = Path(__file__).parent / "csrc" / "amx_shim.c"
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158

LIBRARY = ExternLibrary(name="tirbyoc_amx_shim", sources=[SOURCE],
                        symbols=["tirbyoc_amx_gemm_u8s8", "tirbyoc_amx_granted"])
EMULATED_LIBRARY = ExternLibrary(name="tirbyoc_amx_shim_emulated", sources=[SOURCE],
                                 symbols=["tirbyoc_amx_emulated_gemm_u8s8", "tirbyoc_amx_emulated_granted"],
                                 defines=["TIRBYOC_AMX_EMULATED"])


@cache
def gemm(m: int, n: int, k: int, emulated: bool = False) -> Intrinsic:
    """C[m, n] += u8 A[m, k] . i8 B[n, k] (B packed [n/16, k/4, 16, 4]) with AMX tiles."""
    name = EMULATED_NAME if emulated else NAME
    symbol = "tirbyoc_amx_emulated_gemm_u8s8" if emulated else "tirbyoc_amx_gemm_u8s8"

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def desc(
            A: T.Buffer((m, k), "uint8", offset_factor=1),
            B: T.Buffer((n, k), "int8", offset_factor=1),
            C: T.Buffer((m, n), "int32", offset_factor=1),
        ) -> None:
            with T.sblock("root"):
                T.reads(C[0:m, 0:n], A[0:m, 0:k], B[0:n, 0:k])
                T.writes(C[0:m, 0:n])
                for i, j, kk in T.grid(m, n, k):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                        C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(B[vj, vk], "int32")

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
            sa = T.int32()
            sc = T.int32()
            A = T.match_buffer(a, (m, k), "uint8", strides=[sa, 1], offset_factor=1)
            B = T.match_buffer(b, (n // PANEL, k // GROUP, PANEL, GROUP), "int8", offset_factor=1)
            C = T.match_buffer(c, (m, n), "int32", strides=[sc, 1], offset_factor=1)
            with T.sblock("root"):
                T.reads(C[0:m, 0:n], A[0:m, 0:k], B[0 : n // PANEL, 0 : k // GROUP, 0:PANEL, 0:GROUP])
                T.writes(C[0:m, 0:n])
                T.evaluate(T.call_extern("int32", symbol, m, n, k, A.access_ptr("r"), sa,
                                         B.access_ptr("r"), C.access_ptr("rw"), sc))

        return desc, impl

    return Intrinsic(
        f"{name}.gemm_{m}x{n}x{k}_u8i8i32", Role.COMPUTE,
        [Operand("A", (m, k), "uint8", layout=STRIDED), Operand("B", (n, k), "int8", layout=WEIGHT),
         Operand("C", (m, n), "int32", layout=STRIDED)],
        [("i", m, "S"), ("j", n, "S"), ("k", k, "R")], build,
        cost=Cost(cycles=max(1.0, m * n * k / 1024.0)),
        doc=("tdpbusd" + (" emulated" if emulated else "") + f": C[{m},{n}] += u8 A[{m},{k}] . i8 B "
             "(B packed [N/16, K/4, 16, 4]; 2x2 accumulator tiles kept over K)"),
    )


@cache
def zero_block(emulated: bool = False) -> Intrinsic:
    """C[32, 32] int32 = 0 in 16-lane vector stores, row by row (a row-strided block): the
    register block's init, which TVM's scalar loop made as slow as the AMX call itself."""
    name = EMULATED_NAME if emulated else NAME

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def desc(C: T.Buffer((TILE, TILE), "int32", offset_factor=1)) -> None:
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:TILE, 0:TILE])
                for i, j in T.grid(TILE, TILE):
                    with T.sblock("init"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        C[vi, vj] = 0

        @T.prim_func(s_tir=True)
        def impl(c: T.handle) -> None:
            sc = T.int32()
            C = T.match_buffer(c, (TILE, TILE), "int32", strides=[sc, 1], offset_factor=1)
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:TILE, 0:TILE])
                for i in T.serial(TILE):
                    for h in T.unroll(TILE // 16):
                        C[i, T.ramp(h * 16, 1, 16)] = T.broadcast(T.int32(0), 16)

        return desc, impl

    return Intrinsic(f"{name}.zero_{TILE}x{TILE}_int32", Role.INIT, [Operand("C", (TILE, TILE), "int32", layout=STRIDED)],
                     [("i", TILE, "S"), ("j", TILE, "S")], build, cost=Cost(cycles=TILE * TILE / 16),
                     doc=f"zero a {TILE}x{TILE} int32 accumulator block in 16-lane stores")


def _group(emulated: bool, k: int = TILE_K) -> IntrinsicGroup:
    """The GEMM group: 32 x 32 outputs a call (the kernel's 2x2 accumulator tiles, which the
    CPU schedule keeps as one register block and writes back once, its epilogue fused), the
    whole reduction; ``resize`` re-declares it for a block's exact K (a multiple of 4, the
    packed weight's groups), and the block is padded to the 32 x 32 tile."""

    def resize(ext: dict) -> IntrinsicGroup:
        depth = ext["vk"]
        if depth % GROUP:
            raise TirbyocError(f"the AMX kernel reads weights packed in groups of {GROUP} bytes: "
                               f"K = {depth} must be a multiple of {GROUP}")
        if depth < MIN_K:
            raise TirbyocError(f"a reduction of {depth} (under {MIN_K}) is one or two tdpbusd a call beside "
                               "the 32 x 32 block's zeroing and write-back; a VNNI template takes it faster")
        return _group(emulated, depth)

    return IntrinsicGroup("gemm_u8i8i32" + (f"_k{k}" if k != TILE_K else ""), compute=gemm(TILE, TILE, k, emulated),
                          init=zero_block(emulated), resize=resize, resize_pads=True)


def _syscall_grants_amx() -> bool:
    """Whether Linux grants this process the AMX tile state (what the library asks for)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _requires() -> Optional[str]:
    from tirbyoc.decl.host import cpuinfo_flags

    missing = [f for f in ("amx_tile", "amx_int8", "avx512_vnni") if f not in cpuinfo_flags()]
    if missing:
        return (f"this CPU lacks {', '.join(missing)} (Intel AMX: Xeon Sapphire Rapids and later); "
                f"-t {EMULATED_NAME} runs the same rewrite with the kernel in portable C "
                "(its values, bit for bit; not its times)")
    if not _syscall_grants_amx():
        return ("Linux refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); "
                f"-t {EMULATED_NAME} runs the same rewrite without it")
    return None


def make_template(emulated: bool = False) -> Template:
    """The AMX template; ``emulated``: ``x86_amx_emulated``, the kernel as portable C."""
    return Template(
        name=EMULATED_NAME if emulated else NAME,
        target=EMULATED_TARGET if emulated else TARGET,
        runtime=Runtime.EXTERN_C,
        groups=(_group(emulated),),
        libraries=(EMULATED_LIBRARY if emulated else LIBRARY,),
        requires=None if emulated else _requires,
        doc=("Intel AMX int8 tiles (u8 activations x i8 weights -> i32), a GEMM kernel on packed weights"
             + (", emulated in portable C" if emulated else "")),
        emulates="tdpbusd (Intel AMX-INT8)" if emulated else "",
        channels_last=True,
        fuses_epilogues=True,  # requantized in each 32 x 32 block's write-back, stored as 8 bits
        params={"tile": TILE},
    )


TEMPLATE = make_template()
EMULATED = make_template(emulated=True)
