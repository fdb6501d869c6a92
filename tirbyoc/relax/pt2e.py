"""PyTorch's PT2E quantized models in Relax: ``quantized_decomposed`` ops as Relax's
``quantize`` / ``dequantize``.

PyTorch's PT2E flow (``prepare_pt2e`` / ``convert_pt2e``, in ``torchao.quantization.pt2e``
since PyTorch 2.6) writes a quantized model as float ops between
``quantized_decomposed.quantize_per_tensor`` / ``dequantize_per_tensor`` (activations) and
``dequantize_per_channel`` (int8 weights, frozen as constants). TVM 0.27's PyTorch frontend
has no converter for them; `CONVERTERS` (its ``custom_convert_map``) gives it one per op, so a
PT2E model imports as the same QDQ graph an ONNX Runtime model does, and
`tirbyoc.relax.quantized.QuantizedToInteger` makes its chains integer the same way.

A narrower integer range than the dtype's (``quant_min`` / ``quant_max``, e.g. 7-bit
``reduce_range``) quantizes with a clip after, as PyTorch does. Per-channel scales and zero
points are tensors of the exported program (float and int64): they are cast to what Relax
takes, and `fold_constant_casts` folds those casts once the frontend has bound the constants,
so the chains' scales are constants the rewrite can read.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from tirbyoc._tvm import const_value

_DTYPES = {"torch.uint8": "uint8", "torch.int8": "int8", "torch.int16": "int16", "torch.int32": "int32"}
_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767), "int32": (-2 ** 31, 2 ** 31 - 1)}


def _dtype(node, index: int) -> str:
    found = _DTYPES.get(str(node.args[index]))
    if found is None:
        raise ValueError(f"{node.target}: quantized dtype {node.args[index]} is not supported "
                         f"(supported: {', '.join(_DTYPES)})")
    return found


def _as(importer, value, dtype: str):
    """A scale or zero point as a Relax expression of ``dtype``: a Python number as a
    constant, a tensor of the program cast."""
    if isinstance(value, (int, float)):
        return relax.const(value, dtype)
    return importer.block_builder.emit(relax.op.astype(importer.env[value], dtype))


def _quantize_per_tensor(node, importer):
    x, scale, zero_point, lo, hi = (node.args[0], *node.args[1:5])
    dtype = _dtype(node, 5)
    q = importer.block_builder.emit(relax.op.quantize(importer.env[x], _as(importer, scale, "float32"),
                                                      _as(importer, zero_point, dtype), -1, dtype))
    if (int(lo), int(hi)) != _RANGE[dtype]:
        q = importer.block_builder.emit(relax.op.clip(q, int(lo), int(hi)))
    return q


def _dequantize_per_tensor(node, importer):
    dtype = _dtype(node, 5)
    return importer.block_builder.emit(relax.op.dequantize(
        importer.env[node.args[0]], _as(importer, node.args[1], "float32"), _as(importer, node.args[2], dtype),
        -1, "float32"))


def _dequantize_per_channel(node, importer):
    dtype = _dtype(node, 6)
    return importer.block_builder.emit(relax.op.dequantize(
        importer.env[node.args[0]], _as(importer, node.args[1], "float32"), _as(importer, node.args[2], dtype),
        int(node.args[3]), "float32"))


CONVERTERS = {
    "quantize_per_tensor.default": _quantize_per_tensor,
    "dequantize_per_tensor.default": _dequantize_per_tensor,
    "dequantize_per_channel.default": _dequantize_per_channel,
}


@mutator
class _FoldCasts(PyExprMutator):
    """``astype(constant)`` -> the cast constant."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        value = const_value(call.args[0]) if getattr(call.op, "name", "") == "relax.astype" else None
        if value is None:
            return call
        return relax.const(value.astype(str(call.attrs.dtype)))


def fold_constant_casts(mod):
    """``mod`` with every cast of a constant folded (not TVM's FoldConstant: that would also
    fold the weights' dequantize into float weights, which the integer rewrite reads)."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _FoldCasts().visit_expr(func)
    return mod


__all__ = ["CONVERTERS", "fold_constant_casts"]
