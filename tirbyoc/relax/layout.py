"""`ChannelsLast`: a model's convolutions and everything between them in NHWC, once.

A template whose cores read activations channels-innermost (x86_vnni: four input channels per
``vpdpbusd`` lane, sixteen output channels per store) pays, on an NCHW model, a transposing
copy of every convolution's input and a transposing write-back of its output, on every call.
Converted once, the whole graph runs NHWC: the only transposes left are where the model's own
inputs and outputs are NCHW, or before an operator that has no layout rule.

The conversion is TVM's ``ConvertLayout`` (conv2d to NHWC / OHWI; elementwise operators,
pools and reductions follow) with what it lacks in TVM 0.27 supplied here:

- ``quantize``, ``dequantize`` and ``clip`` have no layout rule (``FRelaxInferLayout``), so
  each would be wrapped in transposes. Before the conversion they are written as the
  elementwise operators their legalization computes - ``clip(round(x / s) + z)`` cast, and
  ``(x - z) * s`` - in the same order and dtypes, so the values are TVM's bit for bit. A
  dequantize of a value just quantized (a residual's input, a pool's) is computed from the
  clipped float, ``(clip(round(x / s) + z) - z') * s'``, without the round trip through the
  8-bit dtype: the clipped value is an integer within the dtype's range, so the casts to it,
  to int32 and back to float32 change nothing, and the subtraction of the integer ``z'`` is
  as exact in float32 as in int32 (values below 2^24);
- an ONNX ``Clip`` (ReLU6) arrives as two ``call_tir`` of a max / min against a 0-d tensor,
  which no layout rule moves either: written back as ``maximum`` / ``minimum``
  (`tirbyoc.relax.scalar_bounds`);
- ``nn.pad`` has none either: ``ConvertLayout`` leaves ``permute_dims(pad(permute_dims(x)))``
  around it, which is rewritten to one pad of ``x`` in its own layout.

A constant weight's transpose (OIHW -> OHWI) and the constants the elementwise operators take
are folded once (``FoldConstant``). The report counts the ``permute_dims`` before and after.

With ``channel_multiple`` (the reduction tile of the template's core: 4 bytes per ``vpdpbusd``
lane), a convolution whose input channels are not a multiple of it (an image's 3) gets its
input padded with zero channels and its constant weight with zero filters: exact (a zero
weight adds nothing), and the core then reads each pixel's channels in place instead of
an im2col copy padded along the flattened window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from tirbyoc._tvm import const_value, tvm
from tirbyoc.relax.scalar_bounds import restore_scalar_bounds

CONV_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "OHWI"]}
_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-2 ** 31, 2 ** 31 - 1), "uint16": (0, 65535),
          "int16": (-32768, 32767)}


@dataclass
class LayoutReport:
    """What `channels_last` did: the convolutions converted and the transposes before/after."""

    convolutions: int = 0
    transposes_before: int = 0
    transposes_after: int = 0  # left to run: the weights' own are counted apart
    weight_transposes: int = 0  # computed from weight parameters alone: folded once they are bound
    decomposed: int = 0  # quantize / dequantize / clip (and imported max / min calls) as elementwise operators
    round_trips: int = 0  # dequantizes of a value just quantized, computed from the float
    padded_channels: int = 0  # convolutions whose input channels were padded to the core's tile

    def describe(self) -> str:
        padded = f", {self.padded_channels} with input channels padded" if self.padded_channels else ""
        weights = (f" (and {self.weight_transposes} computed from the weights alone, folded once they "
                   "are bound)" if self.weight_transposes else "")
        return (f"channels-last: {self.convolutions} convolution(s) NHWC{padded}, transposes "
                f"{self.transposes_before} -> {self.transposes_after}{weights}")

    def to_json(self) -> dict:
        return dict(self.__dict__)


def count_ops(mod, name: str) -> int:
    """How many calls of the operator ``name`` the module's Relax functions make."""
    op, found = tvm.ir.Op.get(name), [0]

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(op):
            found[0] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found[0]


