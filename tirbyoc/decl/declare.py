"""Declare an intrinsic once: its signature, its scalar semantics and its instruction, and the
two TVMScript PrimFuncs TVM's tensorize needs are written from them.

A hand-written intrinsic spells each operand three times (the description's buffers, the
implementation's, the `Operand` list) and each region twice more. Here the `Operand` list is
the one place: `description` writes the description's loops over the axes, its block and its
regions from it, with the leaf's value from a scalar ``semantics(T, *operands, *axes)``; and
`vector_impl` writes an implementation that stores one vector into the output, its value from
``value(T, *operands)`` (an LLVM intrinsic call, TVM's vector arithmetic) or, with
``per_lane=True``, one lane at a time in a vectorized loop (portable code LLVM vectorizes).
`vector_intrinsic` puts the three together::

    DOT = vector_intrinsic("mine.dot", Role.COMPUTE, dot_product_signature(16, 4, "uint8", "int8", "int32"),
                           lambda T, A, B, C, i, k: C[i] + T.cast(A[k], "int32") * T.cast(B[i, k], "int32"),
                           lambda T, A, B, C: T.call_llvm_pure_intrin(...))

``T`` is TVMScript's ``tirx`` module, handed in so that a template imports no TVM; the
operands are the PrimFuncs' buffers (``A[k]`` a load, ``B.vload([0, 0], "int8x64")`` a vector
load). The output is the last operand; it is read too unless ``accumulate=False`` (a fill).
"""

from __future__ import annotations

from tirbyoc.decl.intrinsic import Cost, Intrinsic, Operand, Role
from tirbyoc.errors import IntrinsicError


def _params(operands, stored: bool, offset_factor: int = 1) -> str:
    def one(op: Operand) -> str:
        shape = op.stored_shape if stored else op.shape
        return (f'{op.name}: T.Buffer({tuple(shape)!r}, "{op.dtype}", offset_factor={offset_factor}, '
                f'scope="{op.scope}")')
    return ", ".join(one(op) for op in operands)


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
    binding them, the output (last operand) at the spatial axes, in order, set to
    ``semantics(T, *operands, *axes)``; its buffers' ``offset_factor`` as given."""
    operands, axes = list(operands), [tuple(a) for a in axes]
    names = [a[0] for a in axes]
    spatial = [f"v{n}" for n, _, kind in axes if kind == "S"]
    reads, writes = _regions(operands, accumulate, stored=False)
    loops = (f"for {names[0]} in T.serial({axes[0][1]}):" if len(axes) == 1 else
             f"for {', '.join(names)} in T.grid({', '.join(str(a[1]) for a in axes)}):")
    args = ", ".join([op.name for op in operands] + [f"v{n}" for n in names])
    src = f'''
@T.prim_func(s_tir=True)
def desc({_params(operands, False, offset_factor)}) -> None:
    with T.sblock("root"):
        T.reads({reads})
        T.writes({writes})
        {loops}
            with T.sblock("{block}"):
                {", ".join(f"v{n}" for n in names)} = T.axis.remap("{"".join(a[2] for a in axes)}", [{", ".join(names)}])
                {operands[-1].name}[{", ".join(spatial)}] = semantics(T, {args})
'''
    return _parse(src, semantics=semantics)


def vector_impl(operands, value, *, accumulate: bool = True, per_lane: bool = False):
    """The implementation PrimFunc: the output (last operand, one dimension) stored as one
    vector, ``value(T, *operands)``; with ``per_lane``, lane ``i`` of a vectorized loop stored
    as ``value(T, *operands, i)``."""
    operands = list(operands)
    out = operands[-1]
    if len(out.stored_shape) != 1:
        raise IntrinsicError(f"vector_impl stores one vector; output {out.name} is {out.stored_shape}")
    lanes = out.stored_shape[0]
    reads, writes = _regions(operands, accumulate, stored=True)
    names = ", ".join(op.name for op in operands)
    store = (f"for i in T.vectorized({lanes}):\n            {out.name}[i] = value(T, {names}, i)" if per_lane else
             f"{out.name}[T.ramp(T.int32(0), 1, {lanes})] = value(T, {names})")
    src = f'''
@T.prim_func(s_tir=True)
def impl({_params(operands, True)}) -> None:
    with T.sblock("root"):
        T.reads({reads})
        T.writes({writes})
        {store}
'''
    return _parse(src, value=value)


def vector_intrinsic(name: str, role: Role | str, signature: tuple, semantics, value, *, accumulate: bool = True,
                     per_lane: bool = False, **declared) -> Intrinsic:
    """An `Intrinsic` declared once from its ``signature`` (operands, axes - what the
    signature families return): its description written from ``semantics`` (`description`),
    its implementation from ``value`` (`vector_impl`); ``declared``: `Intrinsic`'s cost and doc."""
    operands, axes = list(signature[0]), list(signature[1])

    def build():
        return (description(operands, axes, semantics, accumulate=accumulate,
                            block="update" if accumulate else "init"),
                vector_impl(operands, value, accumulate=accumulate, per_lane=per_lane))

    return Intrinsic(name, role, operands, axes, build, **{"cost": Cost(cycles=1), **declared})


__all__ = ["description", "vector_impl", "vector_intrinsic"]
