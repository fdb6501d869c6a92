"""A Llama-style decoder layer as ONNX, in the two files a serving export writes.

An LLM exporter (optimum, ONNX Runtime GenAI) writes a decoder twice: a prefill model that
takes the prompt and returns each layer's keys and values (``present``), and a decode model
that also takes them back (``past``) and returns them grown by the new tokens, with ``batch``,
``seq`` and ``past`` as named dimensions. `float_llama_layer` writes one layer of either kind:
RMSNorm, q / k / v projections, rotary position embedding (the positions' cos / sin tables are
inputs of ``seq`` rows, as a serving stack precomputes them), multi-head attention over the
past and new positions (no mask: every position attends to every other, as the built-in
``llama_layer`` does - the mask a causal prefill adds is one elementwise add), the output
projection and a residual, RMSNorm, a SiLU-gated MLP (gate, up, down) and a residual. Random
weights with He-like scales; the sizes default to a 1B-class model's layer (hidden 2048, 16
heads of 128, MLP 5632: 51 M weights, 206 MB in float32).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tirbyoc.testing.qdq import OnnxGraph, onnx_modules


@dataclass(frozen=True)
class DecoderSize:
    """A decoder layer's sizes (a 1B-class model's by default)."""

    hidden: int = 2048
    heads: int = 16
    ffn: int = 5632

    @property
    def head(self) -> int:
        return self.hidden // self.heads

    @property
    def weights(self) -> int:
        """Multiply-add weights of the layer (the projections and the MLP)."""
        return 4 * self.hidden * self.hidden + 3 * self.hidden * self.ffn


def _rms_norm(g: OnnxGraph, x: str, dim: int) -> str:
    """x / sqrt(mean(x^2) + eps) * gamma over the last axis (opset 17's ReduceMean)."""
    mean = g.node("ReduceMean", [g.node("Mul", [x, x])], axes=[-1], keepdims=1)
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, g.const(np.float32(1e-6), "eps")])])])
    return g.node("Mul", [g.node("Mul", [x, inv]), g.const(np.ones(dim, "float32"), "gamma")])


def _weight(g: OnnxGraph, n_in: int, n_out: int) -> str:
    return g.const(g.rng.normal(0, n_in ** -0.5, (n_in, n_out)).astype("float32"), "w")


def _rotary(g: OnnxGraph, t: str, half: int) -> str:
    """Rotary embedding of [batch, heads, seq, head] by the [seq, head / 2] tables."""
    halves = g.const(np.array([half, half], np.int64), "halves")
    first, second = (g.name("split") for _ in range(2))
    g.nodes.append(g.helper.make_node("Split", [t, halves], [first, second], axis=-1))
    rotated = [g.node("Sub", [g.node("Mul", [first, "cos"]), g.node("Mul", [second, "sin"])]),
               g.node("Add", [g.node("Mul", [first, "sin"]), g.node("Mul", [second, "cos"])])]
    return g.node("Concat", rotated, axis=-1)


def _attention(g: OnnxGraph, h: str, size: DecoderSize, with_past: bool) -> tuple[str, str, str]:
    """(the attention's output [batch, seq, hidden], present keys, present values)."""
    split = g.const(np.array([0, 0, size.heads, size.head], np.int64), "shape")

    def per_head(name: str | None = None) -> str:  # [batch, seq, hidden] -> [batch, heads, seq, head]
        return g.node("Transpose", [g.node("Reshape", [g.node("MatMul", [h, _weight(g, size.hidden, size.hidden)]),
                                                       split])], perm=[0, 2, 1, 3])

    q, k, v = _rotary(g, per_head(), size.head // 2), _rotary(g, per_head(), size.head // 2), per_head()
    if with_past:
        k, v = g.node("Concat", ["past_k", k], axis=2), g.node("Concat", ["past_v", v], axis=2)
    scores = g.node("Mul", [g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])]),
                            g.const(np.float32(size.head ** -0.5), "scale")])
    ctx = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    merge = g.const(np.array([0, 0, size.hidden], np.int64), "shape")
    ctx = g.node("Reshape", [g.node("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
    return g.node("MatMul", [ctx, _weight(g, size.hidden, size.hidden)]), k, v


def float_llama_layer(path, size: DecoderSize | None = None, *, with_past: bool = True, seed: int = 0,
                      **changes) -> Path:
    """One decoder layer as ONNX (see the module's docstring): inputs ``x`` [batch, seq,
    hidden], ``cos`` / ``sin`` [seq, head / 2] and, ``with_past`` (the decode model),
    ``past_k`` / ``past_v`` [batch, heads, past, head]; outputs ``y`` [batch, seq, hidden] and
    ``present_k`` / ``present_v`` [batch, heads, past + seq, head] (named ``total``; without past:
    seq).
    ``size`` (`DecoderSize`) with ``changes`` applied gives the sizes."""
    sz = replace(size or DecoderSize(), **changes)
    onnx, tp, helper, _ = onnx_modules()
    g = OnnxGraph(seed)
    attn, k, v = _attention(g, _rms_norm(g, "x", sz.hidden), sz, with_past)
    x1 = g.node("Add", ["x", attn])
    h = _rms_norm(g, x1, sz.hidden)
    gate, up = (g.node("MatMul", [h, _weight(g, sz.hidden, sz.ffn)]) for _ in range(2))
    silu = g.node("Mul", [gate, g.node("Sigmoid", [gate])])
    y = g.node("Add", [x1, g.node("MatMul", [g.node("Mul", [silu, up]), _weight(g, sz.ffn, sz.hidden)])])
    g.nodes += [helper.make_node("Identity", [y], ["y"]), helper.make_node("Identity", [k], ["present_k"]),
                helper.make_node("Identity", [v], ["present_v"])]

    def value(name, shape):
        return helper.make_tensor_value_info(name, tp.FLOAT, shape)

    cache = ["batch", sz.heads, "past", sz.head]
    total = "total" if with_past else "seq"  # past + seq: a name of its own, as exporters write it
    inputs = [value("x", ["batch", "seq", sz.hidden]), value("cos", ["seq", sz.head // 2]),
              value("sin", ["seq", sz.head // 2])] + ([value("past_k", cache), value("past_v", cache)] if with_past else [])
    outputs = [value("y", ["batch", "seq", sz.hidden]), value("present_k", ["batch", sz.heads, total, sz.head]),
               value("present_v", ["batch", sz.heads, total, sz.head])]
    graph = helper.make_graph(g.nodes, "llama_layer", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return Path(path)


__all__ = ["DecoderSize", "float_llama_layer"]