def _channel_param(param, axis: int, ndim: int, dtype: str):
    """A constant quantization parameter in ``dtype`` (the exact conversion the legalized
    arithmetic makes of it), broadcast against an ``ndim``-D tensor: a scalar as it is, a
    per-channel vector along ``axis``."""
    value = const_value(param)
    shape = [1] * ndim
    if value.size > 1:
        shape[axis % ndim] = value.size
    return relax.const(value.astype(dtype).reshape(shape if value.size > 1 else ()), dtype)


def _clip_cast(x, dtype: str):
    lo, hi = _RANGE[dtype]
    x = relax.op.maximum(relax.op.minimum(x, relax.const(float(hi), "float32")), relax.const(float(lo), "float32"))
    return relax.op.astype(x, dtype)


def _quantize(call):
    """``relax.quantize`` as its legalization computes it: clip(round(x / s) + z) cast."""
    x, scale, zp = call.args
    ndim, axis, dtype = x.ty.ndim, int(call.attrs.axis), str(call.attrs.out_dtype)
    scaled = relax.op.divide(x, _channel_param(scale, axis, ndim, "float32"))
    shifted = relax.op.add(relax.op.round(scaled), _channel_param(zp, axis, ndim, "float32"))
    return _clip_cast(shifted, dtype)


def _dequantize(call):
    """``relax.dequantize`` (to float32) as its legalization computes it: (x - z) * s."""
    x, scale, zp = call.args
    ndim, axis = x.ty.ndim, int(call.attrs.axis)
    wide = "float32" if str(x.ty.dtype).startswith(("float", "bfloat")) else "int32"
    sub = relax.op.subtract(relax.op.astype(x, wide), _channel_param(zp, axis, ndim, wide))
    return relax.op.multiply(relax.op.astype(sub, "float32"), _channel_param(scale, axis, ndim, "float32"))


class _RoundTrip:
    """``dequantize(astype(maximum(minimum(round(v) + z, hi), lo), dtype), s', z')``: a value
    quantized (as `_quantize` writes it) and dequantized at once, where the dequantize is the
    8-bit value's only user. (A value that a convolution also reads stays 8-bit: computed
    from the float, the dequantize would make the producer write float32 for it as well.)"""

    def __init__(self):
        self.single_use: set = set()  # handles of the astype calls whose value one user reads
        self.z, self.hi, self.lo = is_const(), is_const(), is_const()
        shifted = is_op("relax.add")(is_op("relax.round")(wildcard()), self.z)
        self.clipped = is_op("relax.maximum")(is_op("relax.minimum")(shifted, self.hi), self.lo)
        self.cast = is_op("relax.astype")(self.clipped)
        self.root = is_op("relax.dequantize")(self.cast, wildcard(), wildcard())

    def prepare(self, func):
        """Note which values of ``func`` have one user."""
        uses, bound = {}, {}

        def visit(expr):  # each use of a variable (not where it is bound)
            if isinstance(expr, relax.Var):
                uses[expr.__hash__()] = uses.get(expr.__hash__(), 0) + 1

        relax.analysis.post_order_visit(func, visit)
        for block in getattr(func.body, "blocks", []):
            for b in block.bindings:
                bound[b.var.__hash__()] = b.value
        self.single_use = {bound[v].__hash__() for v, n in uses.items() if v in bound and n == 1}

    def rewrite(self, call, m: dict):
        """The dequantize from the clipped float, where the facts the module's docstring
        relies on hold; else ``call``."""
        dtype = str(m[self.cast].attrs.dtype)
        if m[self.cast].__hash__() not in self.single_use:
            return call
        bounds = [const_value(m[k]) for k in (self.z, self.lo, self.hi)]
        if dtype not in ("uint8", "int8") or not _decomposable(call) or any(b.size != 1 for b in bounds[1:]):
            return call
        z, lo, hi = bounds
        if not (np.all(z == np.round(z)) and _RANGE[dtype][0] <= float(lo) <= float(hi) <= _RANGE[dtype][1]):
            return call
        _, scale, zp = call.args
        ndim, axis = m[self.cast].ty.ndim, int(call.attrs.axis)
        sub = relax.op.subtract(m[self.clipped], _channel_param(zp, axis, ndim, "float32"))
        return relax.op.multiply(sub, _channel_param(scale, axis, ndim, "float32"))


