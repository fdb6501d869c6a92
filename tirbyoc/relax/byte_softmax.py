"""`byte_softmaxes`: a softmax over dequantized bytes with its ``exp`` as a 256 x 256 table,
computed once by TVM's build of the same expression.

A QDQ transformer's attention scores reach the softmax as ``x = dequantize(q, s, z)``, ``q``
a byte. TVM computes ``exp(x_j - max_k x_k)`` with one scalar libm ``expf`` per score: at BERT-
base's 128 tokens, 196,608 calls a layer, the softmax's whole cost. For ``s > 0`` dequantizing
is monotonic, so ``max_k x_k = x(max_k q_k)`` exactly, and each exponential is a function of
two bytes:

    exp(x_j - max x) = E[max q][q_j],    E[b][a] = exp(dequantize(a) - dequantize(b))

This module rewrites ``quantize(softmax(dequantize(q)))`` (Relax, before legalization) into
one function of ``q`` (fused with the quantize after it, as TVM fuses a softmax)

    m = max(q, axis=-1)                  # over the bytes
    e = E[m][q]                          # one lookup a score
    p = e / sum(e, axis=-1)              # the sum in TVM's order: the same float32 rounding
    y = quantize(p)

with ``E`` computed by TVM's build, for the model's target, of ``exp(dequantize(a) -
dequantize(b))`` over all 65,536 pairs: every value is what TVM's build of the softmax computes,
bit for bit (the model's verification checks it end to end). A softmax over another axis, a
scale that is not a positive scalar constant, or a softmax's input that is not a dequantized
byte is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax, te

from tirbyoc._tvm import const_value
from tirbyoc.relax.byte_chains import is_byte
from tirbyoc.relax.lookups import all_bytes, as_lookup, bits

OUT_ELEMWISE_FUSABLE = 4  # TVM's operator pattern for the softmax (as for its own): the quantize joins it


def _call_named(expr, name: str):
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == name


def _positive_scalar(expr) -> bool:
    value = const_value(expr)
    return value is not None and value.size == 1 and float(value.reshape(())) > 0


@dataclass(frozen=True)
class _Softmax:
    """One ``y = quantize(softmax(dequantize(q)))`` of a function: ``y``, and the two calls
    the rewrite reuses (the softmax itself is replaced whole)."""

    root: relax.Var
    quantize: relax.Call
    dequantize: relax.Call

    @property
    def source(self):
        return self.dequantize.args[0]


def byte_softmaxes(func) -> list[_Softmax]:
    """The quantized softmaxes of ``func`` (a Relax function) over dequantized bytes."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    value = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    found = []
    for var, q in value.items():
        if not _call_named(q, "relax.quantize") or not is_byte(var):
            continue
        sm = value.get(q.args[0])
        if not _call_named(sm, "relax.nn.softmax"):
            continue
        d = value.get(sm.args[0])
        rank = len(sm.args[0].ty.shape)
        if not _call_named(d, "relax.dequantize") or int(sm.attrs.axis) not in (-1, rank - 1):
            continue
        if is_byte(d.args[0]) and _positive_scalar(d.args[1]) and const_value(d.args[2]) is not None:
            found.append(_Softmax(var, q, d))
    return found


def pair_function(sm: _Softmax) -> relax.Function:
    """``exp(dequantize(a) - dequantize(b))`` over a row of 256 ``a`` and a column of 256 ``b``
    (`pair_inputs`), as ``[256 b, 256 a]``."""
    deq, dtype, rank = sm.dequantize, str(sm.source.ty.dtype), _rank(sm)
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1,) * (rank - 1) + (256,), dtype))
    b = relax.Var("b", relax.TensorType((1,) * (rank - 2) + (256, 1), dtype))
    with bb.function("pairs", [a, b]):
        with bb.dataflow():
            da = bb.emit(relax.Call(deq.op, [a, *deq.args[1:]], deq.attrs))
            db = bb.emit(relax.Call(deq.op, [b, *deq.args[1:]], deq.attrs))
            e = bb.emit(relax.op.exp(bb.emit(relax.op.subtract(da, db))))
            out = bb.emit_output(relax.op.reshape(e, (256, 256)))
        bb.emit_func_output(out)
    return bb.get()["pairs"]


def _rank(sm: _Softmax) -> int:
    return max(2, len(sm.source.ty.shape))


def pair_inputs(sm: _Softmax) -> list[np.ndarray]:
    """`pair_function`'s inputs: every byte as a row, and as a column."""
    values, rank = all_bytes(str(sm.source.ty.dtype)), _rank(sm)
    return [values.reshape((1,) * (rank - 1) + (256,)), values.reshape((1,) * (rank - 2) + (256, 1))]


def _softmax_compute(table, q):
    """The softmax of ``q``'s dequantized bytes along the last axis, its exponentials from
    ``table``: the largest byte of each row, each score's ``table[largest][byte]``, their sum
    in TVM's order (a ``te.sum`` as topi's softmax has), each exponential divided by it."""
    *lead, n = q.shape
    k = te.reduce_axis((0, n), name="k")
    largest = te.compute(lead, lambda *i: te.max(q(*i, k), axis=k), name="byte_softmax_max")
    e = te.compute(q.shape, lambda *i: table(bits(largest(*i[:-1])), bits(q(*i))), name="byte_softmax_exp")
    j = te.reduce_axis((0, n), name="j")
    total = te.compute(lead, lambda *i: te.sum(e(*i, j), axis=j), name="byte_softmax_expsum")
    return te.compute(q.shape, lambda *i: e(*i) / total(*i[:-1]), name="byte_softmax")


def softmax_of_bytes(builder, sm: _Softmax, table: np.ndarray, q) -> relax.Expr:
    """``sm``'s output from ``q`` (the dequantized bytes) and its pair ``table``: one function
    (`_softmax_compute`, fused as TVM fuses a softmax: with the quantize after it), then the
    model's own quantize; emitted into ``builder``."""
    call = builder.call_te(_softmax_compute, relax.const(table), q, primfunc_name_hint="byte_softmax")
    p = builder.emit(as_lookup(builder, call, OUT_ELEMWISE_FUSABLE))
    return relax.Call(sm.quantize.op, [p, *sm.quantize.args[1:]], sm.quantize.attrs)


__all__ = ["byte_softmaxes", "pair_function", "pair_inputs", "softmax_of_bytes"]
