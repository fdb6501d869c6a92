"""A Llama-style decoder layer with a sequence length known only at run time (a built-in).

`llama_layer` is what a language model's prefill runs per layer, written with
`relax.frontend.nn` and exported with its sequence length as the size variable ``seq``:
RMSNorm, rotary position embedding (the cos / sin tables of the positions are inputs of
``seq`` rows, as a serving stack precomputes them), multi-head self-attention over the whole
sequence (no causal mask: each position attends to all), a residual, RMSNorm and a SiLU-gated
MLP (gate, up, down), a residual. Random weights; `SIZES` are the lengths `tirbyoc run` runs it
at when no ``--size`` is given.
"""

from __future__ import annotations

SIZES = {"seq": (1, 17, 128)}


def llama_layer(hidden: int = 256, heads: int = 4, ffn: int = 688, dtype: str = "float32"):
    """One decoder layer (hidden 256, 4 heads of 64, SiLU MLP 688 wide), ``seq`` symbolic."""
    from tvm.relax.frontend import nn  # deferred: TVM's frontend, imported when a model is built

    head = hidden // heads

    def rotate(t, cos, sin, seq):
        """Rotary embedding of [1, seq, heads, head] by the [seq, head / 2] tables."""
        first, second = nn.op.split(t, 2, axis=-1)
        cos, sin = (nn.op.reshape(x, (1, seq, 1, head // 2)) for x in (cos, sin))
        return nn.op.concat([first * cos - second * sin, first * sin + second * cos], dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            self.norm1 = nn.RMSNorm(hidden, axes=-1, bias=False, dtype=dtype)
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False, dtype=dtype) for _ in range(4))
            self.norm2 = nn.RMSNorm(hidden, axes=-1, bias=False, dtype=dtype)
            self.gate = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
            self.up = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
            self.down = nn.Linear(ffn, hidden, bias=False, dtype=dtype)

        def forward(self, x, cos, sin):
            seq = x.shape[1]
            h = self.norm1(x)
            q, k, v = (nn.op.reshape(proj(h), (1, seq, heads, head)) for proj in (self.q, self.k, self.v))
            q, k = rotate(q, cos, sin, seq), rotate(k, cos, sin, seq)
            q, k, v = (nn.op.permute_dims(t, [0, 2, 1, 3]) for t in (q, k, v))
            scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / float(head) ** 0.5
            ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
            x = x + self.o(nn.op.reshape(nn.op.permute_dims(ctx, [0, 2, 1, 3]), (1, seq, hidden)))
            h = self.norm2(x)
            return x + self.down(nn.op.silu(self.gate(h)) * self.up(h))

    spec = {"forward": {"x": nn.spec.Tensor((1, "seq", hidden), dtype),
                        "cos": nn.spec.Tensor(("seq", head // 2), dtype),
                        "sin": nn.spec.Tensor(("seq", head // 2), dtype)}}
    mod, _ = Layer().export_tvm(spec)
    return mod


llama_layer.sizes = SIZES

__all__ = ["SIZES", "llama_layer"]
