"""x86_amx: Intel AMX tiles as destination-passing GEMM kernels: int8 (``tdpbusd``) and bf16 (``tdpbf16ps``).

AMX is a matrix engine inside the CPU (Intel Xeon since Sapphire Rapids): eight tile registers
of 16 rows x 64 bytes, loaded and stored row-strided (``tileloadd`` / ``tilestored``), and one
product instruction per element type: ``tdpbusd`` adds A[16 x 64 u8] . B[16 x 64 i8 in 4-byte
groups] to a 16 x 16 int32 tile - 16,384 multiply-adds, about 6x what AVX-512 VNNI's
``vpdpbusd`` does in the same time on the same core (`bench/gemm.py --amx-peak`);
``tdpbf16ps`` adds A[16 x 32 bf16] . B[16 x 32 bf16 in pairs] to a 16 x 16 float32 tile.

* ``x86_amx``: u8 activations x i8 weights -> int32 (quantized models).
* ``x86_amx_bf16``: bf16 x bf16 -> float32 (a float model run with ``--precision bf16``;
  every product is exact in float32, the sums round in float32 as TVM's build does, in
  another order: outputs agree to float32 rounding).

The kernel (``csrc/amx_shim.c``, one code path for both: lengths counted in bytes) keeps 2 x 2
accumulator tiles in the tile registers over the whole reduction, so the template declares it
as a library call that takes a block's exact M, N and K (``resize``): activations are read in
place, row-strided; the weight is packed into the [N/16, K/g, 16, g] layout (g = 4 int8 or 2
bf16: 4 bytes) both AVX-512 and AMX read (``Layout.packed``), once, at compile time where it
is a constant. N must be a multiple of 16 and K of g; rows and reductions of any other length
run in the kernel (remainders through a zero-padded block, the last bytes of K under 64 with
``vpdpbusd`` / ``vdpbf16ps``). A reduction under 128 bytes (a 1x1 convolution of 64 int8
channels, MobileNetV2's narrow ones) is refused for the vector template the default list puts
after it (`tirbyoc.app.running.run.FALLBACKS`): one or two tile products a call leave the block's
zeroing and write-back the whole cost (ResNet-50's res2 1x1 expansion: 404 GOPS on AMX, 605
on VNNI, one thread).

Linux gives a process the tile registers only when asked (``arch_prctl``): the library asks
when it is loaded, in whatever process loads it. ``x86_amx_emulated`` and
``x86_amx_bf16_emulated`` are the same templates with the kernel built as portable C (int8:
the same 32-bit sums, bit for bit; bf16: float32 sums of the same exact products): they verify
every AMX rewrite on a CPU without AMX; their times are not AMX's, and `tirbyoc run` reports
none.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Optional

from tirbyoc import (Call, Cost, ExternLibrary, Fill, Intrinsic, IntrinsicGroup, Layout, Operand, Role, Runtime, Template,
                     TirbyocError, declare, requires_cpu)

TARGET = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
EMULATED_TARGET = {"kind": "llvm", "num-cores": 2}
PANEL, GROUP_BYTES = 16, 4  # B's packing: 16 output channels x 4 reduction bytes per 64-byte row
# The matcher's first tile; `resize` re-declares the kernel for a block's exact extents. A
# reduction tile wider than a convolution's channels makes the matcher fuse (kh, kw, c) into
# one reduction of 9 x c, so that the accumulators stay in tiles over all of it.
TILE, TILE_K = 32, 1024
MAX_COLS = 512  # output channels a call covers at most (its int32 block: 32 x 512 x 4 = 64 KB)
NARROW_COLS, NARROW_MIN_K_BYTES = 64, 256  # rows read in place: an 8 KB int32 block a call (`call_columns`)
L1_BYTES = 48 * 1024  # the A rows a call reuses across its columns stay in L1 up to this (Golden Cove: 48 KB)
B_PANEL_BYTES = 32 * 1024  # a call's panel of B reused from L1 up to this (two thirds of it: A's tiles and C's share it)
MIN_K_BYTES = 128  # shorter reductions are refused: the vector template next in the list is faster there
MIN_PIXEL_BYTES = 16  # a window with fewer channel bytes a pixel is refused (x86_vnni reads it in place faster)
STRIDED = Layout.row_strided()
SOURCE = Path(__file__).parent / "csrc" / "amx_shim.c"
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
SHORT_TYPES = {"uint8": "u8", "int8": "i8", "bfloat16": "bf16", "int32": "i32", "float32": "f32"}


@dataclass(frozen=True)
class Kernel:
    """One GEMM kernel of the C shims as a template declares it: its template name, C entry
    point, element types (A, B, accumulator C), the instruction it runs and the CPU features it
    needs (LLVM's names, as `requires_cpu` reads them). The packed weight's group is 4 bytes of B, so
    ``group`` = 4 int8 or 2 bf16; ``min_k`` the shortest reduction it takes (elements)."""

    name: str
    symbol: str
    a: str
    b: str
    c: str
    instruction: str
    flags: tuple
    min_k: int = 0
    pads_k: bool = False  # a reduction not a multiple of ``group`` is padded (else refused: a
    # template after it in the list takes it unpadded, as x86_vnni does AMX-INT8's)
    shorter: str = ""  # the vector template that takes reductions under ``min_k`` faster
    min_pixel_bytes: int = 0  # a convolution window with fewer channel bytes a pixel is refused
    # for ``shorter`` (int8: `MIN_PIXEL_BYTES`; bf16's stem runs 3x slower on AVX512_BF16)
    any_rows: bool = False  # its register blocks take rows 8 at a time with no tile: a call's
    # rows are chosen to divide the block's (`call_rows`) instead of padding them to `TILE`

    @property
    def group(self) -> int:
        return GROUP_BYTES // (2 if self.b == "bfloat16" else 1)  # int8 or bfloat16

    @property
    def weight(self) -> Layout:
        return Layout.packed((PANEL, self.group))

    @property
    def types(self) -> str:
        """``u8i8i32``, ``bf16bf16f32``: the element types in the intrinsics' names."""
        return "".join(SHORT_TYPES[t] for t in (self.a, self.b, self.c))


INT8 = Kernel("x86_amx", "tirbyoc_amx_gemm_u8s8", "uint8", "int8", "int32", "tdpbusd",
              ("amx-tile", "amx-int8", "avx512vnni"), MIN_K_BYTES,
              shorter="AVX-512 VNNI (x86_vnni)", min_pixel_bytes=MIN_PIXEL_BYTES)
BF16 = Kernel("x86_amx_bf16", "tirbyoc_amx_gemm_bf16", "bfloat16", "bfloat16", "float32", "tdpbf16ps",
              ("amx-tile", "amx-bf16", "avx512bf16"), MIN_K_BYTES // 2, pads_k=True,
              shorter="AVX512_BF16 (x86_avx512_bf16)")
INT8_EMULATED = replace(INT8, name="x86_amx_emulated", symbol="tirbyoc_amx_emulated_gemm_u8s8", flags=())
BF16_EMULATED = replace(BF16, name="x86_amx_bf16_emulated", symbol="tirbyoc_amx_emulated_gemm_bf16", flags=())

LIBRARY = ExternLibrary(name="tirbyoc_amx_shim", sources=[SOURCE],
                        symbols=[INT8.symbol, BF16.symbol, "tirbyoc_amx_granted"])
EMULATED_LIBRARY = ExternLibrary(name="tirbyoc_amx_shim_emulated", sources=[SOURCE],
                                 symbols=[INT8_EMULATED.symbol, BF16_EMULATED.symbol, "tirbyoc_amx_emulated_granted"],
                                 defines=["TIRBYOC_AMX_EMULATED"])


@cache
def gemm(m: int, n: int, k: int, kernel: Kernel = INT8) -> Intrinsic:
    """C[m, n] += A[m, k] . B[n, k] in ``kernel``'s types (B packed [n/16, k/g, 16, g])."""
    g = kernel.group
    return declare(
        f"{kernel.name}.gemm_{m}x{n}x{k}_{kernel.types}", Role.COMPUTE,
        ([Operand("A", (m, k), kernel.a, layout=STRIDED), Operand("B", (n, k), kernel.b, layout=kernel.weight),
          Operand("C", (m, n), kernel.c, layout=STRIDED)], [("i", m, "S"), ("j", n, "S"), ("k", k, "R")]),
        lambda T, A, B, C, i, j, kk: C[i, j] + T.cast(A[i, kk], kernel.c) * T.cast(B[j, kk], kernel.c),
        Call(lambda T, A, B, C: T.call_extern("int32", kernel.symbol, m, n, k, A.access_ptr("r"), A.strides[0],
                                              B.access_ptr("r"), C.access_ptr("rw"), C.strides[0])),
        cost=Cost(cycles=max(1.0, m * n * k * (GROUP_BYTES // g) / 1024.0)),
        doc=(f"{kernel.instruction}" + (" emulated" if not kernel.flags else "")
             + f": C[{m},{n}] {kernel.c} += A[{m},{k}] . B in {kernel.a} (B packed [N/16, K/{g}, 16, {g}])"))


@cache
def zero_block(kernel: Kernel = INT8, cols: int = TILE, rows: int = TILE) -> Intrinsic:
    """C[rows, cols] = 0 in 16-lane vector stores, row by row (a row-strided block): the
    register block's init, which TVM's scalar loop made as slow as the AMX call itself."""
    dtype = kernel.c
    return declare(f"{kernel.name}.zero_{rows}x{cols}_{dtype}", Role.INIT,
                   ([Operand("C", (rows, cols), dtype, layout=STRIDED)], [("i", rows, "S"), ("j", cols, "S")]),
                   lambda T, C, i, j: T.cast(0, dtype), Fill(lambda T: T.broadcast(T.cast(0, dtype), 16), 16),
                   accumulate=False, cost=Cost(cycles=rows * cols / 16),
                   doc=f"zero a {rows}x{cols} {dtype} accumulator block in 16-lane stores")


ROW_BLOCK = 8  # the rows of an AVX-512 kernel's register block (`Kernel.any_rows`)
MIN_CALL_ROWS, MAX_CALL_ROWS = 16, 64


def call_rows(m: int) -> int:
    """The rows one call of an `Kernel.any_rows` kernel covers for a block of ``m`` rows: `TILE`
    where it divides ``m``; else the divisor of ``m`` from `MIN_CALL_ROWS` to `MAX_CALL_ROWS`
    nearest to `TILE`, whole register blocks of `ROW_BLOCK` rows first; else ``m`` itself up to
    `MAX_CALL_ROWS`; else `TILE`, the block padded to it. ResNet's 14 x 14 and 7 x 7 layers,
    padded to 32-row calls, computed 224 rows for 196 and 64 for 49: the AVX512_BF16 kernel
    alone on ResNet-50's res4 3x3 (196 x 256 x 2304), AMD Zen 4, one thread, 1.13 ms in 32-row
    calls, 1.00 in 28-row ones; res5 3x3 (49 x 512 x 4608) 1.29 -> 1.03 in one 49-row call."""
    if m % TILE == 0:
        return TILE
    divisors = [d for d in range(MIN_CALL_ROWS, MAX_CALL_ROWS + 1) if m % d == 0]
    if divisors:
        return min(divisors, key=lambda d: (d % ROW_BLOCK != 0, abs(d - TILE)))
    return m if m <= MAX_CALL_ROWS else TILE


def call_columns(n: int, k_bytes: int, rows_staged: bool = True, rows: int = TILE) -> int:
    """The output channels one call covers (a multiple of 16 dividing ``n`` padded to the packed
    weight's 16, up to `MAX_COLS`). Three regimes, by the reduction's bytes K:

    - the call's panel of B (K x cols bytes) fits in `B_PANEL_BYTES` at 64 columns or more:
      the widest such panel, which the call's 32-row blocks reuse from L1 (K = 512: 64);
    - else, where a call's 32 rows of A fit in L1 (32 x K bytes up to `L1_BYTES`): all of the
      layer's columns, A read from L1 for every 32 of them (K = 1024: 512 columns);
    - a deeper reduction streams both from L2 anyway: 32 x 32 calls, as fast or faster there
      (ResNet-50's res4 / res5 convolutions).

    Measured on an Emerald Rapids Xeon at one thread, three rounds in turns, GOPS by columns
    per call: GEMM 512^3 2656 / 2768 / 2063 / 2084 / 1926 at 32 / 64 / 128 / 256 / 512 (the
    panel of 64 columns is 32 KB, of 128 is 64 KB); GEMM 1024^3 1933 / 2183 / 2197 / 2357 /
    2510.

    Where the rows are read in place (``rows_staged`` False: a 1x1 convolution, a GEMM) and K is
    at least `NARROW_MIN_K_BYTES`, at most `NARROW_COLS` columns: right after each call the
    write-back passes its 32 x cols int32 block and its output rows through L1, which evicts the
    panel of B the next call needs unless the block is small (8 KB at 64). Measured with each
    layer's write-back, int8 ResNet-50 on that Xeon, one thread, each function alone, both
    builds in turns in one process (`bench/results/amx_call_columns_writeback.json`): res4's
    1x1 reductions (K = 1024, 256 -> 64 columns) 9-12% faster, its expansions (K = 256, 128 ->
    64) 4-7%, res3's projection 12%, res5's first reduction 8%; at K = 128 (res3's expansions)
    as often slower as faster, and a convolution whose rows are staged (an im2col block per
    call's rows) 2-4% slower: there the widths above stay.

    A call of other than 32 ``rows`` (`call_rows`) keeps its accumulator block within the 32 x
    `MAX_COLS` one and its rows of A in L1 alike."""
    n16 = -(-n // PANEL) * PANEL
    cap = NARROW_COLS if not rows_staged and k_bytes >= NARROW_MIN_K_BYTES else MAX_COLS
    cap = min(cap, max(PANEL, TILE * MAX_COLS // rows))
    widths = [c for c in range(PANEL, min(cap, n16) + 1, PANEL) if n16 % c == 0]
    in_l1 = [c for c in widths if c * k_bytes <= B_PANEL_BYTES]
    if in_l1 and in_l1[-1] >= 2 * TILE:
        return in_l1[-1]
    if rows * k_bytes > L1_BYTES:
        return min(TILE, n16)
    return widths[-1]


def kernel_group(kernel: Kernel, k: int = TILE_K, cols: int = TILE, rows: int = TILE) -> IntrinsicGroup:
    """The GEMM group: 32 rows x ``cols`` output channels a call over the whole reduction (the
    kernel keeps 2 x 2 accumulator tiles over all of K for each 32 x 32 of them, the 32 rows of
    A in L1 across the columns); the CPU schedule keeps a call's outputs as one register
    block, zeroed and written back once with its epilogue fused. ``resize`` re-declares it for
    a block's exact K (a multiple of the packed weight's group) and its output channels
    (`call_columns`), and the block is padded to 32 rows. One call per 32 x 32 block (the
    first form) spent as long zeroing, loading and storing its accumulators as computing:
    32 x N calls run GEMM 1024^3 1.4-1.5x faster, ResNet-50's res2 / res3 3x3 convolutions
    1.1x; deeper reductions keep 32 x 32 calls (`call_columns`). A kernel that takes any rows
    (`Kernel.any_rows`) is re-declared for rows dividing the block's too (`call_rows`)."""

    def resize(ext: dict) -> IntrinsicGroup:
        depth = ext["vk"]
        if depth % kernel.group and kernel.pads_k:
            depth += kernel.group - depth % kernel.group  # zeros in both operands' padding add nothing
        elif depth % kernel.group:
            raise TirbyocError(f"the {kernel.instruction} kernel reads weights packed in groups of "
                               f"{kernel.group}: K = {depth} must be a multiple of {kernel.group}")
        if depth < kernel.min_k:
            raise TirbyocError(f"a reduction of {depth} (under {kernel.min_k}) is one or two {kernel.instruction} "
                               f"a call beside the 32 x 32 block's zeroing and write-back; {kernel.shorter} "
                               "takes it faster")
        window = ext.fused.get("vk", ())
        pixel = (window[-1] or 0) * (GROUP_BYTES // kernel.group) if len(window) > 1 else None
        if pixel is not None and pixel < kernel.min_pixel_bytes:
            raise TirbyocError(f"a window of {pixel} bytes per pixel ({'x'.join(map(str, window))}): the copy into "
                               f"{kernel.instruction}'s rows gathers {pixel}-byte pieces; {kernel.shorter} reads the "
                               "pixels in place faster (the ResNet stem: 2.1-2.4x)")
        # the narrower calls of in-place rows were measured with int8's write-back only: bf16 keeps
        # the widths its own measurements chose
        staged = pixel is not None or kernel.b != "int8"
        rows = call_rows(ext["vi"]) if kernel.any_rows else TILE
        cols = call_columns(ext["vj"], depth * (GROUP_BYTES // kernel.group), rows_staged=staged, rows=rows)
        return kernel_group(kernel, depth, cols, rows)

    suffix = (f"_k{k}" if k != TILE_K else "") + (f"_n{cols}" if cols != TILE else "") \
        + (f"_m{rows}" if rows != TILE else "")
    return IntrinsicGroup(f"gemm_{kernel.types}" + suffix,
                          compute=gemm(rows, cols, k, kernel), init=zero_block(kernel, cols, rows), resize=resize,
                          resize_pads=True)


def _syscall_grants_amx() -> bool:
    """Whether Linux grants this process the AMX tile state (what the library asks for)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def native_requires(kernel: Kernel, twin: Kernel, tile_state: bool = False):
    """The ``requires`` of a native kernel: this CPU's features (and, ``tile_state``, Linux's
    grant of AMX's tile state), with the emulated ``twin`` named as the way to run the same
    rewrite without them."""
    return requires_cpu(*kernel.flags, instruction=kernel.instruction,
                        also=partial(_tile_state_refused, twin) if tile_state else None,
                        instead=f"-t {twin.name} runs the same rewrite with the kernel in portable C "
                                "(its values; not its times)")


def _tile_state_refused(emulated: Kernel) -> Optional[str]:
    if _syscall_grants_amx():
        return None
    return ("Linux refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); "
            f"-t {emulated.name} runs the same rewrite without it")


def make_template(emulated: bool = False, bf16: bool = False) -> Template:
    """The AMX template: int8 (``x86_amx``) or, ``bf16``, ``x86_amx_bf16``; ``emulated``: the
    kernel as portable C (``x86_amx_emulated``, ``x86_amx_bf16_emulated``)."""
    native, twin = (BF16, BF16_EMULATED) if bf16 else (INT8, INT8_EMULATED)
    kernel = twin if emulated else native
    what = ("Intel AMX bf16 tiles (bf16 x bf16 -> float32, --precision bf16)" if bf16 else
            "Intel AMX int8 tiles (u8 activations x i8 weights -> i32)")
    return kernel_template(kernel, EMULATED_TARGET if emulated else TARGET, EMULATED_LIBRARY if emulated else LIBRARY,
                           None if emulated else native_requires(native, twin, tile_state=True),
                           what + ", a GEMM kernel on packed weights" + (", emulated in portable C" if emulated else ""),
                           emulates=f"{native.instruction} (Intel AMX-{'BF16' if bf16 else 'INT8'})" if emulated else "")


def kernel_template(kernel: Kernel, target: dict, library: ExternLibrary, requires, doc: str,
                    emulates: str = "") -> Template:
    """A template whose one group is ``kernel``'s call (`kernel_group`) from ``library``: NHWC
    convolutions, each 32-row block's write-back fused after the call (requantized to 8 bits,
    ReLU, the residual add, or bias / ReLU / the next layer's bf16 cast). AMX's kernels, and
    the AVX512_BF16 and AVX2 ones declared on them."""
    return Template(
        name=kernel.name,
        target=target,
        runtime=Runtime.EXTERN_C,
        groups=(kernel_group(kernel),),
        libraries=(library,),
        requires=requires,
        doc=doc,
        emulates=emulates,
        channels_last=True,
        fuses_epilogues=True,
        params={"tile": TILE},
    )


TEMPLATE = make_template()
EMULATED = make_template(emulated=True)
BF16_TEMPLATE = make_template(bf16=True)
BF16_EMULATED_TEMPLATE = make_template(emulated=True, bf16=True)
