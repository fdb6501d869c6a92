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

from tirbyoc.decl.declare import description, vector_intrinsic
from tirbyoc.decl.intrinsic import Intrinsic, Operand, Role
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
    return description(*dot_product_signature(lanes, k, a, b, acc, scope), dot_product_semantics(acc))


def dot_product_semantics(acc: str):
    """``C[i] + acc(A[k]) * acc(B[i, k])``, the scalar semantics of every dot product."""
    return lambda T, A, B, C, i, kk: C[i] + T.cast(A[kk], acc) * T.cast(B[i, kk], acc)


def dot_product(name: str, lanes: int, k: int, dtypes: tuple, value, *, scope: str = GLOBAL, per_lane: bool = False,
                **declared) -> Intrinsic:
    """A dot-product instruction declared in one call: ``dtypes`` (A, B, accumulator), its
    vector ``value(T, A, B, C)`` (the instruction; `tirbyoc.decl.declare.vector_impl`);
    ``declared``: `Intrinsic`'s cost and doc."""
    a, b, acc = dtypes
    return vector_intrinsic(name, Role.COMPUTE, dot_product_signature(lanes, k, a, b, acc, scope),
                            dot_product_semantics(acc), value, per_lane=per_lane, **declared)


def zero_fill_signature(lanes: int, dtype: str, scope: str = GLOBAL):
    """(operands, axes) of ``C[lanes] = 0``."""
    return [Operand("C", (lanes,), dtype, scope)], [("i", lanes, "S")]


def zero_fill_desc(lanes: int, dtype: str, scope: str = GLOBAL, block: str = "init"):
    """The description of `zero_fill_signature`'s computation (a TIR PrimFunc); ``block``
    names its block (VTA's accumulator reset calls it ``reset``)."""
    return description(*zero_fill_signature(lanes, dtype, scope), lambda T, C, i: T.cast(0, dtype),
                       accumulate=False, block=block)


def zero_fill(name: str, lanes: int, dtype: str, scope: str = GLOBAL) -> Intrinsic:
    """``C[lanes] = 0`` as one vector store: the init of a vector accumulator."""
    return vector_intrinsic(f"{name}.zero_{lanes}_{dtype}", Role.INIT, zero_fill_signature(lanes, dtype, scope),
                            lambda T, C, i: T.cast(0, dtype), lambda T, C: T.broadcast(T.cast(0, dtype), lanes),
                            accumulate=False, doc=f"zero {lanes} x {dtype} accumulator lanes")


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
    out = dst_dtype or dtype
    operands, axes = tile_copy_signature(shape, dtype, src, dst, dst_dtype=dst_dtype)
    return description(operands, axes, lambda T, S, D, *at: T.cast(S[at], out), accumulate=False, block=block,
                       offset_factor=offset_factor)


__all__ = ["dot_product", "dot_product_desc", "dot_product_semantics", "dot_product_signature", "tile_copy_desc",
           "tile_copy_signature", "zero_fill", "zero_fill_desc", "zero_fill_signature"]
