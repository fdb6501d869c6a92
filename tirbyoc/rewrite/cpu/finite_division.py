"""A rounded quotient whose dividend takes few values: the division proven away at build time.

The residual write-back of a quantized network ends ``round((q * s_x + r * s_r) / s_y)``: ``q``
is the block's own output quantized and clipped (an integer in [-128, 127]), ``r`` the residual
input (a byte), ``s_*`` float32 constants. `tirbyoc.rewrite.cpu.exact_division` divides exactly in
three multiply-adds, whatever the dividend. But this dividend takes at most 256 x 256 values, so
a cheaper form can be checked against the division on every one of them, here, when the
function is built:

* **distributed**: ``round(q * RN(s_x / s_y) + r * RN(s_r / s_y))`` - the scales folded into the
  products, no division at all (three operations fewer); where the nearest folded constants
  round one point differently, their float32 neighbours are tried too;
* **reciprocal**: ``round(x * RN(1 / s_y))`` (two fewer).

The first form that rounds to the same integer as TVM's division on the whole domain is used;
where neither does (a tie lands between the forms), the exact division stays. Each operation
is evaluated as the built code computes it: float32, rounded to nearest, products fenced (no
contraction into a fused multiply-add), so the check is the proof.

A value is finite-domain when it is built by float32 sums, differences, products, minimum and
maximum (`_OPS`) from constants and from leaves that take few values: an 8- or 16-bit integer
(a load, or a cast of one) and a rounded value clipped to integer bounds (`_clipped_integers`).
The domain is the product of the leaves' (at most `MAX_POINTS` points).

Measured on an Emerald Rapids Xeon, one thread (int8 ResNet-50's residual 1x1 layers): see
`bench/results/finite_division.json`.
"""

from __future__ import annotations

import itertools

import numpy as np

from tirbyoc._tvm import call_name, expr_dtype, structural_equal, tirx
from tirbyoc.rewrite.cpu.exact_division import constant_like, fence_argument, fenced, float_constant, is_round, reciprocal

MAX_POINTS = 1 << 18  # a domain larger than this is not enumerated (256 x 256 is 1 << 16)
MAX_INTEGERS = 1 << 16  # a clipped value's integers, at most
MAX_LEAVES = 6  # the grid's axes
MAX_FOLDED = 3  # terms whose folded constants are searched one step either side (3^3 forms)
_OPS = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.Min: np.minimum,
        tirx.Max: np.maximum}
_NARROW = ("int8", "uint8", "int16", "uint16")


def _scalar(dtype) -> str:
    return str(dtype).split("x")[0]


def _clipped_integers(expr) -> np.ndarray | None:
    """The float32 values of ``min(max(round(v), lo), hi)`` / ``max(min(round(v), hi), lo)`` with
    integer bounds: the integers between (and -0, which rounding keeps), else None."""
    if not isinstance(expr, (tirx.Max, tirx.Min)) or not isinstance(expr.a, (tirx.Max, tirx.Min)):
        return None
    if type(expr) is type(expr.a) or not is_round(expr.a.a):
        return None
    bounds = [float_constant(expr.a.b), float_constant(expr.b)]
    if None in bounds or not all(float(b).is_integer() for b in bounds):
        return None
    lo, hi = min(bounds), max(bounds)
    if hi - lo >= MAX_INTEGERS:
        return None
    values = np.arange(lo, hi + 1, dtype=np.float32)
    return np.append(values, np.float32(-0.0)) if lo <= 0 <= hi else values


def _leaf_values(expr) -> np.ndarray | None:
    """The values of a leaf: a narrow integer (its whole range) or a clipped rounded value."""
    dtype = _scalar(expr_dtype(expr))
    if dtype in _NARROW:
        info = np.iinfo(dtype)
        return np.arange(info.min, info.max + 1, dtype=np.int64)
    if isinstance(expr, tirx.Cast) and dtype.startswith(("int", "uint")) and _scalar(expr_dtype(expr.value)) in _NARROW:
        return _leaf_values(expr.value)  # a widening cast: the same integers
    if dtype == "float32":
        return _clipped_integers(expr)
    return None


class _Domain:
    """The leaves of a dividend and their values, each along its own axis of one grid (at
    most `MAX_LEAVES` leaves and `MAX_POINTS` points)."""

    def __init__(self):
        self.leaves, self.values = [], []

    def axis(self, expr) -> int | None:
        for i, leaf in enumerate(self.leaves):
            if structural_equal(leaf, expr, map_free_vars=False):  # two buffers alike are two leaves
                return i
        values = _leaf_values(expr)
        if values is None or len(self.leaves) == MAX_LEAVES or self.points * len(values) > MAX_POINTS:
            return None
        self.leaves.append(expr)
        self.values.append(values)
        return len(self.leaves) - 1

    def grid(self, i: int) -> np.ndarray:
        shape = [1] * MAX_LEAVES
        shape[i] = -1
        return self.values[i].reshape(shape)

    @property
    def points(self) -> int:
        return int(np.prod([len(v) for v in self.values])) if self.values else 1


