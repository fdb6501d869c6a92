"""Valid input domains read from how a PrimFunc uses its buffers.

Uniform random inputs are outside the domain of many real operators: token ids drawn from
[-64, 64) index outside an embedding table, shift amounts of 32 or more are undefined, a
zero divisor traps, ``log`` of a negative number is NaN. A check on such inputs proves
nothing (TVM's own build reads garbage) or blames a correct rewrite. This module reads the
domain each input buffer needs from the function itself:

- a buffer loaded inside another buffer's index (``table[ids[i], j]``, a gather) holds
  indices: ``[0, extent)`` of the indexed dimension;
- the right operand of ``<<`` / ``>>``: ``[0, bits)`` of the shifted value's dtype;
- the right operand of a division or modulo: non-zero;
- the argument of ``log`` / ``sqrt`` / ``rsqrt``: positive.

`buffer_domains` answers per parameter buffer; `draw` makes seeded data in a domain (or
`tirbyoc.offloading.verification.random_array`'s default data when there is none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tirbyoc._tvm import PrimCall, TensorLoad, expr_dtype, is_buffer, iter_stores, prim_expr, tirx
from tirbyoc.dtypes import numpy_dtype, parse_dtype
from tirbyoc.errors import VerificationError
from tirbyoc.ir.tir_walk import iter_exprs

_SHIFT_CALLS = ("tirx.shift_left", "tirx.shift_right")
_SHIFTS = (prim_expr.LShift, prim_expr.RShift)
_POSITIVE = ("tirx.log", "tirx.log2", "tirx.log10", "tirx.sqrt", "tirx.rsqrt")
_DIVISIONS = (prim_expr.Div, prim_expr.Mod, prim_expr.FloorDiv, prim_expr.FloorMod)


@dataclass(frozen=True)
class Domain:
    """Values an input may take: ``[low, high)`` (either end open when None), and whether
    zero is excluded. ``why`` names the use that implied it, for messages."""

    low: float | None = None
    high: float | None = None
    nonzero: bool = False
    why: str = ""

    def intersect(self, other: "Domain") -> "Domain":
        low = max((v for v in (self.low, other.low) if v is not None), default=None)
        high = min((v for v in (self.high, other.high) if v is not None), default=None)
        why = "; ".join(w for w in (self.why, other.why) if w)
        return Domain(low, high, self.nonzero or other.nonzero, why)


def _loads_in(expr) -> list:
    return [n for n in iter_exprs(expr) if isinstance(n, TensorLoad)]


def _op_name(call) -> str:
    op = call.op
    return str(op.name) if hasattr(op, "name") else ""


def buffer_domains(func) -> dict[str, Domain]:
    """``{parameter buffer name: Domain}`` for the buffers whose use implies one."""
    params = {str(p.name) for p in func.params if is_buffer(p)}
    found: dict[str, Domain] = {}

    def note(load, domain: Domain):
        name = str(load.source.name)
        if name in params:
            found[name] = found[name].intersect(domain) if name in found else domain

    def shift(value, amount):
        bits = parse_dtype(expr_dtype(value))[1]
        for inner in _loads_in(amount):
            note(inner, Domain(0, bits, why=f"a shift amount of {bits}-bit values"))

    def visit(node):
        if isinstance(node, (TensorLoad, tirx.BufferStore)):
            buf = node.source if isinstance(node, TensorLoad) else node.buffer
            for dim, index in enumerate(node.indices):
                extent = buf.shape[dim]
                if not isinstance(extent, tirx.IntImm):
                    continue
                for inner in _loads_in(index):
                    note(inner, Domain(0, int(extent), why=f"indexes {buf.name} dimension {dim}"))
        elif isinstance(node, _SHIFTS):
            shift(node.a, node.b)
        elif isinstance(node, PrimCall) and _op_name(node) in _SHIFT_CALLS and len(node.args) == 2:
            shift(node.args[0], node.args[1])
        elif isinstance(node, PrimCall) and _op_name(node) in _POSITIVE and node.args:
            for inner in _loads_in(node.args[0]):
                note(inner, Domain(0, None, nonzero=True, why=f"the argument of {_op_name(node)}"))
        elif isinstance(node, _DIVISIONS):
            for inner in _loads_in(node.b):
                note(inner, Domain(nonzero=True, why="a divisor"))

    for node in iter_exprs(func.body):
        visit(node)
    for store in iter_stores(func.body):
        visit(store)
    return found


# With ``full_range``, wide integers stay within this bound, where a few thousand products
# cannot overflow int32 (wrap-around, undefined in LLVM's nsw arithmetic, never decides a
# comparison).
_WIDE_BOUND = 1 << 20


def random_array(shape, dtype: str, rng: np.random.Generator, *, full_range: bool = False) -> np.ndarray:
    """Seeded data that exercises a dtype: full-range 8-bit ints, small wide ints, [-1, 1]
    floats. ``full_range``: integers over the dtype's whole range (wide ones up to
    +-2**20) - what an intrinsic's self-check draws, where no model's domain applies."""
    shape = tuple(int(s) for s in shape)
    if full_range and dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -_WIDE_BOUND), min(int(info.max), _WIDE_BOUND)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if dtype in ("int8", "uint8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    if dtype.startswith(("int", "uint")):
        low = 0 if dtype.startswith("uint") else -64
        return rng.integers(low, 64, size=shape, dtype=dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("float", "bfloat")):
        return rng.uniform(-1.0, 1.0, size=shape).astype(numpy_dtype(dtype))
    raise VerificationError(f"cannot make test data of dtype {dtype!r}")


def draw(shape, dtype: str, rng: np.random.Generator, domain: Domain | None = None) -> np.ndarray:
    """Seeded data of ``shape`` and ``dtype`` inside ``domain`` (default data without one)."""
    if domain is None:
        return random_array(shape, dtype, rng)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        low = int(info.min) if domain.low is None else max(int(np.ceil(domain.low)), int(info.min))
        high = min(int(info.max) + 1, 65 if domain.high is None else int(np.ceil(domain.high)))
        if domain.low is None:
            low = max(low, -64)
        if domain.nonzero and low <= 0 < high and high - low > 1:
            values = rng.integers(low, high - 1, size=shape, dtype=np.int64)
            values = np.where(values >= 0, values + 1, values)  # skip 0
        else:
            values = rng.integers(low, max(high, low + 1), size=shape, dtype=np.int64)
        return values.astype(dtype)
    low = -1.0 if domain.low is None else float(domain.low)
    high = 1.0 if domain.high is None else float(domain.high)
    if domain.nonzero:
        magnitude = rng.uniform(0.5, 1.5, size=shape)
        if domain.low is not None and domain.low >= 0:
            values = magnitude
        else:
            values = magnitude * rng.choice([-1.0, 1.0], size=shape)
    else:
        values = rng.uniform(low, high, size=shape)
    return values.astype(numpy_dtype(dtype))


__all__ = ["Domain", "buffer_domains", "draw", "random_array"]
