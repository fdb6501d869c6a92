"""Finding the elementwise chains of a quantized model whose 8-bit output is a function of one
8-bit tensor: the chains `tirbyoc.relax.byte_tables` turns into 256-entry tables.

A model quantized by ONNX Runtime's QDQ flow computes its activation functions in float
between a dequantize and a quantize, often with more quantize-dequantize pairs inside (BERT's
GELU: ``x/sqrt(2)``, ``erf``, ``+1``, ``*x``, ``*0.5``, each requantized). When the chain reads
one 8-bit tensor ``q`` elementwise, plus scalar constants only, its 8-bit result at each
position depends on the value of ``q`` there alone: 256 possible inputs, 256 outputs. This
module finds such chains in a Relax function before legalization:

    S(v) = the 8-bit variables ``v`` is an elementwise function of, alone

computed in binding order - for ``v = op(a, b, ...)`` with ``op`` elementwise and every
operand that is not constant of ``v``'s shape, the intersection over those operands of
``S(a)`` (with ``a`` itself when it is 8-bit); a constant operand must hold one element (a
per-channel constant makes the function differ by position). A chain's root is an 8-bit
variable the chain does not continue past; its source is the earliest variable of ``S``:
the longest chain. Only chains worth a table are kept: with an operation beyond the affine
requantization a fused write-back already computes in vectors (a transcendental, a second
rounding step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tvm import relax
from tvm.ir import Op

from tirbyoc._tvm import structural_equal

BYTE_DTYPES = ("uint8", "int8")

# Relax operators computing each output element from the same element of their operands
# (scalars broadcast). Those not in AFFINE make a chain worth a table by themselves.
ELEMENTWISE = frozenset({
    "relax.abs", "relax.add", "relax.astype", "relax.ceil", "relax.clip", "relax.cos", "relax.dequantize",
    "relax.divide", "relax.erf", "relax.exp", "relax.floor", "relax.log", "relax.maximum", "relax.minimum",
    "relax.multiply", "relax.negative", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.leakyrelu",
    "relax.nn.relu", "relax.nn.silu", "relax.power", "relax.quantize", "relax.round", "relax.rsqrt",
    "relax.sigmoid", "relax.sin", "relax.sqrt", "relax.square", "relax.subtract", "relax.tanh", "relax.trunc",
})
AFFINE = frozenset({"relax.add", "relax.astype", "relax.clip", "relax.dequantize", "relax.divide", "relax.maximum",
                    "relax.minimum", "relax.multiply", "relax.nn.relu", "relax.quantize", "relax.subtract"})


@dataclass
class ByteChain:
    """One chain: ``root`` (an 8-bit variable) as a function of ``source`` (an 8-bit variable
    of the same shape); ``bindings``: the chain's bindings from source to root, with the
    constant ones they read, in binding order (what a table's function recomputes)."""

    source: relax.Var
    root: relax.Var
    bindings: list = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        """The chain's operators in order, without the ``relax.`` prefix."""
        return [b.value.op.name.removeprefix("relax.") for b in self.bindings
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, Op)]


def is_byte(var) -> bool:
    """Whether ``var`` is an 8-bit integer tensor."""
    ty = getattr(var, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) in BYTE_DTYPES


def _shape(expr):
    ty = getattr(expr, "ty", None)
    return ty.shape if isinstance(ty, relax.TensorType) else None


def _same_shape(a, b) -> bool:
    sa, sb = _shape(a), _shape(b)
    return sa is not None and sb is not None and structural_equal(sa, sb)


def _one_element(expr) -> bool:
    """Whether ``expr`` is a tensor of one element (a scalar constant broadcasts the same
    value to every position)."""
    shape = _shape(expr)
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        return False
    dims = [getattr(d, "value", None) for d in shape.values]
    return None not in dims and prod(dims) == 1


class _Analysis:
    """S(v) and constness for the bindings of one Relax function, in binding order."""

    def __init__(self, func):
        self.bindings = [b for block in func.body.blocks for b in block.bindings]
        self.order = {b.var: i for i, b in enumerate(self.bindings)}
        self.value = {b.var: b.value for b in self.bindings}
        self.constant: set = set()
        self.sources: dict = {}
        self.users: dict = {}
        for b in self.bindings:
            self._visit(b.var, b.value)

    def _is_constant(self, arg) -> bool:
        # a constant tensor, a PrimValue, a shape or a string: anything but a variable or a tuple
        return arg in self.constant if isinstance(arg, relax.Var) else not isinstance(arg, relax.Tuple)

    def _visit(self, var, value) -> None:
        if not isinstance(value, relax.Call):
            return
        args = list(value.args)
        for a in args:
            if isinstance(a, relax.Var):
                self.users.setdefault(a, []).append(var)
        if all(self._is_constant(a) for a in args):
            self.constant.add(var)
            return
        if getattr(value.op, "name", None) not in ELEMENTWISE:
            return
        found = None
        for a in args:
            if self._is_constant(a):
                if _shape(a) is not None and not _one_element(a):
                    return
                continue
            if not isinstance(a, relax.Var) or not _same_shape(a, var):
                return
            cand = set(self.sources.get(a, ())) | ({a} if is_byte(a) else set())
            found = cand if found is None else found & cand
        if found:
            self.sources[var] = found

    def source_of(self, var):
        """The earliest 8-bit variable ``var`` is a function of alone, or None."""
        found = self.sources.get(var)
        if not found:
            return None
        return min(found, key=lambda v: self.order.get(v, -1))  # a parameter comes first

    def is_root(self, var, source) -> bool:
        """Whether the chain from ``source`` ends at ``var``: no reader continues it."""
        return not any(source in self.sources.get(u, ()) for u in self.users.get(var, ()))

    def chain(self, source, root) -> list:
        """The bindings from ``source`` to ``root`` (and the constant ones they read), in order."""
        needed, todo = set(), [root]
        while todo:
            v = todo.pop()
            if v in needed or v is source or v not in self.value:
                continue
            if v is not root and v not in self.constant and source not in self.sources.get(v, ()):
                continue
            needed.add(v)
            todo.extend(a for a in self.value[v].args if isinstance(a, relax.Var))
        return [b for b in self.bindings if b.var in needed]


def worth_a_table(chain: ByteChain) -> bool:
    """Whether a table saves work: the chain computes more than one requantization (the
    affine map a fused write-back computes in vectors anyway) - a transcendental or a
    second rounding step."""
    ops = ["relax." + o for o in chain.ops]
    return any(o in ELEMENTWISE and o not in AFFINE for o in ops) or ops.count("relax.quantize") >= 2


def byte_chains(func) -> list[ByteChain]:
    """The chains of ``func`` (a Relax function) worth a 256-entry table, in binding order."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    a = _Analysis(func)
    found = []
    for b in a.bindings:
        source = a.source_of(b.var)
        if source is None or not is_byte(b.var) or not a.is_root(b.var, source):
            continue
        chain = ByteChain(source, b.var, a.chain(source, b.var))
        if worth_a_table(chain):
            found.append(chain)
    return found


__all__ = ["AFFINE", "BYTE_DTYPES", "ELEMENTWISE", "ByteChain", "byte_chains", "is_byte", "worth_a_table"]
