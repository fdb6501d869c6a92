"""blas: fp32 GEMM and batched GEMM offloaded to OpenBLAS through a small C shim.

The implementations are destination-passing extern calls: pointers to the operand windows
(offset by TVM's ``access_ptr``), their leading strides, and the preallocated output, which
is accumulated into. Windows of larger buffers are therefore read in place, rows apart.
The shim (``csrc/blas_shim.c``) is compiled against ``scipy_openblas32`` on first use.

A PrimFunc that is nothing but one matmul (what ``LegalizeOps`` makes of ``R.matmul``) is
instead called whole from Relax: ``csrc/blas_packed.c`` exports the TVM packed functions
``tirbyoc_blas_matmul_nn`` / ``_nt``, and the Relax bridge emits ``R.call_dps_packed``.
"""

from functools import cache
from pathlib import Path

from tirbyoc import (Call, Cost, ExternLibrary, Intrinsic, IntrinsicGroup, Layout, Operand, PackedFunction, Role, Runtime,
                     Template, declare)

NAME = "blas"
TARGET = {"kind": "llvm", "num-cores": 2}
STRIDED = Layout.row_strided()


def _openblas(attr: str):
    def get():
        import scipy_openblas32 as ob

        return {"inc": [ob.get_include_dir()], "lib": [ob.get_lib_dir()], "link": [ob.get_library()]}[attr]

    return get


LIBRARY = ExternLibrary(
    name="tirbyoc_blas_shim",
    sources=[Path(__file__).parent / "csrc" / "blas_shim.c"],
    symbols=["tirbyoc_blas_sgemm", "tirbyoc_blas_sgemm_batched", "tirbyoc_blas_sgemv"],
    include_dirs=_openblas("inc"),
    library_dirs=_openblas("lib"),
    libraries=_openblas("link"),
)

PACKED_LIBRARY = ExternLibrary(
    name="tirbyoc_blas_packed",
    sources=[Path(__file__).parent / "csrc" / "blas_packed.c", Path(__file__).parent / "csrc" / "blas_shim.c"],
    symbols=["tirbyoc_blas_matmul_nn", "tirbyoc_blas_matmul_nt"],
    include_dirs=_openblas("inc"),
    library_dirs=_openblas("lib"),
    libraries=_openblas("link"),
    ffi=True,
)
MATMUL = {
    trans_b: PackedFunction(f"tirbyoc_blas_matmul_{'nt' if trans_b else 'nn'}", PACKED_LIBRARY,
                            doc="C = A @ B" + ("^T" if trans_b else "") + ", rank 2 or batched")
    for trans_b in (False, True)
}


def _sgemm(T, name: str, *args):
    return T.call_extern("int32", f"tirbyoc_blas_{name}", *args)


@cache
def gemm(m: int, n: int, k: int, trans_b: bool = False) -> Intrinsic:
    """C[m, n] += A[m, k] @ B[k, n] (``trans_b``: B is [n, k]) in fp32 via cblas_sgemm."""
    bshape, tb = ((n, k) if trans_b else (k, n)), int(trans_b)
    return declare(
        f"{NAME}.sgemm_{m}x{n}x{k}_{'nt' if trans_b else 'nn'}", Role.COMPUTE,
        ([Operand("A", (m, k), "float32", layout=STRIDED), Operand("B", bshape, "float32", layout=STRIDED),
          Operand("C", (m, n), "float32", layout=STRIDED)], [("i", m, "S"), ("j", n, "S"), ("k", k, "R")]),
        lambda T, A, B, C, i, j, kk: C[i, j] + A[i, kk] * (B[j, kk] if trans_b else B[kk, j]),
        Call(lambda T, A, B, C: _sgemm(T, "sgemm", tb, m, n, k, A.access_ptr("r"), A.strides[0], B.access_ptr("r"),
                                       B.strides[0], T.float32(1), C.access_ptr("rw"), C.strides[0])),
        cost=Cost(cycles=max(1.0, m * n * k / 32.0)),
        doc=f"cblas_sgemm: C[{m},{n}] += A[{m},{k}] @ B{'^T' if trans_b else ''}")