def _decomposable(call) -> bool:
    """Whether a quantize / dequantize call can be written elementwise here: constant
    parameters, a 4-D tensor, float32 in or out."""
    if not all(const_value(a) is not None for a in call.args[1:]):
        return False
    if call.args[0].ty.ndim != 4:
        return False
    if call.op.name == "relax.quantize":
        return str(call.args[0].ty.dtype) == "float32" and str(call.attrs.out_dtype) in _RANGE
    return str(call.attrs.out_dtype) == "float32"


def decompose_qdq(mod, report: LayoutReport | None = None):
    """``mod`` with its 4-D quantize, dequantize and clip calls written as elementwise
    operators that have layout rules (values unchanged, see the module's docstring)."""
    report = report if report is not None else LayoutReport()
    x, trip = wildcard(), _RoundTrip()

    def lowered(lower):
        def rewrite(call, _matches):
            if not _decomposable(call):
                return call
            report.decomposed += 1
            return lower(call)
        return rewrite

    def round_trip(call, matches):
        new = trip.rewrite(call, matches)
        report.round_trips += new is not call
        return new

    def decompose(func):
        func = rewrite_call(is_op("relax.quantize")(x, wildcard(), wildcard()), lowered(_quantize), func)
        trip.prepare(func)
        func = rewrite_call(trip.root, round_trip, func)  # before the dequantizes it would see
        func = rewrite_call(is_op("relax.dequantize")(x, wildcard(), wildcard()), lowered(_dequantize), func)
        return rewrite_call(is_op("relax.clip")(x, wildcard(), wildcard()), _clip, func)

    return _each_function(mod, decompose)


