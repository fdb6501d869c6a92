"""Declare an intrinsic once: its signature, its scalar semantics and its implementation's
kind, and the two TVMScript PrimFuncs TVM's tensorize needs are written from them.

A hand-written intrinsic spells each operand three times (the description's buffers, the
implementation's, the `Operand` list) and each region twice more. Here the `Operand` list is
the one place. `description` writes the description's loops over the axes, its block and its
regions, with the leaf's value from a scalar ``semantics(T, *operands, *axes)``; the
implementation is one of a few kinds, each a small record whose ``build`` writes it:

* `Vector`: the output stored as one vector, ``value(T, *operands)`` (an LLVM intrinsic call,
  TVM's vector arithmetic) or, ``per_lane``, one lane at a time in a vectorized loop
  (portable code LLVM vectorizes);
* `Fill`: a 2-D output filled with one vector, row by row (an accumulator block's init);
* `Call`: one call computes the whole tile, ``call(T, *operands)`` (``T.call_packed`` into a
  runtime, ``T.call_extern`` into a C library); a row-strided operand (`Layout.row_strided`)
  is passed with its row stride.

`declare` puts them together, `vector_intrinsic` for the vector kind::

    DOT = vector_intrinsic("mine.dot", Role.COMPUTE, dot_product_signature(16, 4, "uint8", "int8", "int32"),
                           lambda T, A, B, C, i, k: C[i] + T.cast(A[k], "int32") * T.cast(B[i, k], "int32"),
                           lambda T, A, B, C: T.call_llvm_pure_intrin(...))

``T`` is TVMScript's ``tirx`` module, handed in so that a template imports no TVM; the
operands are the PrimFuncs' buffers (``A[k]`` a load, ``B.vload([0, 0], "int8x64")`` a vector
load). The output is the last operand; it is read too unless ``accumulate=False`` (a fill, a
copy, an elementwise ALU step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tirbyoc.decl.intrinsic import Cost, Intrinsic, Operand, Role
from tirbyoc.errors import IntrinsicError


def _buffer(op: Operand, stored: bool, offset_factor: int) -> str:
    shape = op.stored_shape if stored else op.shape
    return f'{tuple(shape)!r}, "{op.dtype}", offset_factor={offset_factor}, scope="{op.scope}"'


def _strided(op: Operand) -> bool:
    return not op.layout.dense and len(op.shape) > 1


def _header(name: str, operands, stored: bool, offset_factor: int = 1) -> tuple[str, str]:
    """(the ``def`` line, the lines before the root block): buffers as parameters, or - where
    an operand is row-strided in an implementation - handles matched to buffers whose leading
    strides are variables."""
    if not (stored and any(_strided(op) for op in operands)):
        params = ", ".join(f"{op.name}: T.Buffer({_buffer(op, stored, offset_factor)})" for op in operands)
        return f"def {name}({params}) -> None:", ""
    lines = []
    for op in operands:
        strides = ""
        if _strided(op):
            leading = [f"s_{op.name}_{d}" for d in range(len(op.shape) - 1)]
            lines += [f"    {s} = T.int32()" for s in leading]
            strides = f", strides=[{', '.join(leading)}, 1]"
        lines.append(f"    {op.name} = T.match_buffer(h_{op.name}, {_buffer(op, stored, offset_factor)}{strides})")
    params = ", ".join(f"h_{op.name}: T.handle" for op in operands)
    return f"def {name}({params}) -> None:", "\n".join(lines) + "\n"


def _region(op: Operand, stored: bool) -> str:
    shape = op.stored_shape if stored else op.shape
    return f"{op.name}[{', '.join(f'0:{s}' for s in shape)}]"


def _regions(operands, accumulate: bool, stored: bool) -> tuple[str, str]:
    """(the reads, the writes) of the root block: the output first where it is read."""
    *inputs, out = operands
    reads = ([out] if accumulate else []) + list(inputs)
    return ", ".join(_region(op, stored) for op in reads), _region(out, stored)


def _parse(src: str, **extra):
    from tirbyoc._tvm import T, tvm  # deferred: TVMScript loads when an intrinsic is first built

    return tvm.script.from_source(src, extra_vars={"T": T, **extra})


def description(operands, axes, semantics, *, accumulate: bool = True, block: str = "update",
                offset_factor: int = 1):
    """The description PrimFunc: a loop per axis (``(name, extent, "S" | "R")``), one block
    binding them, the output (last operand) at the spatial axes, in order (after zeros for its
    leading unit dimensions no axis walks), set to ``semantics(T, *operands, *axes)``; its
    buffers' ``offset_factor`` as given."""
    operands, axes = list(operands), [tuple(a) for a in axes]
    names = [a[0] for a in axes]
    spatial = [f"v{n}" for n, _, kind in axes if kind == "S"]
    out = operands[-1]
    at = ["0"] * (len(out.shape) - len(spatial)) + spatial
    reads, writes = _regions(operands, accumulate, stored=False)
    loops = (f"for {names[0]} in T.serial({axes[0][1]}):" if len(axes) == 1 else
             f"for {', '.join(names)} in T.grid({', '.join(str(a[1]) for a in axes)}):")
    args = ", ".join([op.name for op in operands] + [f"v{n}" for n in names])
    head, _ = _header("desc", operands, False, offset_factor)
    src = f'''
@T.prim_func(s_tir=True)
{head}
    with T.sblock("root"):
        T.reads({reads})
        T.writes({writes})
        {loops}
            with T.sblock("{block}"):
                {", ".join(f"v{n}" for n in names)} = T.axis.remap("{"".join(a[2] for a in axes)}", [{", ".join(names)}])
                {out.name}[{", ".join(at)}] = semantics(T, {args})
'''
    return _parse(src, semantics=semantics)


