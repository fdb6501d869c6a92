"""Built-in model architectures, written with ``tvm.relax.frontend.nn``; nothing downloaded.

Each builder returns a Relax IRModule (not yet legalized) whose weights are parameters of
``forward``; the architectures are the published ones (layer counts, widths, strides), so the
PrimFuncs they legalize to are those a real deployment sees. Batch norm is folded into the
convolutions' bias, as an inference graph has it.
"""

from __future__ import annotations

from typing import Callable


def _nn():
    from tvm.relax.frontend import nn

    return nn


def _wrap(expr, name):
    nn = _nn()
    return nn.op.wrap_nested(expr, name)


def resnet50(batch: int = 1, image: int = 224, classes: int = 1000, dtype: str = "float32"):
    """ResNet-50 v1.5: 7x7 stem, max-pool, 3-4-6-3 bottlenecks (stride on the 3x3), FC."""
    nn = _nn()
    from tvm import relax

    class ConvAct(nn.Module):
        def __init__(self, cin, cout, k, stride=1, act=True):
            self.conv = nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2, bias=True, dtype=dtype)
            self.act = act

        def forward(self, x):
            y = self.conv(x)
            return nn.op.relu(y) if self.act else y

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            cout = width * 4
            self.a = ConvAct(cin, width, 1)
            self.b = ConvAct(width, width, 3, stride)
            self.c = ConvAct(width, cout, 1, act=False)
            self.down = ConvAct(cin, cout, 1, stride, act=False) if (stride != 1 or cin != cout) else None

        def forward(self, x):
            short = self.down(x) if self.down is not None else x
            return nn.op.relu(self.c(self.b(self.a(x))) + short)

    class ResNet50(nn.Module):
        def __init__(self):
            self.stem = ConvAct(3, 64, 7, 2)
            blocks, cin = [], 64
            for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(count):
                    blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
            self.blocks = nn.ModuleList(blocks)
            self.fc = nn.Linear(2048, classes, dtype=dtype)

        def forward(self, x):
            y = self.stem(x)
            y = _wrap(relax.op.nn.max_pool2d(y._expr, pool_size=(3, 3), strides=(2, 2),
                                             padding=(1, 1)), "maxpool")
            for blk in self.blocks:
                y = blk(y)
            y = _wrap(relax.op.mean(y._expr, axis=[2, 3]), "avgpool")
            return self.fc(y)

    spec = {"forward": {"x": nn.spec.Tensor((batch, 3, image, image), dtype)}}
    mod, _ = ResNet50().export_tvm(spec)
    return mod


def bert_base(batch: int = 1, seq: int = 128, layers: int = 12, hidden: int = 768, heads: int = 12,
              ffn: int = 3072, dtype: str = "float32"):
    """BERT-base encoder: 12 layers of self-attention (12 heads) and a 3072-wide GELU FFN."""
    nn = _nn()
    head = hidden // heads

    class Layer(nn.Module):
        def __init__(self):
            self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype)
            self.proj = nn.Linear(hidden, hidden, dtype=dtype)
            self.ln1 = nn.LayerNorm(hidden, dtype=dtype)
            self.up = nn.Linear(hidden, ffn, dtype=dtype)
            self.down = nn.Linear(ffn, hidden, dtype=dtype)
            self.ln2 = nn.LayerNorm(hidden, dtype=dtype)

        def forward(self, x):
            qkv = nn.op.reshape(self.qkv(x), (batch, seq, 3, heads, head))
            q, k, v = nn.op.split(qkv, 3, axis=2)
            q, k, v = (nn.op.permute_dims(nn.op.reshape(t, (batch, seq, heads, head)), [0, 2, 1, 3])
                       for t in (q, k, v))
            scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / float(head) ** 0.5
            ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
            ctx = nn.op.reshape(nn.op.permute_dims(ctx, [0, 2, 1, 3]), (batch, seq, hidden))
            x = self.ln1(x + self.proj(ctx))
            return self.ln2(x + self.down(nn.op.gelu(self.up(x))))

    class Bert(nn.Module):
        def __init__(self):
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    spec = {"forward": {"x": nn.spec.Tensor((batch, seq, hidden), dtype)}}
    mod, _ = Bert().export_tvm(spec)
    return mod


def mlp(batch: int = 16, sizes=(256, 512, 512, 128), dtype: str = "float32"):
    """A float MLP: Linear + ReLU layers (the last without ReLU)."""
    nn = _nn()

    class MLP(nn.Module):
        def __init__(self):
            self.layers = nn.ModuleList([nn.Linear(a, b, dtype=dtype) for a, b in zip(sizes, sizes[1:])])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i + 1 < len(self.layers):
                    x = nn.op.relu(x)
            return x

    mod, _ = MLP().export_tvm({"forward": {"x": nn.spec.Tensor((batch, sizes[0]), dtype)}})
    return mod


def mlp_int8(batch: int = 16, sizes=(256, 512, 512, 128)):
    """A quantized MLP as a quantized model has it: uint8 activations x int8 weights ->
    int32 accumulators, dequantized (per-channel scale, float bias), ReLU, requantized to
    uint8 (x 1/4, rounded, clipped to [0, 255]) for the next layer; float output."""
    nn = _nn()
    from tvm import relax

    class QLinear(nn.Module):
        def __init__(self, cin, cout):
            self.weight = nn.Parameter((cout, cin), "int8")
            self.scale = nn.Parameter((cout,), "float32")
            self.bias = nn.Parameter((cout,), "float32")

        def forward(self, x):
            acc = nn.op.matmul(x, nn.op.permute_dims(self.weight), out_dtype="int32")
            return nn.op.astype(acc, "float32") * self.scale + self.bias

    def requantize(y):
        q = relax.op.clip(relax.op.round(relax.op.multiply(y._expr, relax.const(0.25, "float32"))), 0, 255)
        return _wrap(relax.op.astype(q, "uint8"), "requantize")

    class QMLP(nn.Module):
        def __init__(self):
            self.layers = nn.ModuleList([QLinear(a, b) for a, b in zip(sizes, sizes[1:])])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                y = layer(x)
                if i + 1 == len(self.layers):
                    return y
                x = requantize(nn.op.relu(y))

    mod, _ = QMLP().export_tvm({"forward": {"x": nn.spec.Tensor((batch, sizes[0]), "uint8")}})
    return mod


MODELS: dict[str, Callable] = {"mlp": mlp, "mlp_int8": mlp_int8, "resnet50": resnet50,
                               "bert_base": bert_base}


def build_model(name: str):
    """A built-in model by name (Relax IRModule, not legalized)."""
    try:
        return MODELS[name]()
    except KeyError:
        raise KeyError(f"unknown built-in model {name!r}; known: {sorted(MODELS)}") from None
