"""Built-in model architectures, written with ``tvm.relax.frontend.nn``; nothing downloaded.

Each builder returns a Relax IRModule (not yet legalized) whose weights are parameters of
``forward``; the architectures are the published ones (layer counts, widths, strides), so the
PrimFuncs they legalize to are those a real deployment sees. Batch norm is folded into the
convolutions' bias, as an inference graph has it.
"""

from __future__ import annotations

import functools
from typing import Callable

import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tirbyoc.app.model_in.convnets import mobilenet_v2, resnet18, resnet50, resnet50_fp16, small_cnn, wrap
from tirbyoc.app.model_in.llm import llama_layer
from tirbyoc.app.model_in.model_inputs import model_inputs
from tirbyoc.app.model_in.preparation import with_constant_weights
from tirbyoc.relax.calibration import quantize_static


def _nn():

    return nn


def bert_base(batch: int = 1, seq: int = 128, layers: int = 12, hidden: int = 768, heads: int = 12,
              ffn: int = 3072, dtype: str = "float32", accumulate: str | None = None):
    """BERT-base encoder: 12 layers of self-attention (12 heads) and a 3072-wide GELU FFN.
    ``accumulate``: the dtype the projections and attention matmuls sum in before rounding to
    ``dtype`` (float32 for a float16 model, as PyTorch and cuBLAS compute a half-precision
    model; None: in ``dtype`` itself, as TVM's operators do by default)."""
    nn = _nn()
    head = hidden // heads

    def matmul(a, b):
        if accumulate is None:
            return nn.op.matmul(a, b)
        return nn.op.astype(nn.op.matmul(a, b, out_dtype=accumulate), dtype)

    def linear(lin, x):
        return matmul(x, nn.op.permute_dims(lin.weight)) + lin.bias

    class Layer(nn.Module):
        def __init__(self):
            self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype)
            self.proj = nn.Linear(hidden, hidden, dtype=dtype)
            self.ln1 = nn.LayerNorm(hidden, dtype=dtype)
            self.up = nn.Linear(hidden, ffn, dtype=dtype)
            self.down = nn.Linear(ffn, hidden, dtype=dtype)
            self.ln2 = nn.LayerNorm(hidden, dtype=dtype)

        def forward(self, x):
            qkv = nn.op.reshape(linear(self.qkv, x), (batch, seq, 3, heads, head))
            q, k, v = nn.op.split(qkv, 3, axis=2)
            q, k, v = (nn.op.permute_dims(nn.op.reshape(t, (batch, seq, heads, head)), [0, 2, 1, 3])
                       for t in (q, k, v))
            scores = matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) / float(head) ** 0.5
            ctx = matmul(nn.op.softmax(scores, axis=-1), v)
            ctx = nn.op.reshape(nn.op.permute_dims(ctx, [0, 2, 1, 3]), (batch, seq, hidden))
            x = self.ln1(x + linear(self.proj, ctx))
            return self.ln2(x + linear(self.down, nn.op.gelu(linear(self.up, x))))

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


def bert_base_fp16(batch: int = 1, seq: int = 128, layers: int = 12):
    """BERT-base in float16 as a GPU runs it: half-precision weights and activations, each
    matmul summed in float32 and rounded once (PyTorch's ``model.half()``; the tensor cores'
    fp16 -> fp32 mma)."""
    return bert_base(batch, seq, layers, dtype="float16", accumulate="float32")


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


REQUANTIZE = ("float", "shift")
MLP_SHIFT = 6  # mlp_int8's integer requantization: int8 = accumulator >> 6, rounded


def _shift_to_int8(acc, shift: int):
    """int32 accumulators -> int8 in integer arithmetic: (acc + 2^(shift-1)) >> shift, clipped
    to [-128, 127] (round half up, VTA's requantization)."""
    rounded = relax.op.add(acc, relax.const(1 << (shift - 1), "int32"))
    return relax.op.astype(relax.op.clip(relax.op.right_shift(rounded, relax.const(shift, "int32")),
                                         -128, 127), "int8")


def mlp_int8(act_dtype: str = "uint8", requantize: str = "float", batch: int = 16,
             sizes=(256, 512, 512, 128)):
    """A quantized MLP as a quantized model has it: ``act_dtype`` activations (uint8, or int8
    for cores with signed inputs) x int8 weights -> int32 accumulators, dequantized
    (per-channel scale, float bias), ReLU, requantized (x 1/4, rounded, clipped to the
    activation range) for the next layer; float output. ``requantize="shift"``: the
    accumulators are first requantized to int8 in integers (add 32, shift right by
    `MLP_SHIFT` = 6, clip),
    as an accelerator's ALU does before a narrowing store, and the per-channel scale applies
    to those."""
    if requantize not in REQUANTIZE:
        raise ValueError(f"requantize must be one of {REQUANTIZE}, got {requantize!r}")
    nn = _nn()

    class QLinear(nn.Module):
        def __init__(self, cin, cout):
            self.weight = nn.Parameter((cout, cin), "int8")
            self.scale = nn.Parameter((cout,), "float32")
            self.bias = nn.Parameter((cout,), "float32")

        def forward(self, x):
            acc = nn.op.matmul(x, nn.op.permute_dims(self.weight), out_dtype="int32")
            if requantize == "shift":
                q8 = _shift_to_int8(acc._expr, MLP_SHIFT)
                dequantized = wrap(relax.op.astype(q8, "float32"), "dequantize")
                return dequantized * (self.scale * float(1 << MLP_SHIFT)) + self.bias
            return nn.op.astype(acc, "float32") * self.scale + self.bias

    def to_activations(y):
        lo, hi = (0, 255) if act_dtype == "uint8" else (-128, 127)
        q = relax.op.clip(relax.op.round(relax.op.multiply(y._expr, relax.const(0.25, "float32"))), lo, hi)
        return wrap(relax.op.astype(q, act_dtype), "requantize")

    class QMLP(nn.Module):
        def __init__(self):
            self.layers = nn.ModuleList([QLinear(a, b) for a, b in zip(sizes, sizes[1:])])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                y = layer(x)
                if i + 1 == len(self.layers):
                    return y
                x = to_activations(nn.op.relu(y))

    mod, _ = QMLP().export_tvm({"forward": {"x": nn.spec.Tensor((batch, sizes[0]), act_dtype)}})
    return mod