def _each_function(mod, rewrite):
    """``mod`` with ``rewrite`` applied to each of its Relax functions."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = rewrite(func)
    return out


def _clip(call, _matches):
    """``relax.clip`` as ``maximum(minimum(x, hi), lo)`` (what TVM's clip computes)."""
    x, lo, hi = call.args
    dtype = str(x.ty.dtype)
    return relax.op.maximum(relax.op.minimum(x, relax.const(_prim(hi), dtype)), relax.const(_prim(lo), dtype))


def _prim(value):
    """A clip bound's number (a PrimValue of an IntImm or FloatImm)."""
    return value.value.value if hasattr(value, "value") and hasattr(value.value, "value") else float(value.value)


def _fold_padding_transposes(func):
    """``permute_dims(pad(permute_dims(x, p)), q)`` with ``q`` undoing ``p``: one pad of ``x``
    in its own layout (its pad widths permuted)."""
    x = wildcard()
    inner = is_op("relax.permute_dims")(x)
    padded = is_op("relax.nn.pad")(inner)
    outer = is_op("relax.permute_dims")(padded)

    def rewrite(call, matches):
        p = [int(a) for a in matches[inner].attrs.axes]
        q = [int(a) for a in call.attrs.axes]
        if [p[i] for i in q] != list(range(len(p))):
            return call
        pad = matches[padded]
        widths = [int(w) for w in pad.attrs.pad_width]
        pairs = [widths[2 * i:2 * i + 2] for i in range(len(p))]
        mine = [0] * len(widths)
        for out_axis, in_axis in enumerate(p):  # pad's axis out_axis is x's axis p[out_axis]
            mine[2 * in_axis:2 * in_axis + 2] = pairs[out_axis]
        return relax.op.nn.pad(matches[x], mine, str(pad.attrs.pad_mode), float(pad.attrs.pad_value))

    return rewrite_call(outer, rewrite, func)


def _pad_input_channels(func, multiple: int, report: LayoutReport):
    """Pad the channels of an NHWC convolution with a constant OHWI weight, one group, up to
    ``multiple`` (see the module's docstring)."""
    x, w = wildcard(), is_const()

    def rewrite(call, matches):
        at, weight = call.attrs, const_value(matches[w])
        if (str(at.data_layout), str(at.kernel_layout), int(at.groups)) != ("NHWC", "OHWI", 1):
            return call
        extra = -weight.shape[3] % multiple
        if not extra or matches[x].ty.ndim != 4:
            return call
        report.padded_channels += 1
        data = relax.op.nn.pad(matches[x], [0, 0, 0, 0, 0, 0, 0, extra], pad_value=0.0)
        weight = relax.const(np.pad(weight, [(0, 0), (0, 0), (0, 0), (0, extra)]), str(weight.dtype))
        return relax.op.nn.conv2d(data, weight, at.strides, at.padding, at.dilation, 1, "NHWC", "OHWI", "NHWC",
                                  str(at.out_dtype))

    return rewrite_call(is_op("relax.nn.conv2d")(x, w), rewrite, func)


def channels_last(mod, report: LayoutReport | None = None, channel_multiple: int = 1):
    """``mod`` (a Relax module before legalization) with its 2-D convolutions NHWC / OHWI and
    the operators between them following (see the module's docstring); returns (module,
    `LayoutReport`)."""
    report = report if report is not None else LayoutReport()
    report.convolutions = count_ops(mod, "relax.nn.conv2d")
    report.transposes_before = count_ops(mod, "relax.permute_dims")
    if not report.convolutions:
        report.transposes_after = report.transposes_before
        return mod, report
    mod, restored = restore_scalar_bounds(mod)
    report.decomposed += restored
    mod = decompose_qdq(mod, report)
    mod = relax.transform.ConvertLayout(CONV_LAYOUTS)(mod)
    mod = relax.transform.FoldConstant()(_each_function(mod, _fold_padding_transposes))
    if channel_multiple > 1:
        padded = _each_function(mod, lambda func: _pad_input_channels(func, channel_multiple, report))
        mod = relax.transform.FoldConstant()(padded)
    report.weight_transposes = _weight_transposes(mod)
    report.transposes_after = count_ops(mod, "relax.permute_dims") - report.weight_transposes
    return mod, report


def _weight_transposes(mod) -> int:
    """The ``permute_dims`` computed from weight parameters alone - every parameter but the
    first, the data input, as ``relax.frontend.nn`` exports a model (inputs first) - which
    `FoldConstant` computes once when the weights are bound as constants: a weight's OIHW ->
    OHWI, a bias reshaped to NCHW and back. An ONNX model's weights are constants already, and
    its weight transposes are folded here."""
    permute = tvm.ir.Op.get("relax.permute_dims")
    count = 0
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        weights = list(func.params[1:])  # values computed from weights alone, as the bindings go
        for block in getattr(func.body, "blocks", []):
            for b in block.bindings:
                found = []
                relax.analysis.post_order_visit(b.value, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
                if found and all(any(v.same_as(w) for w in weights) for v in found):
                    weights.append(b.var)
                    count += isinstance(b.value, relax.Call) and b.value.op.same_as(permute)
    return count


def ChannelsLast(report: LayoutReport | None = None, channel_multiple: int = 1):
    """The pass form of `channels_last`; pass a `LayoutReport` to collect what it did."""
    report = report if report is not None else LayoutReport()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.ChannelsLast")
    def _pass(mod, _ctx):
        return channels_last(mod, report, channel_multiple)[0]

    _pass.report = report
    return _pass


__all__ = ["CONV_LAYOUTS", "ChannelsLast", "LayoutReport", "channels_last", "count_ops", "decompose_qdq"]