def _impl(operands, accumulate: bool, body: str, offset_factor: int = 1, **extra):
    """An implementation PrimFunc: the signature's buffers (row-strided ones matched with their
    strides), the root block's regions, then ``body``."""
    head, pre = _header("impl", operands, True, offset_factor)
    reads, writes = _regions(operands, accumulate, stored=True)
    src = f'''
@T.prim_func(s_tir=True)
{head}
{pre}    with T.sblock("root"):
        T.reads({reads})
        T.writes({writes})
        {body}
'''
    return _parse(src, **extra)


def vector_impl(operands, value, *, accumulate: bool = True, per_lane: bool = False):
    """The implementation PrimFunc of `Vector`: the output (last operand, one dimension)
    stored as one vector, ``value(T, *operands)``; with ``per_lane``, lane ``i`` of a
    vectorized loop stored as ``value(T, *operands, i)``."""
    operands = list(operands)
    out = operands[-1]
    if len(out.stored_shape) != 1:
        raise IntrinsicError(f"vector_impl stores one vector; output {out.name} is {out.stored_shape}")
    lanes, names = out.stored_shape[0], ", ".join(op.name for op in operands)
    body = (f"for i in T.vectorized({lanes}):\n            {out.name}[i] = value(T, {names}, i)" if per_lane else
            f"{out.name}[T.ramp(T.int32(0), 1, {lanes})] = value(T, {names})")
    return _impl(operands, accumulate, body, value=value)


def call_impl(operands, call, *, accumulate: bool = True, offset_factor: int = 1):
    """The implementation PrimFunc of `Call`: ``T.evaluate(call(T, *operands))`` (a row-strided
    operand's stride is ``X.strides[0]``)."""
    operands = list(operands)
    return _impl(operands, accumulate, f"T.evaluate(call(T, {', '.join(op.name for op in operands)}))",
                 offset_factor, call=call)


@dataclass(frozen=True)
class Vector:
    """An implementation that stores the output as one vector (see `vector_impl`)."""

    value: Callable
    per_lane: bool = False
    offset_factor: int = 1  # the buffers' (both PrimFuncs')

    def build(self, operands, accumulate: bool):
        return vector_impl(operands, self.value, accumulate=accumulate, per_lane=self.per_lane)


@dataclass(frozen=True)
class Fill:
    """An implementation that fills a (row-strided) 2-D output with one vector ``value(T)`` of
    ``lanes``, row by row: an accumulator block's init."""

    value: Callable
    lanes: int
    offset_factor: int = 1

    def build(self, operands, accumulate: bool):
        out = list(operands)[-1]
        rows, cols = out.stored_shape
        if cols % self.lanes:
            raise IntrinsicError(f"Fill: {cols} columns of {out.name} are no whole vectors of {self.lanes}")
        body = (f"for i in T.serial({rows}):\n            for h in T.serial({cols // self.lanes}):\n"
                f"                {out.name}[i, T.ramp(h * {self.lanes}, 1, {self.lanes})] = value(T)")
        return _impl(list(operands), accumulate, body, self.offset_factor, value=self.value)


@dataclass(frozen=True)
class Call:
    """An implementation that is one call computing the whole tile (see `call_impl`)."""

    call: Callable
    offset_factor: int = 1  # the buffers' (both PrimFuncs'): 16 for a WMMA fragment

    def build(self, operands, accumulate: bool):
        return call_impl(operands, self.call, accumulate=accumulate, offset_factor=self.offset_factor)


def declare(name: str, role: Role | str, signature: tuple, semantics, impl, *, accumulate: bool = True,
            block: str | None = None, **declared) -> Intrinsic:
    """An `Intrinsic` declared once from its ``signature`` (operands, axes - what the signature
    families return): its description written from ``semantics`` (`description`; its block
    named ``block``, default "update", or "init" for a fill), its implementation by ``impl``
    (`Vector`, `Call`); ``declared``: `Intrinsic`'s cost and doc."""
    operands, axes = list(signature[0]), list(signature[1])
    block = block or ("update" if accumulate else "init")

    def build():
        return (description(operands, axes, semantics, accumulate=accumulate, block=block,
                            offset_factor=impl.offset_factor),
                impl.build(operands, accumulate))

    return Intrinsic(name, role, operands, axes, build, **{"cost": Cost(cycles=1), **declared})


def vector_intrinsic(name: str, role: Role | str, signature: tuple, semantics, value, *, accumulate: bool = True,
                     per_lane: bool = False, **declared) -> Intrinsic:
    """`declare` with a `Vector` implementation of ``value``."""
    return declare(name, role, signature, semantics, Vector(value, per_lane), accumulate=accumulate, **declared)


__all__ = ["Call", "Fill", "Vector", "call_impl", "declare", "description", "vector_impl", "vector_intrinsic"]
