"""Max pooling on quantized values: ``quantize(max_pool(dequantize(x_q, s, z)), s', z')``
becomes ``max_pool(x_q)``, requantized only where ``(s', z')`` differ from ``(s, z)``.

A QDQ model pools in float between a dequantize and a quantize (ResNet's stem: conv ->
quantize -> dequantize -> max pool -> quantize). Kept so, the producer writes its output in
float32 (four times the bytes), the pool reads it back, and the requantization after it is a
pass of its own; ONNX Runtime pools the 8-bit values (``NhwcMaxPool`` on uint8). Pooling the
integers is exact, for three reasons:

* ``dequantize`` with ``s > 0`` and ``quantize`` are non-decreasing, and a maximum commutes
  with a non-decreasing function: ``max(f(a), f(b)) = f(max(a, b))``;
* the padding: in float it is the lowest float32, which never wins; in integers it is the
  dtype's minimum, which wins only where every real value is that minimum too - and
  the window always holds at least one real value (TVM's pooling pads less than the window);
* with equal ``(s, z)``, ``quantize(dequantize(q)) = q``: ``((q - z) * s) / s`` is within one
  float32 rounding of the integer ``q - z`` (``|q - z| <= 255``), so it rounds back to it.

Only per-tensor (scalar, constant) scales and zero points are taken; anything else stays as
the model has it.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from tirbyoc._tvm import const_value


class _PoolPattern:
    """``quantize(max_pool2d(dequantize(x, s, z)), s2, z2)`` with constant parameters."""

    def __init__(self):
        self.x, self.s, self.z, self.s2, self.z2 = wildcard(), is_const(), is_const(), is_const(), is_const()
        self.dq = is_op("relax.dequantize")(self.x, self.s, self.z)
        self.pool = is_op("relax.nn.max_pool2d")(self.dq)
        self.root = is_op("relax.quantize")(self.pool, self.s2, self.z2)


def _scalar(expr) -> float | None:
    value = const_value(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def _dtype(expr) -> str | None:
    """An expression's tensor dtype (a call an earlier rewrite made has no type until normalized)."""
    ty = getattr(expr, "ty", None)
    if ty is None:
        ty = relax.BlockBuilder().normalize(expr).ty
    return str(getattr(ty, "dtype", None))


def _pooled(call, m: dict, p: _PoolPattern, done: list):
    """The rewritten quantize ``call``, or ``call`` itself where the pattern's facts fail."""
    s, z, s2, z2 = (_scalar(m[k]) for k in (p.s, p.z, p.s2, p.z2))
    x = m[p.x]
    dtype = _dtype(x)
    if None in (s, z, s2, z2) or s <= 0 or not np.isfinite(s) or dtype not in ("uint8", "int8"):
        return call
    pool = m[p.pool]
    pooled = relax.Call(pool.op, [x], pool.attrs)
    out_dtype = str(call.attrs.out_dtype)
    done.append(f"max_pool2d {'x'.join(str(int(d)) for d in pool.attrs.pool_size)} on {dtype}")
    if (s, z, out_dtype) == (s2, z2, dtype):
        return pooled
    dq = m[p.dq]
    back = relax.op.dequantize(pooled, dq.args[1], dq.args[2], int(dq.attrs.axis), str(dq.attrs.out_dtype))
    return relax.op.quantize(back, call.args[1], call.args[2], int(call.attrs.axis), out_dtype)


def integer_max_pools(func, done: list):
    """``func`` (a Relax function) with its quantized max pools on the integers; ``done``
    receives one line per pool rewritten."""
    p = _PoolPattern()
    return rewrite_call(p.root, lambda call, m: _pooled(call, m, p, done), func)


__all__ = ["integer_max_pools"]
