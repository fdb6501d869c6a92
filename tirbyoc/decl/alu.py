"""`BlockALU`: a template's vector ALU working on whole accumulator tiles, declared as data.

A GEMM accelerator usually finishes a layer on chip: the bias add, the requantization (add a
rounding constant, shift right, clip) and the ReLU run on the accumulator tile before the
store narrows it to 8 bits, so only int8 values leave the accelerator. VTA's ALU instruction
does one operation (add, max, min, shift right), with an immediate or a second accumulator
tile, over a whole tile. A template with such an ALU declares it here, by the packed
functions that perform it; the rewrite then fuses the elementwise blocks that follow a
tensorized core in the same PrimFunc (``FuseOps`` / ``FuseTIR`` put them there) into the
scratchpad tile loop (`tirbyoc.rewrite.block.epilogue`).

The functions take:

- ``immediate(Z, X, op, imm)``: ``Z = X op imm``;
- ``tensor(Z, X, Y, op, *dims)``: ``Z = X op Y`` with ``Y`` broadcast: Y's dimension ``d``
  follows Z's dimension ``dims[d]`` (a bias per output channel);

``Z`` and ``X`` are strided views of the accumulator scope with as many elements, walked in
the row-major order of each. ``op`` is the index of the operation in ``ops``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc.errors import TemplateError

#: The operations an ALU may declare, by the name the rewrite recognises them under.
ALU_OPS = ("add", "max", "min", "shr")


@dataclass(frozen=True)
class BlockALU:
    """``immediate`` / ``tensor``: packed function names; ``scope``: the scratchpad the ALU
    works in (the accumulator); ``ops``: the operations in the order the functions number
    them; ``tensor_ops``: those that also take a tensor operand."""

    immediate: str
    tensor: str
    scope: str
    ops: tuple = ALU_OPS
    tensor_ops: tuple = ("add", "max", "min")
    doc: str = ""

    def __post_init__(self):
        for name in ("immediate", "tensor", "scope"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TemplateError(f"BlockALU.{name} must be a non-empty string, got {value!r}")
        for name in ("ops", "tensor_ops"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TemplateError(f"BlockALU.{name} is a tuple of operation names, got the string {value!r}")
            unknown = sorted(set(value) - set(ALU_OPS))
            if unknown:
                raise TemplateError(f"BlockALU.{name}: unknown operations {unknown}; known: {list(ALU_OPS)}")
            object.__setattr__(self, name, tuple(value))
        missing = sorted(set(self.tensor_ops) - set(self.ops))
        if missing:
            raise TemplateError(f"BlockALU.tensor_ops {missing} are not among its ops {list(self.ops)}")

    def opcode(self, op: str) -> int:
        return self.ops.index(op)


__all__ = ["ALU_OPS", "BlockALU"]