@cache
def batched_gemm(batch: int, m: int, n: int, k: int, trans_b: bool = False) -> Intrinsic:
    """C[b, m, n] += A[b, m, k] @ B[b, k, n] (``trans_b``: B is [b, n, k]), one sgemm a batch."""
    bshape, tb = ((batch, n, k) if trans_b else (batch, k, n)), int(trans_b)

    def call(T, A, B, C):  # each operand's row stride, then its batch stride as int64
        return _sgemm(T, "sgemm_batched", tb, batch, m, n, k,
                      *[arg for X, mode in ((A, "r"), (B, "r")) for arg in
                        (X.access_ptr(mode), X.strides[1], T.Cast("int64", X.strides[0]))],
                      T.float32(1), C.access_ptr("rw"), C.strides[1], T.Cast("int64", C.strides[0]))

    return declare(
        f"{NAME}.sgemm_batched_{batch}x{m}x{n}x{k}_{'nt' if trans_b else 'nn'}", Role.COMPUTE,
        ([Operand("A", (batch, m, k), "float32", layout=STRIDED), Operand("B", bshape, "float32", layout=STRIDED),
          Operand("C", (batch, m, n), "float32", layout=STRIDED)],
         [("b", batch, "S"), ("i", m, "S"), ("j", n, "S"), ("k", k, "R")]),
        lambda T, A, B, C, b, i, j, kk: C[b, i, j] + A[b, i, kk] * (B[b, j, kk] if trans_b else B[b, kk, j]),
        Call(call), cost=Cost(cycles=max(1.0, batch * m * n * k / 32.0)),
        doc=f"{batch} x cblas_sgemm: C[b,{m},{n}] += A[b,{m},{k}] @ B[b]{'^T' if trans_b else ''}")


@cache
def gemv(n: int, k: int, trans_b: bool = False) -> Intrinsic:
    """C[n] += A[k] @ B[k, n] (``trans_b``: B is [n, k]) in fp32 via cblas_sgemv: a matrix-vector
    product (a batch-1 dense layer), which has no GEMM row axis."""
    bshape, tb = ((n, k) if trans_b else (k, n)), int(trans_b)
    return declare(
        f"{NAME}.sgemv_{n}x{k}_{'nt' if trans_b else 'nn'}", Role.COMPUTE,
        ([Operand("A", (k,), "float32"), Operand("B", bshape, "float32", layout=STRIDED), Operand("C", (n,), "float32")],
         [("j", n, "S"), ("k", k, "R")]),
        lambda T, A, B, C, j, kk: C[j] + A[kk] * (B[j, kk] if trans_b else B[kk, j]),
        Call(lambda T, A, B, C: _sgemm(T, "sgemv", tb, n, k, A.access_ptr("r"), B.access_ptr("r"), B.strides[0],
                                       T.float32(1), C.access_ptr("rw"))),
        cost=Cost(cycles=max(1.0, n * k / 8.0)), doc=f"cblas_sgemv: C[{n}] += A[{k}] @ B{'^T' if trans_b else ''}")


TILE = 64


def _gemm_group(trans_b: bool, m: int = TILE, n: int = TILE, k: int = TILE) -> IntrinsicGroup:
    """A GEMM group; ``resize`` re-declares it for a block's exact extents (one call, no
    padding: OpenBLAS takes any size)."""
    kind = "nt" if trans_b else "nn"
    exact = (m, n, k) != (TILE, TILE, TILE)
    return IntrinsicGroup(
        f"sgemm_{kind}" + (f"_{m}x{n}x{k}" if exact else ""),
        compute=gemm(m, n, k, trans_b),
        packed=MATMUL[trans_b],
        resize=lambda ext: _gemm_group(trans_b, ext["vi"], ext["vj"], ext["vk"]),
    )


def _gemv_group(trans_b: bool, n: int = TILE, k: int = TILE) -> IntrinsicGroup:
    kind = "nt" if trans_b else "nn"
    exact = (n, k) != (TILE, TILE)
    return IntrinsicGroup(
        f"sgemv_{kind}" + (f"_{n}x{k}" if exact else ""),
        compute=gemv(n, k, trans_b),
        resize=lambda ext: _gemv_group(trans_b, ext["vj"], ext["vk"]),
    )


def _batched_group(trans_b: bool, b: int = 4, m: int = TILE, n: int = TILE,
                   k: int = TILE) -> IntrinsicGroup:
    kind = "nt" if trans_b else "nn"
    exact = (b, m, n, k) != (4, TILE, TILE, TILE)
    return IntrinsicGroup(
        f"sgemm_batched_{kind}" + (f"_{b}x{m}x{n}x{k}" if exact else ""),
        compute=batched_gemm(b, m, n, k, trans_b),
        packed=MATMUL[trans_b],
        resize=lambda ext: _batched_group(trans_b, ext["vb"], ext["vi"], ext["vj"], ext["vk"]),
    )


TEMPLATE = Template(
    name=NAME,
    target=TARGET,
    runtime=Runtime.EXTERN_C,
    groups=(_gemm_group(False), _gemm_group(True), _batched_group(False), _batched_group(True),
            _gemv_group(False), _gemv_group(True)),
    libraries=(LIBRARY,),
    doc="fp32 GEMM / batched GEMM / GEMV through OpenBLAS (scipy-openblas32), destination-passing",
    params={"tile": TILE},
)
