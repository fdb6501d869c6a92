"""Small quantized (QDQ) ONNX models, the way users' quantizers write them, for tests and
benchmarks: written by hand with ``onnx.helper`` (every scale and zero point chosen), or made
from a float model by ONNX Runtime's own static quantizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


def onnx_modules():
    # deferred: optional dependency (onnx)
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def _save(path, name: str, nodes, inits, x_shape, y_shape) -> Path:
    """A one-input ("x"), one-output ("y") float graph saved as an opset-17 ONNX model."""
    onnx, tp, helper, _ = onnx_modules()
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", tp.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", tp.FLOAT, list(y_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return Path(path)


def float_cnn(path, *, seed: int = 0, channels: int = 16, size: int = 8, classes: int = 10) -> Path:
    """conv3x3(pad 1) + bias -> relu -> conv3x3 -> relu -> flatten -> matmul + bias: a float
    ONNX model to quantize."""
    _, _, helper, nh = onnx_modules()
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return nh.from_array(rng.normal(0, scale, shape).astype("float32"), name)

    inits = [init("w1", (channels, 3, 3, 3), 0.3), init("b1", (channels,), 0.1),
             init("w2", (channels, channels, 3, 3), 0.1), init("b2", (channels,), 0.1),
             init("w3", (channels * size * size, classes), 0.05), init("b3", (classes,), 0.1),
             nh.from_array(np.array([1, -1], dtype=np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Reshape", ["r2", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "w3"], ["m"]),
             helper.make_node("Add", ["m", "b3"], ["y"])]
    return _save(path, "cnn", nodes, inits, [1, 3, size, size], [1, classes])


def float_depthwise(path, *, seed: int = 0, channels: int = 8, size: int = 8, classes: int = 10) -> Path:
    """conv3x3 -> relu -> depthwise conv3x3 (stride 2) + bias -> relu -> flatten -> Gemm
    (transB=1) + bias: the mobile-network shapes (grouped conv, a transposed classifier)."""
    _, _, helper, nh = onnx_modules()
    rng = np.random.default_rng(seed)
    half = size // 2
    inits = [nh.from_array(rng.normal(0, .3, (channels, 3, 3, 3)).astype("float32"), "w1"),
             nh.from_array(rng.normal(0, .3, (channels, 1, 3, 3)).astype("float32"), "wd"),
             nh.from_array(rng.normal(0, .1, (channels,)).astype("float32"), "bd"),
             nh.from_array(rng.normal(0, .05, (classes, channels * half * half)).astype("float32"), "wg"),
             nh.from_array(rng.normal(0, .1, (classes,)).astype("float32"), "bg")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd", "bd"], ["c2"], pads=[1, 1, 1, 1], group=channels,
                              strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1)]
    return _save(path, "mobile", nodes, inits, [1, 3, size, size], [1, classes])


def float_resnet18(path, *, seed: int = 0, size: int = 224, classes: int = 1000, width: int = 64) -> Path:
    """ResNet-18's graph as ONNX (batch 1, ``size`` x ``size``; batch norms folded into the
    convolutions' biases, as an exported inference model has them): a 7x7/2 stem and max pool,
    four stages of two basic blocks (3x3 convs, 1x1/2 projections), global average pool, a
    Gemm classifier. Weights He-initialised, so activations stay O(1) for calibration."""
    _, _, helper, nh = onnx_modules()
    rng = np.random.default_rng(seed)
    inits, nodes, counter = [], [], iter(range(10 ** 6))

    def conv(x, cin, cout, k, stride, relu):
        i = next(counter)
        inits.extend([nh.from_array(rng.normal(0, (2 / (cin * k * k)) ** 0.5, (cout, cin, k, k)).astype("float32"), f"w{i}"),
                      nh.from_array(rng.normal(0, 0.05, (cout,)).astype("float32"), f"b{i}")])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[k // 2] * 4,
                                      strides=[stride, stride]))
        if not relu:
            return f"c{i}"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    def block(x, cin, cout, stride):
        y = conv(conv(x, cin, cout, 3, stride, True), cout, cout, 3, 1, False)
        skip = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, False)
        i = next(counter)
        nodes.extend([helper.make_node("Add", [y, skip], [f"a{i}"]), helper.make_node("Relu", [f"a{i}"], [f"o{i}"])])
        return f"o{i}"

    x = conv("x", 3, width, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", width
    for stage, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
        x = block(x, cin, cout, 1 if stage == 0 else 2)
        x, cin = block(x, cout, cout, 1), cout
    inits.extend([nh.from_array(rng.normal(0, cin ** -0.5, (classes, cin)).astype("float32"), "fc_w"),
                  nh.from_array(np.zeros(classes, "float32"), "fc_b")])
    nodes.extend([helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]),
                  helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1)])
    return _save(path, "resnet18", nodes, inits, [1, 3, size, size], [1, classes])


def float_transformer(path, *, seed: int = 0, seq: int = 16, dim: int = 64, hidden: int = 128) -> Path:
    """One single-head encoder layer as ONNX: q, k, v projections, softmax(q.k^T / sqrt(d)).v,
    an output projection, a residual, a ReLU feed-forward and a second residual."""
    _, _, helper, nh = onnx_modules()
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def linear(x, name, n_in, n_out, out):
        inits.extend([nh.from_array(rng.normal(0, n_in ** -0.5, (n_in, n_out)).astype("float32"), f"{name}_w"),
                      nh.from_array(rng.normal(0, 0.02, (n_out,)).astype("float32"), f"{name}_b")])
        nodes.extend([helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_m"]),
                      helper.make_node("Add", [f"{name}_m", f"{name}_b"], [out])])

    for name in ("q", "k", "v"):
        linear("x", name, dim, dim, name)
    inits.append(nh.from_array(np.array(dim ** -0.5, dtype=np.float32), "inv_sqrt_d"))
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "inv_sqrt_d"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["a"])]
    linear("a", "o", dim, dim, "o")
    nodes.append(helper.make_node("Add", ["o", "x"], ["h"]))
    linear("h", "f1", dim, hidden, "f1")
    nodes.append(helper.make_node("Relu", ["f1"], ["r"]))
    linear("r", "f2", hidden, dim, "f2")
    nodes.append(helper.make_node("Add", ["f2", "h"], ["y"]))
    return _save(path, "encoder", nodes, inits, [seq, dim], [seq, dim])


class OnnxGraph:
    """An ONNX graph under construction: seeded He-initialised weights, fresh value names."""

    def __init__(self, seed: int):
        _, _, self.helper, self.nh = onnx_modules()
        self.rng, self.inits, self.nodes, self.count = np.random.default_rng(seed), [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array, prefix: str = "k") -> str:
        name = self.name(prefix)
        self.inits.append(self.nh.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             act: str | None = "Relu", gain: float = 1.0) -> str:
        """Conv (batch norm folded into its bias) -> ``act`` (Relu, Relu6 as Clip, or None);
        ``gain`` scales the weights (a residual branch's last conv starts small, as a trained
        network's batch norm keeps the sum O(1))."""
        fan_in = cin // groups * k * k
        w = self.const(gain * self.rng.normal(0, (2 / fan_in) ** 0.5, (cout, cin // groups, k, k)).astype("float32"), "w")
        b = self.const(self.rng.normal(0, 0.05, (cout,)).astype("float32"), "b")
        y = self.node("Conv", [x, w, b], pads=[k // 2] * 4, strides=[stride, stride], group=groups)
        if act == "Relu6":
            return self.node("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))])
        return self.node(act, [y]) if act else y

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        w = self.const(self.rng.normal(0, n_in ** -0.5, (n_in, n_out)).astype("float32"), "w")
        return self.node("Add", [self.node("MatMul", [x, w]), self.const(self.rng.normal(0, 0.02, (n_out,)).astype("float32"), "b")])

    def classifier(self, x: str, cin: int, classes: int) -> str:
        flat = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        w = self.const(self.rng.normal(0, cin ** -0.5, (classes, cin)).astype("float32"), "fc_w")
        return self.node("Gemm", [flat, w, self.const(np.zeros(classes, "float32"), "fc_b")], transB=1)

    def save(self, path, name: str, out: str, x_shape, y_shape) -> Path:
        """Saved with ``out`` (the last node's output) renamed "y"."""
        assert self.nodes[-1].output[0] == out, "the graph's output must be its last node's"
        self.nodes[-1].output[0] = "y"
        return _save(path, name, self.nodes, self.inits, x_shape, y_shape)


def float_resnet50(path, *, seed: int = 0, size: int = 224, classes: int = 1000) -> Path:
    """ResNet-50 as ONNX (batch 1, batch norms folded): a 7x7/2 stem, max pool, bottleneck
    stages of 3, 4, 6, 3 blocks (1x1, 3x3 with the stage's stride, 1x1 x4; 1x1 projections),
    global average pool, a Gemm classifier."""
    g = OnnxGraph(seed)
    x = g.node("MaxPool", [g.conv("x", 3, 64, 7, 2)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            y = g.conv(g.conv(g.conv(x, cin, width, 1), width, width, 3, stride), width, 4 * width, 1, act=None,
                       gain=0.2)
            skip = x if stride == 1 and cin == 4 * width else g.conv(x, cin, 4 * width, 1, stride, act=None)
            x, cin = g.node("Relu", [g.node("Add", [y, skip])]), 4 * width
    return g.save(path, "resnet50", g.classifier(x, cin, classes), [1, 3, size, size], [1, classes])


def float_mobilenet_v2(path, *, seed: int = 0, size: int = 224, classes: int = 1000) -> Path:
    """MobileNetV2 as ONNX (batch 1, batch norms folded, ReLU6 as Clip): inverted residual
    blocks (1x1 expansion, 3x3 depthwise, 1x1 linear projection; residual where shapes allow)."""
    g = OnnxGraph(seed)
    x, cin = g.conv("x", 3, 32, 3, 2, act="Relu6"), 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            y = g.conv(x, cin, hidden, 1, act="Relu6") if t != 1 else x
            y = g.conv(g.conv(y, hidden, hidden, 3, stride, groups=hidden, act="Relu6"), hidden, c, 1, act=None,
                       gain=0.5)
            x, cin = (g.node("Add", [x, y]) if stride == 1 and cin == c else y), c
    x = g.conv(x, cin, 1280, 1, act="Relu6")
    return g.save(path, "mobilenet_v2", g.classifier(x, 1280, classes), [1, 3, size, size], [1, classes])


@dataclass(frozen=True)
class EncoderSize:
    """A BERT encoder's sizes (BERT-base's by default); ``batch`` None: ``[seq, dim]`` in."""

    seq: int = 128
    dim: int = 768
    heads: int = 12
    hidden: int = 3072
    layers: int = 12
    batch: int | None = None


def float_bert_base(path, size: EncoderSize | None = None, *, seed: int = 0, dynamic: bool | str = False,
                    **changes) -> Path:
    """A BERT-base encoder as ONNX (``seq`` embeddings in; with ``batch``, ``[batch, seq, dim]``
    as a transformers export has them): per layer, multi-head self-attention (q, k, v
    projections, softmax(q.k^T / sqrt(d_head)).v per head, an output projection), residual +
    LayerNormalization, a GELU (erf) feed-forward, residual + LayerNormalization. ``size``
    (`EncoderSize`) with ``changes`` applied (``seq=16, layers=2``) gives the sizes.
    ``dynamic``: the dimensions an exporter writes as dim_params - ``"seq"`` (or True),
    ``"batch"`` or ``"batch,seq"``; the reshapes copy or infer them (``0`` / ``-1``)."""
    sz = replace(size or EncoderSize(), **changes)
    seq, dim, heads, hidden, layers, batch = sz.seq, sz.dim, sz.heads, sz.hidden, sz.layers, sz.batch
    g = OnnxGraph(seed)
    dh = dim // heads
    named = {"seq"} if dynamic is True else set(filter(None, str(dynamic or "").split(",")))
    if "batch" in named and batch is None:
        raise ValueError("a dynamic batch needs a batched encoder: give batch=")
    lead = [] if batch is None else [0]  # Reshape's 0 copies the batch (static or not)
    split = g.const(np.array(lead + [0 if lead else -1, heads, dh] if named else lead + [seq, heads, dh], np.int64), "shape")
    merge = g.const(np.array(lead + [0 if lead else -1, dim] if named else lead + [seq, dim], np.int64), "shape")
    b = len(lead)

    def norm(x):
        return g.node("LayerNormalization", [x, g.const(np.ones(dim, "float32"), "gamma"),
                                             g.const(np.zeros(dim, "float32"), "beta")], axis=-1, epsilon=1e-12)

    def per_head(x, perm):  # [(batch,) seq, heads, dh] -> perm
        return g.node("Transpose", [g.node("Reshape", [g.linear(x, dim, dim), split])],
                      perm=list(range(b)) + [p + b for p in perm])

    x = "x"
    for _ in range(layers):
        q, kt, v = per_head(x, [1, 0, 2]), per_head(x, [1, 2, 0]), per_head(x, [1, 0, 2])
        scores = g.node("Mul", [g.node("MatMul", [q, kt]), g.const(np.float32(dh ** -0.5), "scale")])
        ctx = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
        ctx = g.node("Reshape", [g.node("Transpose", [ctx], perm=list(range(b)) + [b + 1, b, b + 2]), merge])
        h = norm(g.node("Add", [g.linear(ctx, dim, dim), x]))
        f = g.linear(h, dim, hidden)
        erf = g.node("Erf", [g.node("Mul", [f, g.const(np.float32(2 ** -0.5), "c")])])
        gelu = g.node("Mul", [g.node("Mul", [f, g.node("Add", [erf, g.const(np.float32(1), "one")])]),
                              g.const(np.float32(0.5), "half")])
        x = norm(g.node("Add", [g.linear(gelu, hidden, dim), h]))
    shape = ([] if batch is None else ["batch" if "batch" in named else batch]) + ["seq" if "seq" in named else seq, dim]
    return g.save(path, "bert_base", x, shape, shape)


CALIBRATION_SAMPLES = 8  # seeded inputs ort_quantize calibrates on


def ort_quantize(float_path, out_path, *, seed: int = 0, per_channel: bool = True,
                 activation: str = "uint8", symmetric_weights: bool = True, preprocess: bool = True,
                 sizes: dict | None = None) -> Path:
    """``float_path`` quantized by ONNX Runtime's recommended flow: ``quant_pre_process``
    (shape inference and graph optimization; ``preprocess=False`` skips it) then
    ``quantize_static`` (QDQ format, int8 weights - asymmetric, with zero points, when not
    ``symmetric_weights`` - ``activation`` activations), calibrated on `CALIBRATION_SAMPLES` seeded
    inputs in [-1, 1]. ``sizes``: the value of each named (dynamic) input dimension in the
    calibration inputs (``{"batch": 1, "seq": 128}``); the quantized file keeps the names."""
    # deferred: optional dependency (onnxruntime)
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    onnx = onnx_modules()[0]
    model = onnx.load(str(float_path))
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(CALIBRATION_SAMPLES):
        feed = {}
        for inp in model.graph.input:
            shape = [_calibration_size(d, inp.name, sizes) for d in inp.type.tensor_type.shape.dim]
            feed[inp.name] = rng.uniform(-1, 1, shape).astype("float32")
        feeds.append(feed)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    act = QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8
    if preprocess:
        prepared = Path(out_path).with_name(Path(out_path).stem + "_preprocessed.onnx")
        quant_pre_process(str(float_path), str(prepared))
        float_path = prepared
    quantize_static(str(float_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=act, weight_type=QuantType.QInt8,
                    extra_options={"WeightSymmetric": symmetric_weights})
    return Path(out_path)


def _calibration_size(dim, input_name: str, sizes: dict | None) -> int:
    """A calibration input's extent along ``dim``: its fixed value, or ``sizes``' value of its
    name (an error naming the input and the dimension when ``sizes`` lacks it)."""
    if not dim.dim_param:
        return dim.dim_value
    if dim.dim_param not in (sizes or {}):
        raise ValueError(f"input {input_name!r} has the named dimension {dim.dim_param!r}: give "
                         f"ort_quantize sizes={{{dim.dim_param!r}: N}} to calibrate at")
    return int(sizes[dim.dim_param])


def ort_quantize_dynamic(float_path, out_path) -> Path:
    """``float_path`` quantized by ONNX Runtime's ``quantize_dynamic`` (int8 weights; activations
    quantized at run time: ``DynamicQuantizeLinear`` + ``MatMulInteger``)."""
    # deferred: optional dependency (onnxruntime)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(float_path), str(out_path), weight_type=QuantType.QInt8)
    return Path(out_path)


def qdq_matmul(path, *, weight_zero_point=0, seed: int = 0, m: int = 4, k: int = 32,
               n: int = 24) -> Path:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul(DequantizeLinear(w_q)) -> Quantize ->
    Dequantize, written by hand: per-tensor uint8 activations, int8 weights with the given
    zero point (0: symmetric; a sequence of ``n``: one per output column, with as many
    scales)."""
    _, _, helper, nh = onnx_modules()
    rng = np.random.default_rng(seed)
    wq = rng.integers(-100, 100, (k, n)).astype(np.int8)

    def scalar(name, value, dtype):
        return nh.from_array(np.array(value, dtype=dtype), name)

    per_column = np.ndim(weight_zero_point) == 1
    sw = np.linspace(0.01, 0.03, n) if per_column else 0.02
    inits = [nh.from_array(wq, "wq"), scalar("sx", 0.01, np.float32), scalar("zx", 128, np.uint8),
             scalar("sw", sw, np.float32), scalar("zw", weight_zero_point, np.int8),
             scalar("sy", 0.05, np.float32), scalar("zy", 120, np.uint8)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], **({"axis": 1} if per_column else {})),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    return _save(path, "mm", nodes, inits, [m, k], [m, n])


__all__ = ["EncoderSize", "float_bert_base", "float_cnn", "float_depthwise", "float_mobilenet_v2", "float_resnet18",
           "float_resnet50", "float_transformer", "ort_quantize", "ort_quantize_dynamic", "qdq_matmul"]
