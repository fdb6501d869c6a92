"""Reading a fused epilogue off a PrimFunc: the elementwise chain after a core that a
template's `BlockALU` can run on the accumulator tile (`tirbyoc.rewrite.block.epilogue` fuses it).

Starting from the core's output, each next block must be the only reader of the previous
one's output, read it elementwise (same indices, same shape) and compute a sequence of the
ALU's operations on it - with an immediate (``x + 32``, ``x >> 6``, ``max(min(x, 127),
-128)``) or a tensor broadcast along the other dimensions (``x + bias[c]``) - in the
accumulator's dtype; a block that is a pure narrowing cast ends the chain as the store. The
first block that does not qualify ends it too, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirbyoc._tvm import SPATIAL, TensorLoad, expr_dtype, iter_blocks, tirx, tvm_ffi

_BINARY = {tirx.Add: "add", tirx.Max: "max", tirx.Min: "min"}


@dataclass(frozen=True)
class AluOp:
    """One ALU operation of a step: ``op`` with an immediate (``imm``) or a tensor operand
    (``tensor``: the buffer's name, ``dims``: the store's index position each of its indices
    is)."""

    op: str
    imm: int | None = None
    tensor: str | None = None
    dims: tuple = ()

    def describe(self) -> str:
        if self.tensor is not None:
            return f"{self.op} {self.tensor}"
        return f"{self.op} {self.imm}"


@dataclass(frozen=True)
class EpilogueStep:
    """One fused block: the ALU operations it computes on its input, or (``narrow``) the cast
    the store does."""

    block: str
    reads: str  # the buffer it reads elementwise (the previous step's output)
    writes: str
    ops: tuple = ()
    narrow: str | None = None  # the dtype a narrowing store writes

    def describe(self) -> str:
        if self.narrow:
            return f"{self.block} (store as {self.narrow})"
        return f"{self.block} ({', '.join(o.describe() for o in self.ops)})"


@dataclass
class Epilogue:
    """The chain after a core: its steps in order, or why it stops where it does."""

    steps: list = field(default_factory=list)
    stop: str | None = None  # why the next block is not fused (None: nothing follows)

    @property
    def narrows(self) -> bool:
        return bool(self.steps) and self.steps[-1].narrow is not None


def blocks_of(func) -> list:
    """The blocks of ``func``, the root excepted."""
    return [b for b in iter_blocks(func.body) if b.name_hint != "root"]


def readers(blocks, buffer: str) -> list:
    """The blocks among ``blocks`` that read ``buffer``."""
    return [b for b in blocks if any(str(r.source.name) == buffer for r in b.reads)]


def find_epilogue(func, output: str, acc_dtype: str, alu) -> Epilogue:
    """The fusable chain of ``func`` that starts from the core's output buffer ``output``,
    for the ALU ``alu`` (a `BlockALU`)."""
    blocks = blocks_of(func)
    params = {str(p.name) for p in func.params}
    out = Epilogue()
    buffer = output
    while True:
        if buffer in params:
            return out  # the core (or the last step) writes the function's output
        consumers = [b for b in readers(blocks, buffer)
                     if not any(str(w.source.name) == buffer for w in b.writes)]
        if not consumers:
            return out
        if len(consumers) > 1:
            names = ", ".join(b.name_hint for b in consumers)
            out.stop = f"{buffer} is read by {len(consumers)} blocks ({names})"
            return out
        block = consumers[0]
        step, why = _step(block, buffer, acc_dtype, alu)
        if step is None:
            out.stop = f"block {block.name_hint!r}: {why}"
            return out
        out.steps.append(step)
        if step.narrow:
            return out
        buffer = step.writes


def _step(block, src: str, acc_dtype: str, alu) -> tuple[EpilogueStep | None, str]:
    """The block as an epilogue step reading ``src``, or (None, why not)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is not None:
        return None, "not one elementwise store"
    if any(int(iv.iter_type) != SPATIAL for iv in block.iter_vars):
        return None, "it reduces"
    index = [str(i) for i in store.indices]
    if not all(isinstance(i, tirx.Var) for i in store.indices) or len(set(index)) != len(index):
        return None, "its output is not indexed by its iterators"
    value, narrow = store.value, None
    out_dtype = str(store.buffer.dtype)
    if out_dtype != acc_dtype:
        if not (isinstance(value, tirx.Cast) and out_dtype in ("int8", "uint8", "int16")):
            return None, f"it writes {out_dtype}, not the accumulator's {acc_dtype}"
        value, narrow = value.value, out_dtype
    ops: list[AluOp] = []
    why = alu_ops(value, src, index, acc_dtype, alu, ops)
    if why:
        return None, why
    if narrow and ops:
        return None, f"it computes and narrows in one block ({', '.join(o.describe() for o in ops)})"
    return EpilogueStep(block.name_hint, src, str(store.buffer.name), tuple(ops), narrow), ""


