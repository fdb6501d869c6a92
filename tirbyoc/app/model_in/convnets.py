"""The built-in convolutional networks (ResNet-18 / -50, MobileNetV2, a small CNN), written
with ``tvm.relax.frontend.nn``; `tirbyoc.app.model_in.models` registers them with the other built-ins.

The architectures are the published ones (layer counts, widths, strides); batch norm is folded
into the convolutions' bias, as an inference graph has it. Weights are parameters of
``forward``.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend import nn


def wrap(expr, name):
    """A Relax expression as a named ``nn`` tensor (an operator ``nn.op`` does not have)."""
    return nn.op.wrap_nested(expr, name)


def _summed_conv(layer, x, accumulate: str | None, dtype: str):
    """``layer`` (an nn.Conv2D) on ``x``, summed in ``accumulate`` and rounded once to ``dtype``
    before the bias (as cuDNN computes a float16 convolution); as the layer itself when None."""
    if accumulate is None:
        return layer(x)
    summed = relax.op.nn.conv2d(x._expr, layer.weight._expr, layer.stride, layer.padding, out_dtype=accumulate)
    bias = relax.op.reshape(layer.bias._expr, (1, -1, 1, 1))
    return wrap(relax.op.add(relax.op.astype(summed, dtype), bias), "conv2d")


def _summed_linear(layer, x, accumulate: str | None, dtype: str):
    """``layer`` (an nn.Linear) on ``x``, summed in ``accumulate`` (see `_summed_conv`)."""
    if accumulate is None:
        return layer(x)
    summed = relax.op.matmul(x._expr, relax.op.permute_dims(layer.weight._expr), out_dtype=accumulate)
    return wrap(relax.op.add(relax.op.astype(summed, dtype), layer.bias._expr), "matmul")


def _resnet(blocks_per_stage, bottleneck: bool, batch: int, image: int, classes: int, dtype: str,
            accumulate: str | None = None):
    """ResNet v1.5: 7x7 stem, max-pool, four stages (stride on the first block's 3x3), FC.
    ``accumulate``: the dtype each convolution and the FC sum in before rounding to ``dtype``
    (as `bert_base`'s)."""

    class ConvAct(nn.Module):
        def __init__(self, cin, cout, k, stride=1, act=True):
            self.conv = nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2, bias=True, dtype=dtype)
            self.act = act

        def forward(self, x):
            y = _summed_conv(self.conv, x, accumulate, dtype)
            return nn.op.relu(y) if self.act else y

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            cout = width * 4 if bottleneck else width
            if bottleneck:
                self.body = nn.ModuleList([ConvAct(cin, width, 1), ConvAct(width, width, 3, stride),
                                           ConvAct(width, cout, 1, act=False)])
            else:
                self.body = nn.ModuleList([ConvAct(cin, width, 3, stride), ConvAct(width, width, 3, act=False)])
            self.down = ConvAct(cin, cout, 1, stride, act=False) if (stride != 1 or cin != cout) else None
            self.cout = cout

        def forward(self, x):
            short = self.down(x) if self.down is not None else x
            y = x
            for layer in self.body:
                y = layer(y)
            return nn.op.relu(y + short)

    class ResNet(nn.Module):
        def __init__(self):
            self.stem = ConvAct(3, 64, 7, 2)
            blocks, cin = [], 64
            for width, count, stride in zip((64, 128, 256, 512), blocks_per_stage, (1, 2, 2, 2)):
                for i in range(count):
                    blocks.append(Block(cin, width, stride if i == 0 else 1))
                    cin = blocks[-1].cout
            self.blocks = nn.ModuleList(blocks)
            self.fc = nn.Linear(cin, classes, dtype=dtype)

        def forward(self, x):
            y = self.stem(x)
            y = wrap(relax.op.nn.max_pool2d(y._expr, pool_size=(3, 3), strides=(2, 2),
                                             padding=(1, 1)), "maxpool")
            for blk in self.blocks:
                y = blk(y)
            y = wrap(relax.op.mean(y._expr, axis=[2, 3]), "avgpool")
            return _summed_linear(self.fc, y, accumulate, dtype)

    spec = {"forward": {"x": nn.spec.Tensor((batch, 3, image, image), dtype)}}
    mod, _ = ResNet().export_tvm(spec)
    return mod


def resnet50(batch: int = 1, image: int = 224, classes: int = 1000, dtype: str = "float32",
             accumulate: str | None = None):
    """ResNet-50 v1.5: 3-4-6-3 bottleneck blocks (1x1, 3x3 with the stride, 1x1 x4)."""
    return _resnet((3, 4, 6, 3), True, batch, image, classes, dtype, accumulate)


def resnet50_fp16(batch: int = 1, image: int = 224):
    """ResNet-50 in float16 as a GPU runs it (PyTorch's ``model.half()``): half-precision
    weights and activations, each convolution summed in float32 and rounded once."""
    return resnet50(batch, image, dtype="float16", accumulate="float32")


def resnet18(batch: int = 1, image: int = 224, classes: int = 1000, dtype: str = "float32"):
    """ResNet-18: 2-2-2-2 basic blocks (two 3x3 convs)."""
    return _resnet((2, 2, 2, 2), False, batch, image, classes, dtype)


def mobilenet_v2(batch: int = 1, image: int = 224, classes: int = 1000, dtype: str = "float32"):
    """MobileNetV2 (width 1.0): 3x3 stem, 17 inverted residual blocks (1x1 expand, 3x3
    depthwise, 1x1 project; ReLU6), 1x1 conv to 1280, global pool, FC."""

    def relu6(y):
        return wrap(relax.op.clip(y._expr, 0, 6), "relu6")

    class ConvBN(nn.Module):
        def __init__(self, cin, cout, k, stride=1, groups=1, act=True):
            self.conv = nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2, groups=groups,
                                  bias=True, dtype=dtype)
            self.act = act

        def forward(self, x):
            y = self.conv(x)
            return relu6(y) if self.act else y

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            hidden = cin * expand
            self.expand = ConvBN(cin, hidden, 1) if expand != 1 else None
            self.depthwise = ConvBN(hidden, hidden, 3, stride, groups=hidden)
            self.project = ConvBN(hidden, cout, 1, act=False)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.expand(x) if self.expand is not None else x
            y = self.project(self.depthwise(y))
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        def __init__(self):
            self.stem = ConvBN(3, 32, 3, 2)
            blocks, cin = [], 32
            for t, c, n, st in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
                for i in range(n):
                    blocks.append(InvertedResidual(cin, c, st if i == 0 else 1, t))
                    cin = c
            self.blocks = nn.ModuleList(blocks)
            self.head = ConvBN(320, 1280, 1)
            self.fc = nn.Linear(1280, classes, dtype=dtype)

        def forward(self, x):
            y = self.stem(x)
            for blk in self.blocks:
                y = blk(y)
            y = wrap(relax.op.mean(self.head(y)._expr, axis=[2, 3]), "avgpool")
            return self.fc(y)

    spec = {"forward": {"x": nn.spec.Tensor((batch, 3, image, image), dtype)}}
    mod, _ = MobileNetV2().export_tvm(spec)
    return mod


def small_cnn(batch: int = 1, image: int = 32, classes: int = 10, dtype: str = "float32"):
    """A small CNN: three 3x3 / 1x1 conv + ReLU layers (one strided), global pool, FC."""

    class CNN(nn.Module):
        def __init__(self):
            self.c1 = nn.Conv2D(3, 32, 3, padding=1, dtype=dtype)
            self.c2 = nn.Conv2D(32, 64, 3, stride=2, padding=1, dtype=dtype)
            self.c3 = nn.Conv2D(64, 64, 1, dtype=dtype)
            self.fc = nn.Linear(64, classes, dtype=dtype)

        def forward(self, x):
            y = nn.op.relu(self.c3(nn.op.relu(self.c2(nn.op.relu(self.c1(x))))))
            return self.fc(wrap(relax.op.mean(y._expr, axis=[2, 3]), "avgpool"))

    mod, _ = CNN().export_tvm({"forward": {"x": nn.spec.Tensor((batch, 3, image, image), dtype)}})
    return mod


__all__ = ["mobilenet_v2", "resnet18", "resnet50", "resnet50_fp16", "small_cnn", "wrap"]