def _evaluate(expr, domain: _Domain):
    """``expr`` over the domain's grid, as the built code computes it (None: not finite)."""
    constant = float_constant(expr)
    if constant is not None:
        return np.float32(constant)
    axis = domain.axis(expr) if not isinstance(expr, tirx.Broadcast) else None
    if axis is not None:
        return domain.grid(axis)
    fenced = fence_argument(expr)
    if fenced is not None:
        return _evaluate(fenced, domain)
    if isinstance(expr, tirx.Broadcast):
        return _evaluate(expr.value, domain)
    if isinstance(expr, tirx.Cast) and _scalar(expr_dtype(expr)) == "float32":
        inner = _evaluate(expr.value, domain)
        return None if inner is None else np.asarray(inner).astype(np.float32)
    op = _OPS.get(type(expr))
    if op is None or _scalar(expr_dtype(expr)) != "float32":
        return None
    a, b = _evaluate(expr.a, domain), _evaluate(expr.b, domain)
    if a is None or b is None:
        return None
    with np.errstate(all="ignore"):
        return op(np.float32(a) if np.isscalar(a) else a, b).astype(np.float32)


def _terms(x) -> int | None:
    """How many constant factors `_distributed` folds in ``x`` (None: a term without one)."""
    if isinstance(x, (tirx.Add, tirx.Sub)):
        a, b = _terms(x.a), _terms(x.b)
        return None if a is None or b is None else a + b
    if float_constant(x) is not None:
        return 1
    product = fence_argument(x)
    product = x if product is None else product
    if isinstance(product, tirx.Mul) and (float_constant(product.a) is not None or float_constant(product.b) is not None):
        return 1
    return None


def _folded(k: float, c: float, nudge: int) -> float:
    """RN(k / c), moved ``nudge`` float32 steps (a neighbour may round every point as the
    division does where the nearest does not)."""
    value = np.float32(k) / np.float32(c)
    for _ in range(abs(nudge)):
        value = np.nextafter(value, np.float32(np.inf if nudge > 0 else -np.inf), dtype=np.float32)
    return float(value)


def _distributed(x, c: float, nudges: list):
    """``x / c`` with ``1 / c`` folded into each term's constant factor (the next of
    ``nudges`` steps away from the nearest), the sums kept in their order."""
    if isinstance(x, (tirx.Add, tirx.Sub)):
        a = _distributed(x.a, c, nudges)
        return type(x)(a, _distributed(x.b, c, nudges))
    constant = float_constant(x)
    if constant is not None:
        return constant_like(x, _folded(constant, c, nudges.pop(0)))
    product = fence_argument(x)
    product = x if product is None else product
    term, factor = (product.a, product.b) if float_constant(product.b) is not None else (product.b, product.a)
    folded = constant_like(factor, _folded(float_constant(factor), c, nudges.pop(0)))
    return fenced(term * folded)


def _distributed_forms(x, c: float):
    """Every distributed form of ``x / c`` with each folded constant the nearest or one step
    either side (the nearest first), while there are at most `MAX_FOLDED` of them."""
    n = _terms(x)
    if n is None or n > MAX_FOLDED:
        return
    for nudges in itertools.product((0, -1, 1), repeat=n):
        yield _distributed(x, c, list(nudges))


def _reciprocal(x, c: float, y: float):
    return fenced(x * constant_like(x, y))


def proven_quotient(call, signed_zero: bool = False):
    """``round(x / c)`` (float32, ``c`` a constant, ``x`` finite-domain) as ``round`` of the
    cheapest form of the module's docstring that rounds as the division does on every value
    of ``x``; else ``call`` itself. ``signed_zero``: a zero result's sign must agree too."""
    if call_name(call) != "tirx.round" or not isinstance(call.args[0], tirx.Div):
        return call
    x, c = call.args[0].a, float_constant(call.args[0].b)
    y = reciprocal(c) if c is not None else None
    if y is None or _scalar(expr_dtype(x)) != "float32":
        return call
    domain = _Domain()
    values = _evaluate(x, domain)
    if values is None or not domain.leaves:
        return call
    with np.errstate(all="ignore"):
        wanted = np.rint(values / np.float32(c))
    for form in itertools.chain(_distributed_forms(x, c), [_reciprocal(x, c, y)]):
        if _agrees(_evaluate(form, domain), wanted, signed_zero):
            return tirx.round(form)
    return call


def _agrees(got, wanted, signed_zero: bool) -> bool:
    if got is None:
        return False
    with np.errstate(all="ignore"):
        got = np.rint(np.broadcast_to(got, np.shape(wanted)))
    same = np.array_equal(got, wanted)
    return same and (not signed_zero or np.array_equal(np.signbit(got), np.signbit(wanted)))


__all__ = ["MAX_POINTS", "proven_quotient"]
