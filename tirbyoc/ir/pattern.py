"""Block patterns: one TensorIR block turned into plain Python data.

The matcher compares workload blocks with intrinsic descriptions many times (every block of
a model against every intrinsic of every template). Reading TVM objects goes through the
FFI, so each block is read once, here, into tuples and small dataclasses: its iterators,
its store, its loads with their indices as affine forms, and its value as an expression
tree. Everything after this module works on that data alone.

Expression trees are tuples:
``("load", i)`` (the i-th entry of ``loads``), ``("const", dtype, value)``,
``("var", dtype, name)``, ``("cast", dtype, child)``, ``(op, dtype, child, ...)`` for
arithmetic (``add mul sub div floordiv floormod max min shr shl and or ...``),
``("call", dtype, name, child, ...)`` and ``("select", dtype, cond, then, else)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tirbyoc._tvm import (
    PrimCall,
    StringImm,
    TensorLoad,
    child_blocks,
    child_stmts,
    expr_dtype,
    is_buffer,
    iter_blocks,
    iter_kind,
    prim_expr,
    root_block,
    s_tir,
    tirx,
)

_BINARY = {getattr(prim_expr, cls): op for cls, op in {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Mod": "mod", "FloorDiv": "floordiv",
    "FloorMod": "floormod", "Min": "min", "Max": "max", "RShift": "shr", "LShift": "shl",
    "BitwiseAnd": "bitand", "BitwiseOr": "bitor", "BitwiseXor": "bitxor", "And": "and", "Or": "or",
    "EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge",
}.items()}
COMMUTATIVE = frozenset({"add", "mul", "min", "max", "bitand", "bitor", "bitxor", "and", "or", "eq", "ne"})
_CONSTANTS = (prim_expr.IntImm, prim_expr.FloatImm, StringImm)


def load_source(node):
    """The buffer a load reads (TVM 0.27's ``TensorLoad`` calls it ``source``)."""
    buf = getattr(node, "source", None)
    return buf if buf is not None else node.buffer


@dataclass(frozen=True)
class Affine:
    """``sum(coeff * var) + const`` over integer variables, terms sorted by name."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    def coeff(self, var: str) -> int:
        for name, c in self.terms:
            if name == var:
                return c
        return 0

    @property
    def vars(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.terms)


def affine(expr) -> Affine | None:
    """The affine form of an integer index expression, or None if it is not affine."""
    terms: dict[str, int] = {}
    const = 0
    stack = [(expr, 1)]
    while stack:
        node, scale = stack.pop()
        if isinstance(node, prim_expr.IntImm):
            const += scale * int(node.value)
        elif isinstance(node, prim_expr.Var):
            name = str(node.name)
            terms[name] = terms.get(name, 0) + scale
        elif isinstance(node, prim_expr.Add):
            stack += [(node.a, scale), (node.b, scale)]
        elif isinstance(node, prim_expr.Sub):
            stack += [(node.a, scale), (node.b, -scale)]
        elif isinstance(node, prim_expr.Mul):
            a, b = node.a, node.b
            if isinstance(b, prim_expr.IntImm):
                stack.append((a, scale * int(b.value)))
            elif isinstance(a, prim_expr.IntImm):
                stack.append((b, scale * int(a.value)))
            else:
                return None
        elif isinstance(node, prim_expr.Cast):
            stack.append((node.value, scale))
        else:
            return None
    return Affine(tuple(sorted((k, v) for k, v in terms.items() if v)), const)


def expr_vars(expr) -> frozenset[str]:
    """Names of the variables an expression mentions."""
    out = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, prim_expr.Var):
            out.add(str(node.name))
        elif isinstance(node, _CONSTANTS):
            continue
        elif isinstance(node, PrimCall):
            stack.extend(node.args)
        elif isinstance(node, TensorLoad):
            stack.extend(node.indices)
        else:
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                child = getattr(node, attr, None)
                if child is not None and not isinstance(child, (int, float, str)):
                    stack.append(child)
    return frozenset(out)


def static_int(extent) -> int | None:
    """A shape's or extent's value when it is a constant, else None (symbolic)."""
    return int(extent.value) if isinstance(extent, prim_expr.IntImm) else None


@dataclass(frozen=True)
class Access:
    """One buffer access of a block: buffer facts and its index, dimension by dimension."""

    buffer: str
    dtype: str
    shape: tuple[int | None, ...]
    scope: str
    strides: tuple[int | None, ...]  # () when the buffer is compact
    indices: tuple[Affine | None, ...]  # None: this dimension's index is not affine
    index_vars: tuple[frozenset[str], ...]
    text: str

    @property
    def vars(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for v in self.index_vars:
            out |= v
        return out

    def same_place(self, other: "Access") -> bool:
        return self.buffer == other.buffer and self.indices == other.indices


@dataclass(frozen=True)
class IterInfo:
    name: str
    extent: int | None  # None: symbolic
    kind: str  # "S", "R", or "O" (any other iterator type)


@dataclass
class BlockPattern:
    """A block as data. ``problem`` says why it can never match any intrinsic."""

    name: str
    iters: tuple[IterInfo, ...] = ()
    store: Access | None = None
    value: tuple | None = None
    loads: tuple[Access, ...] = ()
    init_value: tuple | None = None
    problem: str | None = None
    block: object = field(default=None, repr=False, compare=False)

    @property
    def is_reduction(self) -> bool:
        return any(it.kind == "R" for it in self.iters)

    def iter(self, name: str) -> IterInfo:
        for it in self.iters:
            if it.name == name:
                return it
        raise KeyError(name)

    @property
    def buffers_read(self) -> frozenset[str]:
        return frozenset(a.buffer for a in self.loads)


class _Reader:
    """Reads one block; ``names`` gives every Buffer object of the function a unique name."""

    def __init__(self, names: "BufferNames"):
        self.names = names
        self.loads: list[Access] = []

    def access(self, buf, indices) -> Access:
        key = self.names.key(buf)
        idx = tuple(indices)
        forms = tuple(affine(i) for i in idx)
        ivars = tuple(f.vars if f is not None else expr_vars(i) for f, i in zip(forms, idx))
        strides = tuple(static_int(s) for s in buf.strides)
        text = f"{key}[{', '.join(str(i) for i in idx)}]"
        return Access(key, str(buf.dtype), tuple(static_int(s) for s in buf.shape), str(buf.scope()),
                      strides, forms, ivars, text)

    def tree(self, node) -> tuple:
        dtype = expr_dtype(node)
        if isinstance(node, TensorLoad):
            self.loads.append(self.access(load_source(node), node.indices))
            return ("load", len(self.loads) - 1)
        if isinstance(node, prim_expr.IntImm):
            return ("const", dtype, int(node.value))
        if isinstance(node, prim_expr.FloatImm):
            return ("const", dtype, float(node.value))
        if isinstance(node, prim_expr.Var):
            return ("var", dtype, str(node.name))
        if isinstance(node, prim_expr.Cast):
            return ("cast", dtype, self.tree(node.value))
        op = _BINARY.get(type(node))
        if op is not None:
            return (op, dtype, self.tree(node.a), self.tree(node.b))
        if isinstance(node, prim_expr.Not):
            return ("not", dtype, self.tree(node.a))
        if isinstance(node, prim_expr.Select):
            return ("select", dtype, self.tree(node.condition), self.tree(node.true_value),
                    self.tree(node.false_value))
        if isinstance(node, PrimCall):
            name = str(node.op.name) if hasattr(node.op, "name") else str(node.op)
            if name == "tirx.if_then_else" or name.endswith(".if_then_else"):
                c, t, f = node.args
                return ("select", dtype, self.tree(c), self.tree(t), self.tree(f))
            return ("call", dtype, name, *(self.tree(a) for a in node.args))
        return ("opaque", dtype, type(node).__name__)


class BufferNames:
    """Unique, stable names for the Buffer objects of one function."""

    def __init__(self):
        self._by_name: dict[str, list] = {}

    def key(self, buf) -> str:
        name = str(buf.name)
        seen = self._by_name.setdefault(name, [])
        for i, other in enumerate(seen):
            if other.same_as(buf):
                return name if i == 0 else f"{name}#{i}"
        seen.append(buf)
        i = len(seen) - 1
        return name if i == 0 else f"{name}#{i}"


def read_block(block, names: BufferNames | None = None) -> BlockPattern:
    """The pattern of one ``SBlock``."""
    names = names or BufferNames()
    pat = BlockPattern(str(block.name_hint), block=block)
    iters = []
    for iv in block.iter_vars:
        iters.append(IterInfo(str(iv.var.name), static_int(iv.dom.extent), iter_kind(iv)))
    pat.iters = tuple(iters)
    if child_blocks(block):
        pat.problem = "it is not a leaf block (it holds other blocks)"
        return pat
    body = block.body
    if not isinstance(body, tirx.BufferStore):
        pat.problem = f"its body is a {type(body).__name__}, not a single buffer store"
        return pat
    reader = _Reader(names)
    pat.store = reader.access(body.buffer, body.indices)
    pat.value = reader.tree(body.value)
    pat.loads = tuple(reader.loads)
    if block.init is not None:
        init = block.init
        if isinstance(init, tirx.BufferStore):
            pat.init_value = _Reader(names).tree(init.value)
        else:
            pat.init_value = ("opaque", "", type(init).__name__)
    other = [it for it in pat.iters if it.kind == "O"]
    if other:
        pat.problem = f"iterator {other[0].name} is neither spatial nor reduction"
    return pat


def function_blocks(func) -> list[BlockPattern]:
    """Patterns of every block of a schedulable PrimFunc except the root, in program order.

    Raises ValueError for a PrimFunc that is not schedulable TIR (no root block).
    """
    root = root_block(func)
    if root is None:
        raise ValueError(
            "the PrimFunc is not schedulable TensorIR (its body is not a root block); match "
            "PrimFuncs written with @T.prim_func(s_tir=True) or produced by LegalizeOps, "
            "before they are lowered"
        )
    names = BufferNames()
    for buf in func.params:
        if is_buffer(buf):
            names.key(buf)
    return [read_block(b, names) for b in iter_blocks(root.body, include_self=False)
            if isinstance(b, s_tir.SBlock)]


def describe(tree, loads=()) -> str:
    """Human words for an expression tree (for reasons)."""
    op = tree[0]
    if op == "load":
        return f"a load of {loads[tree[1]].buffer}" if loads else "a load"
    if op == "const":
        return f"the constant {tree[2]}"
    if op == "cast":
        return f"a cast to {tree[1]}"
    if op == "add" and any(c[0] == "mul" for c in tree[2:]):
        return "multiply-add"
    if op == "call":
        return f"a call to {tree[2]}"
    return {"shr": "shift-right", "shl": "shift-left", "select": "a select"}.get(op, op)


def _is_operand(tree) -> bool:
    """A tensor element, possibly cast: what a multiply-accumulate multiplies."""
    while tree[0] == "cast":
        tree = tree[2]
    return tree[0] == "load"


def _has_product(tree) -> bool:
    if not isinstance(tree, tuple) or not tree:
        return False
    if tree[0] == "mul" and _is_operand(tree[2]) and _is_operand(tree[3]):
        return True
    return any(_has_product(t) for t in tree[1:] if isinstance(t, tuple))


def _instances_outside(func) -> dict[str, int | None]:
    """Per block: how many times the blocks around it (below the root) run it - the product
    of their iterator extents (1 for a block directly under the root; None if symbolic)."""
    out: dict[str, int | None] = {}
    root = root_block(func)

    def walk(stmt, times):
        for child in child_stmts(stmt):
            if isinstance(child, s_tir.SBlock):
                out[str(child.name_hint)] = times
                inner = times
                for iv in child.iter_vars:
                    ext = getattr(iv.dom.extent, "value", None)
                    inner = None if inner is None or ext is None else inner * int(ext)
                walk(child, inner)
            else:
                walk(child, times)

    if root is not None:
        walk(root, 1)
    return out


def block_macs(func) -> dict[str, int]:
    """The multiply-accumulates of each block that does them - the one definition tirbyoc
    uses everywhere (match, offload, run, reports).

    A block multiply-accumulates when it reduces over a product of two tensor elements
    (convolutions, matmuls); sums, means, maxima, copies, padding and element-wise blocks do
    none and are absent. Its MACs are its instances: the product of its iterator extents,
    times the instances of the blocks around it (an already blockized GEMM counts its inner
    tile once per outer iteration, where it computes; the outer block counts nothing). 0
    where an extent is symbolic.
    """
    try:
        blocks = function_blocks(func)
    except ValueError:  # not schedulable TIR: nothing the matcher could take either
        return {}
    around = _instances_outside(func)
    out = {}
    for p in blocks:
        if p.is_reduction and p.value is not None and _has_product(p.value):
            own = prod(it.extent or 0 for it in p.iters)
            times = around.get(p.name, 1)
            out[p.name] = own * times if times is not None else 0
    return out
