"""How an integer core's accumulators come back to the next layer's quantization.

`QuantizedToInteger` rewrites ``quantize(relu?(core + bias), sy, zy)`` with ``core`` an
integer conv or matmul whose int32 accumulators ``acc`` (zero points already corrected) stand
for ``acc * scale`` per output channel. The tail is one of:

- **float** (ONNX's semantics exactly): ``quantize(relu?(acc * scale + bias), sy, zy)``, its
  rounding half to even; TVM lowers it to float arithmetic (a CPU's vector unit, an
  accelerator's host);
- **shift** (an accelerator's integer ALU, VTA's): where ``scale / sy`` is one power of two
  ``2^-k`` for every channel and the bias a whole number of ``scale`` steps (ONNX Runtime
  quantizes a bias to int32 at exactly that scale),
  ``clip(((acc + bias_q + 2^(k-1)) >> k) + zy, lo, hi)`` in int32: an add, a shift and a clip,
  the operations such an ALU runs on the accumulator tile before a narrowing store. It rounds
  ties up, as VTA does, where ONNX rounds them to even: an accumulator exactly half way between
  two steps (one value in ``2^k``) can come out one step above the QDQ graph's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

ACT_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}  # the 8-bit activation dtypes, their ranges
REQUANTIZE = ("float", "shift")


@dataclass(frozen=True, eq=False)
class Dequantization:
    """What a core's int32 accumulator stands for: ``relu?(acc * scale + bias)``, ``scale`` and
    ``bias`` (or None) per output channel, broadcast to ``shape``."""

    scale: np.ndarray
    shape: tuple
    bias: np.ndarray | None = None
    relu: bool = False


@dataclass(frozen=True, eq=False)
class OutputQuantization:
    """The QuantizeLinear after a chain: its scale and zero point (Relax expressions), axis and
    integer dtype."""

    scale: object
    zero_point: object
    axis: int
    dtype: str


def float_requantize(acc, deq: Dequantization, out: OutputQuantization | None = None):
    """``quantize(relu?(acc * scale + bias), out)`` (``out`` None: the float value)."""
    real = relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(deq.scale.reshape(deq.shape), "float32"))
    if deq.bias is not None:
        bias = np.broadcast_to(deq.bias, (deq.scale.size,)).reshape(deq.shape)
        real = relax.op.add(real, relax.const(bias, "float32"))
    if deq.relu:
        real = relax.op.nn.relu(real)
    if out is None:
        return real
    return relax.op.quantize(real, out.scale, out.zero_point, out.axis, out.dtype)


def shift_exponent(scale: np.ndarray, sy: float) -> int | None:
    """``k`` where ``scale / sy`` is ``2^-k`` (k >= 0) for every channel, else None."""
    ratio = scale.astype(np.float64) / float(sy)
    k = -np.log2(ratio)
    if not np.all(np.isfinite(k)) or np.any(np.abs(k - np.round(k)) > 1e-9) or len(set(np.round(k))) != 1:
        return None
    k0 = int(np.round(k.flat[0]))
    return k0 if k0 >= 0 else None


def shift_requantize(acc, deq: Dequantization, sy, zy, out_dtype: str):
    """(the shift tail, None) or (None, why it cannot be one); ``sy``, ``zy``: the output's
    scale and zero point as numpy scalars."""
    scale, shape, bias, relu = deq.scale, deq.shape, deq.bias, deq.relu
    if out_dtype not in ACT_RANGE:
        return None, f"the output is quantized to {out_dtype}"
    if sy.size != 1 or zy.size != 1:
        return None, "the output scale or zero point is not one value"
    k = shift_exponent(scale, float(sy.reshape(())))
    if k is None:
        return None, "the requantization scale is not a power of two (no shift computes it)"
    offset = np.zeros(scale.size, np.int64)
    if bias is not None:
        steps = np.broadcast_to(bias, (scale.size,)).astype(np.float64) / scale.astype(np.float64)
        if np.any(np.abs(steps - np.round(steps)) > 1e-3):
            return None, "the bias is not a whole number of accumulator steps"
        offset = np.round(steps).astype(np.int64)
    if k:
        offset = offset + (1 << (k - 1))
    out = acc
    if np.any(offset != 0):
        const = offset.astype(np.int32)
        out = relax.op.add(out, relax.const(const.reshape(shape) if np.any(const != const[0]) else const[0], "int32"))
    if k:
        out = relax.op.right_shift(out, relax.const(k, "int32"))
    zero = int(zy.reshape(()))
    if zero:
        out = relax.op.add(out, relax.const(zero, "int32"))
    lo, hi = ACT_RANGE[out_dtype]
    return relax.op.astype(relax.op.clip(out, max(lo, zero) if relu else lo, hi), out_dtype), None


__all__ = ["ACT_RANGE", "REQUANTIZE", "Dequantization", "OutputQuantization", "float_requantize", "shift_exponent",
           "shift_requantize"]