mlp_int8.quantized = True


def transformer_block(batch: int = 1, seq: int = 64, hidden: int = 256, heads: int = 4, ffn: int = 1024):
    """One encoder block (self-attention + GELU FFN, post-norm), BERT's layer at a small size."""
    return bert_base(batch, seq, layers=1, hidden=hidden, heads=heads, ffn=ffn)


# ------------------------------------------------------------------ int8 variants
CALIBRATION_SEEDS = (1, 2)  # the calibration inputs' seeds (a run's own input is seed 0 by default)
WEIGHT_SEED = 0  # the seed of the built-ins' weights, as `tirbyoc run --seed 0` draws them


def quantize(mod, act_dtype: str = "uint8", requantize: str = "float", entry: str = "forward",
             sizes: dict | None = None):
    """The int8 variant of a float built-in, as a quantization toolchain makes it: its weights
    bound as constants (drawn as a run draws them, seed `WEIGHT_SEED`), then every ``conv2d``
    and ``matmul`` quantized in QDQ form (`tirbyoc.relax.calibration.quantize_static`),
    calibrated on inputs drawn with `CALIBRATION_SEEDS`. `tirbyoc run` makes the cores integer
    with `QuantizedToInteger`, as it does a user's QDQ model: one path for both.

    ``act_dtype``: the activations' dtype (uint8, or int8 for cores that take signed inputs:
    VTA, tensor cores). ``requantize``: ``"float"`` quantizes as ONNX Runtime's
    ``quantize_static`` does (per-channel weight scales, asymmetric activations); ``"shift"``
    as VTA's quantizer does (symmetric, per-tensor, power-of-two scales), so that each
    accumulator comes back to the next layer's scale by an add, a shift and a clip - the
    chain an accelerator's ALU runs on its accumulator tile before a narrowing store. ``sizes``:
    the size of each named dimension (a sequence length) of the calibration inputs."""
    if act_dtype not in ("uint8", "int8"):
        raise ValueError(f"act_dtype must be uint8 or int8, got {act_dtype!r}")
    if requantize not in REQUANTIZE:
        raise ValueError(f"requantize must be one of {REQUANTIZE}, got {requantize!r}")
    weights = model_inputs(relax.transform.LegalizeOps()(mod), entry, WEIGHT_SEED, sizes=sizes)
    bound, _ = with_constant_weights(mod, entry, weights)
    legal = relax.transform.LegalizeOps()(bound)
    samples = [model_inputs(legal, entry, seed, sizes=sizes) for seed in CALIBRATION_SEEDS]
    return quantize_static(bound, entry, samples, act_dtype, power_of_two=requantize == "shift")


def _int8(builder: Callable) -> Callable:
    @functools.lru_cache(maxsize=None)
    def calibrated(act_dtype: str, requantize: str):  # a sweep or a benchmark builds it often
        # a model of named sizes is calibrated at its longest default size
        sizes = {k: max(v) for k, v in getattr(builder, "sizes", {}).items()} or None
        return quantize(builder(), act_dtype, requantize, sizes=sizes)

    def build(act_dtype: str = "uint8", requantize: str = "float"):
        mod = calibrated(act_dtype, requantize)
        return tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # a module of the caller's own

    build.__doc__ = (f"{builder.__name__} quantized with `quantize` (QDQ: uint8 or int8 activations "
                     "x int8 weights, calibrated).")
    build.quantized = True
    build.calibrated = True
    if hasattr(builder, "sizes"):
        build.sizes = builder.sizes
    return build


MODELS: dict[str, Callable] = {
    "mlp": mlp, "mlp_int8": mlp_int8, "cnn": small_cnn, "cnn_int8": _int8(small_cnn),
    "transformer": transformer_block, "transformer_int8": _int8(transformer_block),
    "resnet18": resnet18, "resnet18_int8": _int8(resnet18),
    "resnet50": resnet50, "resnet50_int8": _int8(resnet50),
    "mobilenet_v2": mobilenet_v2, "mobilenet_v2_int8": _int8(mobilenet_v2),
    "bert_base": bert_base, "bert_base_int8": _int8(bert_base), "bert_base_fp16": bert_base_fp16,
    "resnet50_fp16": resnet50_fp16,
    "llama_layer": llama_layer, "llama_layer_int8": _int8(llama_layer),
}


def build_model(name: str, act_dtype: str | None = None, requantize: str = "float"):
    """A built-in model by name (Relax IRModule, not legalized). ``act_dtype``: for the
    ``_int8`` variants, the activations' dtype (uint8 for x86_vnni / Hexagon, int8 for VTA
    and tensor cores); ``requantize``: how their accumulators come back (`quantize`)."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown built-in model {name!r}; known: {sorted(MODELS)}") from None
    if act_dtype is not None and getattr(builder, "quantized", False):
        return builder(act_dtype, requantize)
    return builder()
