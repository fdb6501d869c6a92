"""The intrinsic families every template repeats, written once: their signatures and their
TVMScript descriptions, generated from a few numbers.

A template's intrinsic is a signature (operands, axes), a description (what it computes, as a
TIR PrimFunc TVM's tensorize matches) and an implementation (the instruction). The first two
are the same for every dot-product instruction - ``vpdpbusd`` (x86_vnni), ``vpmaddwd``
(x86_avx2), ``vrmpy`` / ``vmpyhv`` (hexagon_hvx) - up to the lane count, the reduction length,
the dtypes and the memory scope; only the implementation differs. So a template declares::

    from tirbyoc.decl.families import dot_product_signature, dot_product_desc

    operands, axes = dot_product_signature(16, 4, "uint8", "int8", "int32")
    desc = dot_product_desc(16, 4, "uint8", "int8", "int32")   # inside Intrinsic's build()

and writes its implementation alone. The same for a vector of zeros (`zero_fill_signature`,
`zero_fill_desc`: the init of an accumulator) and for a tile copy between memory scopes
(`tile_copy_signature`, `tile_copy_desc`: VTA's DMA loads and stores, Hexagon's DMA into VTCM,
the WMMA fragment loads and stores of cuda_mma). Each description is the TVMScript the
templates wrote by hand before, structurally equal (``tests/test_declarations.py``).
"""

from __future__ import annotations

from tirbyoc.decl.intrinsic import Operand
from tirbyoc.decl.layout import Layout
from tirbyoc.errors import IntrinsicError
from tirbyoc.decl.scope import GLOBAL as _GLOBAL_SCOPE

GLOBAL = _GLOBAL_SCOPE.name  # the scopes' own main memory, by name (Operand and TVMScript take the name)


def dot_product_signature(lanes: int, k: int, a: str, b: str, acc: str, scope: str = GLOBAL):
    """(operands, axes) of ``C[lanes] += sum_k acc(A[k]) * acc(B[lanes, k])``: A broadcast to
    every lane, B one row of ``k`` per lane (a weight packed [N / lanes, K / k, lanes, k])."""
    operands = [Operand("A", (k,), a, scope), Operand("B", (lanes, k), b, scope),
                Operand("C", (lanes,), acc, scope)]
    return operands, [("i", lanes, "S"), ("k", k, "R")]


def dot_product_desc(lanes: int, k: int, a: str, b: str, acc: str, scope: str = GLOBAL):
    """The description of `dot_product_signature`'s computation (a TIR PrimFunc)."""
    from tirbyoc._tvm import T  # deferred: TVMScript loads when an intrinsic is first built

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((k,), a, offset_factor=1, scope=scope),
        B: T.Buffer((lanes, k), b, offset_factor=1, scope=scope),
        C: T.Buffer((lanes,), acc, offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
            T.writes(C[0:lanes])
            for i, kk in T.grid(lanes, k):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, kk])
                    C[vi] = C[vi] + T.cast(A[vk], acc) * T.cast(B[vi, vk], acc)

    return desc


def zero_fill_signature(lanes: int, dtype: str, scope: str = GLOBAL):
    """(operands, axes) of ``C[lanes] = 0``."""
    return [Operand("C", (lanes,), dtype, scope)], [("i", lanes, "S")]


def zero_fill_desc(lanes: int, dtype: str, scope: str = GLOBAL, block: str = "init"):
    """The description of `zero_fill_signature`'s computation (a TIR PrimFunc); ``block``
    names its block (VTA's accumulator reset calls it ``reset``)."""
    from tirbyoc._tvm import T  # deferred: TVMScript loads when an intrinsic is first built

    @T.prim_func(s_tir=True)
    def desc(C: T.Buffer((lanes,), dtype, offset_factor=1, scope=scope)) -> None:
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:lanes])
            for i in T.serial(lanes):
                with T.sblock(block):
                    vi = T.axis.remap("S", [i])
                    C[vi] = T.cast(0, dtype)

    return desc


def tile_copy_signature(shape: tuple, dtype: str, src: str, dst: str, *, dst_dtype: str | None = None,
                        names: tuple = ("S", "D"), layout: Layout | None = None, axes: tuple | None = None):
    """(operands, axes) of ``D[shape] = S[shape]`` from scope ``src`` to scope ``dst`` (a 1-D or
    2-D tile; ``dst_dtype``: a narrowing store's). A 2-D tile is read row-strided, a 1-D one
    dense, unless ``layout`` says otherwise; the axes are named i, j (a 1-D tile's j) unless
    ``axes`` names them."""
    if len(shape) not in (1, 2):
        raise IntrinsicError(f"a tile copy is 1-D or 2-D, not {len(shape)}-D ({shape})")
    if layout is None:
        layout = Layout.row_strided() if len(shape) == 2 else Layout()
    operands = [Operand(names[0], tuple(shape), dtype, src, layout),
                Operand(names[1], tuple(shape), dst_dtype or dtype, dst, layout)]
    axes = axes or (("i", "j") if len(shape) == 2 else ("j",))
    return operands, [(name, size, "S") for name, size in zip(axes, shape)]


def tile_copy_desc(shape: tuple, dtype: str, src: str, dst: str, *, dst_dtype: str | None = None,
                   offset_factor: int = 1, block: str = "copy"):
    """The description of `tile_copy_signature`'s copy (a TIR PrimFunc): each element cast to
    ``dst_dtype`` where it narrows; ``block`` names the copy's block."""
    from tirbyoc._tvm import T  # deferred: TVMScript loads when an intrinsic is first built

    out = dst_dtype or dtype
    if len(shape) == 1:
        (n,) = shape

        @T.prim_func(s_tir=True)
        def desc(
            S: T.Buffer((n,), dtype, offset_factor=offset_factor, scope=src),
            D: T.Buffer((n,), out, offset_factor=offset_factor, scope=dst),
        ) -> None:
            with T.sblock("root"):
                T.reads(S[0:n])
                T.writes(D[0:n])
                for j in T.serial(n):
                    with T.sblock(block):
                        vj = T.axis.remap("S", [j])
                        D[vj] = T.cast(S[vj], out)

        return desc
    rows, cols = shape

    @T.prim_func(s_tir=True)
    def desc(
        S: T.Buffer((rows, cols), dtype, offset_factor=offset_factor, scope=src),
        D: T.Buffer((rows, cols), out, offset_factor=offset_factor, scope=dst),
    ) -> None:
        with T.sblock("root"):
            T.reads(S[0:rows, 0:cols])
            T.writes(D[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock(block):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = T.cast(S[vi, vj], out)

    return desc


__all__ = ["dot_product_desc", "dot_product_signature", "tile_copy_desc", "tile_copy_signature", "zero_fill_desc",
           "zero_fill_signature"]