def alu_ops(expr, src: str, index: list | None, acc_dtype: str, alu, ops: list) -> str:
    """Append the ALU operations ``expr`` applies to ``src`` (innermost first); the reason
    when it is not such a sequence ('' when it is). ``index``: the output's iterators, which
    ``src`` must be read at and a tensor operand indexed by (None: not checked)."""
    if isinstance(expr, TensorLoad):
        if str(expr.source.name) != src:
            return f"it reads {expr.source.name} where the accumulator chain is {src}"
        if index is not None and [str(i) for i in expr.indices] != index:
            return f"it reads {src} at other indices than it writes"
        return ""
    if expr_dtype(expr) != acc_dtype:
        return f"it computes in {expr_dtype(expr)}, not the accumulator's {acc_dtype}"
    if isinstance(expr, tirx.RShift):
        if not isinstance(expr.b, tirx.IntImm) or not 0 <= int(expr.b) <= 31:
            return "it shifts by something other than a constant 0..31"
        return alu_ops(expr.a, src, index, acc_dtype, alu, ops) or _push(ops, alu, AluOp("shr", int(expr.b)))
    name = _BINARY.get(type(expr))
    if name is None:
        return f"{type(expr).__name__} is not an ALU operation of the template"
    for chain, other in ((expr.a, expr.b), (expr.b, expr.a)):
        if not _reads(chain, src):
            continue
        why = alu_ops(chain, src, index, acc_dtype, alu, ops)
        if why:
            return why
        if isinstance(other, tirx.IntImm):
            return _push(ops, alu, AluOp(name, int(other)))
        if isinstance(other, TensorLoad) and str(expr_dtype(other)) == acc_dtype:
            pos = ()
            if index is not None:
                # each index an iterator of the output (in order) or 0 (a unit dimension)
                pos = [index.index(str(i)) if isinstance(i, tirx.Var) and str(i) in index
                       else (-1 if isinstance(i, tirx.IntImm) and int(i) == 0 else None)
                       for i in other.indices]
                walked = [p for p in pos if p is not None and p >= 0]
                if None in pos or len(set(walked)) != len(walked) or walked != sorted(walked):
                    return f"its operand {other.source.name} is not indexed by its iterators in order"
            if name not in alu.tensor_ops:
                return f"the ALU has no {name} with a tensor operand"
            return _push(ops, alu, AluOp(name, tensor=str(other.source.name), dims=tuple(pos)))
        return f"the other operand of its {name} is neither a constant nor an {acc_dtype} tensor"
    return f"its {name} does not apply to {src}"


def _push(ops: list, alu, op: AluOp) -> str:
    if op.op not in alu.ops:
        return f"the ALU has no {op.op}"
    ops.append(op)
    return ""


def loads(expr) -> list:
    """The tensor loads in ``expr``."""
    found = []
    tvm_ffi.structural_walk(expr, (TensorLoad, found.append), order="pre")
    return found


def _reads(expr, buffer: str) -> bool:
    return any(str(ld.source.name) == buffer for ld in loads(expr))


__all__ = ["AluOp", "Epilogue", "EpilogueStep", "alu_ops", "blocks_of", "find_epilogue", "loads", "readers"]
