"""`QuantizedToInteger`: quantized models' float convolutions and matmuls as integer cores.

A model quantized by ONNX Runtime (QDQ format) or PyTorch's PT2E flow keeps its compute in
float: TVM imports it as ``dequantize(x_q) , dequantize(w_q) -> conv2d | matmul (+ bias)
(-> relu) -> quantize``. Int8 accelerators compute ``x_q . w_q`` in integers, so this pass
(before ``LegalizeOps``; Relax has no FakeQuantizationToInteger) rewrites each such chain into

    acc   = conv2d | matmul(x_q, w_q, out_dtype=int32)     # the core a template offloads
    real  = (acc - zx * sum(w_q)) * (sx * sw) + bias        # per output channel
    y_q   = quantize(relu?(real), sy, zy)                   # ONNX's rounding (half to even)

(a float bias, as PyTorch's PT2E models have it, is added as it is; a chain with no output
``quantize`` - a PT2E model's last layer - gives ``relu?(real)`` in float), which is exact:
``sum((x_q - zx) * w_q) = x_q . w_q - zx * sum(w_q)`` over every position the
core sees, and a padded convolution pads ``x_q`` with ``zx`` (the real zero) before the core.
The weight sums, scales and bias are constants computed here, once. A matmul of two quantized
activations (attention) takes both zero points' shares from row and column sums at run time.
Activations are converted to the signedness the template's core takes (``u8 -> i8``:
``x_q - 128``, ``zx - 128``).

ONNX's ``MatMulInteger`` (dynamic quantization), which TVM imports as an int32 x int32 matmul of
zero-point-centred operands, becomes an 8-bit core plus the zero points' shares the same way.

Asymmetric weights (a non-zero weight zero point ``zw``, per tensor or per channel) also take
``- zw * sum(x_q) + K * zx * zw``, the input's sums computed at run time: row sums for a
matmul; for a convolution, window sums - the channel sum's box filter (a one-channel int32
convolution), or for a depthwise one an 8-bit depthwise convolution with a kernel of ones.

A chain the pass cannot prove exact stays float, with its reason in the report: weights that
are not constants, per-channel activation scales, layouts other than NCHW / OIHW, asymmetric
weights in a grouped (not depthwise) convolution.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from tirbyoc._tvm import const_value, tvm
from tirbyoc.relax.byte_layouts import byte_layouts
from tirbyoc.relax.quantized_pool import integer_max_pools
from tirbyoc.relax.quantized_report import QuantizedReport
from tirbyoc.relax.requantize import (ACT_RANGE, REQUANTIZE, Dequantization, OutputQuantization, float_requantize,
                                      shift_requantize)


class _Pattern:
    """``quantize(relu?(core (+ bias)), sy, zy)`` with ``core`` a conv2d or matmul of two
    dequantized tensors (the weight possibly transposed), the bias quantized (ONNX) or a float
    constant (PyTorch), on either side of the add; ``float_root``: the same chain without the
    output quantize (a PT2E model's last layer keeps a float output)."""

    def __init__(self):
        self.x, self.sx, self.zx = wildcard(), wildcard(), wildcard()
        self.w, self.sw, self.zw = wildcard(), wildcard(), wildcard()
        self.b, self.sb, self.zb = wildcard(), wildcard(), wildcard()
        self.sy, self.zy = wildcard(), wildcard()
        dq_x = is_op("relax.dequantize")(self.x, self.sx, self.zx)
        dq_w = is_op("relax.dequantize")(self.w, self.sw, self.zw)
        self.perm = is_op("relax.permute_dims")(dq_w)
        weight = dq_w | self.perm
        self.conv = is_op("relax.nn.conv2d")(dq_x, weight)
        self.matmul = is_op("relax.matmul")(dq_x, weight)
        core = self.conv | self.matmul
        dq_b = is_op("relax.dequantize")(self.b, self.sb, self.zb)
        self.fb = is_const()
        bias = dq_b | is_op("relax.reshape")(dq_b, wildcard()) | self.fb | is_op("relax.reshape")(self.fb, wildcard())
        self.biased = is_op("relax.add")(core, bias) | is_op("relax.add")(bias, core)
        body = self.biased | core
        self.relu = is_op("relax.nn.relu")(body)
        self.root = is_op("relax.quantize")(self.relu | body, self.sy, self.zy)
        self.float_root = self.relu | body


class _Refused(Exception):
    """A chain that stays float; the message is the reason."""


def _check(m: dict, p: _Pattern, act_dtype: str):
    """The constants of one matched chain, or `_Refused` with the reason it stays float."""
    x = m[p.x]
    w, sw, zw, sx, zx = (const_value(m[e]) for e in (p.w, p.sw, p.zw, p.sx, p.zx))
    if str(x.ty.dtype) not in ACT_RANGE:
        raise _Refused(f"activations are {x.ty.dtype}, not 8-bit")
    if w is None or sw is None or zw is None:
        raise _Refused("the weights are not constants")
    if str(w.dtype) != "int8":
        raise _Refused(f"the weights are {w.dtype}, the cores take int8")
    if sx is None or zx is None or sx.size != 1 or zx.size != 1:
        raise _Refused("the activation scale or zero point is not one constant")
    if p.perm in m:
        axes = m[p.perm].attrs.axes
        w = np.transpose(w, [int(a) for a in axes]) if axes is not None else w.T
    return w, sw.astype(np.float32), zw.astype(np.int64), float(sx.reshape(())), int(zx.reshape(()))


def _shifted(x, dtype: str) -> tuple[object, int]:
    """(``x`` in ``dtype``, the shift applied): u8 <-> i8 is an exact shift by 128, which its
    zero point takes too."""
    if str(x.ty.dtype) == dtype:
        return x, 0
    shift = -128 if dtype == "int8" else 128
    wide = relax.op.add(relax.op.astype(x, "int16"), relax.const(shift, "int16"))
    return relax.op.astype(wide, dtype), shift


def _to_act_dtype(x, zx: int, act_dtype: str):
    """``x`` and its (constant) zero point in the template's activation dtype."""
    x, shift = _shifted(x, act_dtype)
    return x, zx + shift


def _centred_matmul(x, w, zx, zw):
    """``(x - zx) . (w - zw)`` as an 8-bit core plus the zero points' shares, exact in int32:
    ``x.w - zw*rowsum(x - zx) - zx*colsum(w)`` (``zx``, ``zw``: int32 scalars). The row sums
    of the centred ``x`` carry ``K*zx*zw``, so a reduction length known only at run time (an
    attention's P.V over the sequence) needs no constant K."""
    acc = relax.op.matmul(x, w, out_dtype="int32")
    rows = relax.op.sum(relax.op.subtract(relax.op.astype(x, "int32"), zx), axis=[-1], keepdims=True)
    cols = relax.op.sum(relax.op.astype(w, "int32"), axis=[-2], keepdims=True)
    out = relax.op.subtract(acc, relax.op.multiply(rows, zw))
    return relax.op.subtract(out, relax.op.multiply(cols, zx))


def _row_sums(x):
    """Each row's sum of ``x`` in int32 (what a weight zero point multiplies)."""
    return relax.op.sum(relax.op.astype(x, "int32"), axis=[-1], keepdims=True)


def _integer_conv(call, x, zx: int, w: np.ndarray):
    """(int32 conv of ``x`` (padded with ``zx``) and ``w``, per-channel broadcast shape,
    weight sums, each output's window sum of the padded ``x`` (for weight zero points))."""
    at = call.attrs
    if str(at.data_layout) != "NCHW" or str(at.kernel_layout) != "OIHW":
        raise _Refused(f"layout {at.data_layout}/{at.kernel_layout} (NCHW/OIHW only)")
    pad = [int(v) for v in at.padding]
    if any(pad):
        top, left, bottom, right = pad
        x = relax.op.nn.pad(x, [0, 0, 0, 0, top, bottom, left, right], pad_value=float(zx))

    def conv(data, weights, groups):
        return relax.op.nn.conv2d(data, weights, at.strides, 0, at.dilation, groups, "NCHW", "OIHW", "NCHW", "int32")

    def window_sums():
        """Each output's sum of its input window: the channel sum's box filter (a one-channel
        int32 conv, 1/(C*O) of the core's MACs), or for a depthwise convolution an 8-bit one
        with a kernel of ones, shaped as the core is."""
        groups, ones = int(at.groups), np.ones(w.shape[2:], "int8")
        if groups == 1:
            summed = relax.op.sum(relax.op.astype(x, "int32"), axis=[1], keepdims=True)
            return conv(summed, relax.const(ones[None, None].astype("int32")), 1)
        if groups == w.shape[0] and w.shape[1] == 1:
            return conv(x, relax.const(np.broadcast_to(ones, w.shape).copy()), groups)
        raise _Refused(f"asymmetric weights in a convolution of {groups} groups (1 or depthwise only)")

    return (conv(x, relax.const(w, "int8"), at.groups), (1, w.shape[0], 1, 1),
            w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1), window_sums)


def _integer_matmul(x, w: np.ndarray):
    if w.ndim != 2:
        raise _Refused(f"a {w.ndim}-D matmul weight (2-D only)")
    acc = relax.op.matmul(x, relax.const(w, "int8"), out_dtype="int32")
    return acc, (w.shape[1],), w.astype(np.int64).sum(axis=0), lambda: _row_sums(x)


def _rewrite(call, m: dict, p: _Pattern, act_dtype: str, report: QuantizedReport, requantize: str):
    core_call = m[p.conv] if p.conv in m else m[p.matmul]
    what = "conv2d" if p.conv in m else "matmul"
    try:
        if what == "matmul" and const_value(m[p.w]) is None:
            corrected, scale, shape, label = _dynamic_matmul(m, p, act_dtype)
        else:
            corrected, scale, shape, label = _static_core(m, p, act_dtype, what, core_call)
        bias = _bias(m, p, scale.size)
    except _Refused as why:
        # rewrite_call matches until nothing changes: a chain kept float is seen again
        if not any(core_call.same_as(c) for c in report.seen):  # once per chain, however matched
            report.seen.append(core_call)
            report.kept.append((f"{what} {'x'.join(map(str, _shape(core_call)))}", str(why)))
        return call
    first = not any(core_call.same_as(c) for c in report.done)  # a chain is matched at each of its ops
    if first:
        report.done.append(core_call)
        report.integer.append(label)
    deq, quantized = Dequantization(scale, shape, bias, p.relu in m), p.sy in m
    if requantize == "shift" and quantized:
        sy, zy = const_value(m[p.sy]), const_value(m[p.zy])
        tail, why = (None, "the output scale is not a constant") if sy is None or zy is None else \
            shift_requantize(corrected, deq, sy, zy, str(call.attrs.out_dtype))
        if first:
            report.shifted.append(label) if tail is not None else report.unshifted.append((label, why))
        if tail is not None:
            return tail
    if not quantized:  # a chain with a float output
        return float_requantize(corrected, deq)
    at = call.attrs
    return float_requantize(corrected, deq, OutputQuantization(m[p.sy], m[p.zy], int(at.axis), str(at.out_dtype)))


def _static_core(m: dict, p: _Pattern, act_dtype: str, what: str, core_call):
    """A conv or matmul with constant weights: (the int32 core minus the input zero point's
    share, the per-channel scale, its broadcast shape, a label)."""
    w, sw, zw, sx, zx = _check(m, p, act_dtype)
    x, zx = _to_act_dtype(m[p.x], zx, act_dtype)
    acc, shape, wsum, window_sums = _integer_conv(core_call, x, zx, w) if what == "conv2d" else _integer_matmul(x, w)
    channels = shape[1] if what == "conv2d" else shape[0]
    scale = np.broadcast_to(sw.reshape(-1) * np.float32(sx), (channels,)).astype(np.float32)
    share = (zx * wsum).astype(np.int32).reshape(shape)  # the input zero point's share, added negated
    corrected = relax.op.add(acc, relax.const(-share, "int32")) if np.any(share) else acc
    if np.any(zw != 0):  # sum((x - zx)(w - zw)) also loses zw * sum(x) and gains K * zx * zw
        if zw.size not in (1, channels):
            raise _Refused(f"{zw.size} weight zero points for {channels} channels")
        zw = np.broadcast_to(zw.reshape(-1), (channels,)).reshape(shape)
        k = w.size // w.shape[0] if what == "conv2d" else w.shape[0]
        corrected = relax.op.subtract(corrected, relax.op.multiply(window_sums(), relax.const(zw.astype(np.int32))))
        corrected = relax.op.add(corrected, relax.const((k * zx * zw).astype(np.int32)))
    return corrected, scale, shape, f"{what} {'x'.join(map(str, w.shape))}"


def _dynamic_matmul(m: dict, p: _Pattern, act_dtype: str):
    """A matmul of two quantized activations (attention's Q.K^T and P.V): both zero points'
    shares are computed from the operands at run time,
    ``sum((x-zx)(w-zw)) = x.w - zw*rowsum(x-zx) - zx*colsum(w)`` (`_centred_matmul`; any
    reduction length, a sequence's known only at run time included)."""
    scalars = [const_value(m[e]) for e in (p.sx, p.zx, p.sw, p.zw)]
    if any(v is None or v.size != 1 for v in scalars):
        raise _Refused("a scale or zero point of an activation x activation matmul is not one constant")
    sx, zx, sw, zw = (v.reshape(()) for v in scalars)
    x, w = m[p.x], m[p.w]
    for t in (x, w):
        if str(t.ty.dtype) not in ACT_RANGE:
            raise _Refused(f"an operand is {t.ty.dtype}, not 8-bit")
    x, zx = _to_act_dtype(x, int(zx), act_dtype)
    w, zw = _to_act_dtype(w, int(zw), "int8")
    if p.perm in m:
        axes = m[p.perm].attrs.axes
        w = relax.op.permute_dims(w, [int(a) for a in axes] if axes is not None else None)
    corrected = _centred_matmul(x, w, relax.const(zx, "int32"), relax.const(zw, "int32"))
    scale = np.array([np.float32(sx) * np.float32(sw)], dtype=np.float32)
    return corrected, scale, (1,), "matmul (activations)"


def _bias(m: dict, p: _Pattern, channels: int) -> np.ndarray | None:
    """The bias as float constants per channel (``sb * (b_q - zb)``, or the float constant
    itself), or None without one."""
    if p.fb in m:
        real = const_value(m[p.fb])
        if str(real.dtype) != "float32":
            raise _Refused(f"a {real.dtype} bias")
    elif p.b not in m:
        return None
    else:
        b, sb, zb = (const_value(m[e]) for e in (p.b, p.sb, p.zb))
        if b is None or sb is None or zb is None:
            raise _Refused("the bias is not a constant")
        real = (sb.astype(np.float64) * (b.astype(np.float64) - zb.astype(np.float64))).astype(np.float32)
    if real.size not in (1, channels):
        raise _Refused(f"a bias of {real.size} values for {channels} channels")
    return np.broadcast_to(real.reshape(-1), (channels,)).copy()


def _shape(call) -> tuple:
    try:
        return tuple(int(d) for d in call.args[1].ty.shape.values)
    except (AttributeError, TypeError):
        return ()


class _IntegerPattern:
    """ONNX's ``MatMulInteger`` (dynamic quantization) as TVM imports it: both 8-bit operands
    widened to int32 with their zero points subtracted, then an int32 x int32 matmul - which no
    8-bit core takes."""

    def __init__(self):
        self.a, self.za, self.w, self.zw = wildcard(), wildcard(), wildcard(), wildcard()

        def centred(x, z):
            return is_op("relax.subtract")(is_op("relax.astype")(x), is_op("relax.astype")(z))

        self.root = is_op("relax.matmul")(centred(self.a, self.za), centred(self.w, self.zw))


def _widened(x, z, dtype: str):
    """(``x`` in ``dtype``, its run-time zero point as an int32 expression shifted alike)."""
    x, shift = _shifted(x, dtype)
    z32 = relax.op.astype(z, "int32")
    return x, (relax.op.add(z32, relax.const(shift, "int32")) if shift else z32)


def _rewrite_integer(call, m: dict, p: _IntegerPattern, act_dtype: str, report: QuantizedReport):
    """``(a - za) . (w - zw)`` in int32 as an 8-bit core plus the zero points' shares:
    ``a.w - zw*rowsum(a - za) - za*colsum(w)`` (exact; `_centred_matmul`)."""
    a, w = m[p.a], m[p.w]
    if str(a.ty.dtype) not in ACT_RANGE or str(w.ty.dtype) not in ACT_RANGE or str(call.attrs.out_dtype) != "int32":
        if not any(call.same_as(c) for c in report.seen):
            report.seen.append(call)
            report.kept.append(("matmul_integer", "operands not 8-bit, or not accumulated in int32"))
        return call
    a, za = _widened(a, m[p.za], act_dtype)
    w, zw = _widened(w, m[p.zw], "int8")
    report.integer.append("matmul_integer")
    return _centred_matmul(a, w, za, zw)


def quantized_to_integer(mod, act_dtype: str = "uint8", requantize: str = "float") -> tuple[object, QuantizedReport]:
    """(``mod`` with its quantized chains integer, the report). ``act_dtype``: the activation
    dtype the target template's core takes (uint8 for x86_vnni / Hexagon, int8 for VTA);
    ``requantize``: how accumulators come back to the next layer's quantization where they can
    (`tirbyoc.relax.requantize`: ``"float"``, or ``"shift"`` for an integer ALU)."""
    if act_dtype not in ACT_RANGE:
        raise ValueError(f"act_dtype must be uint8 or int8, got {act_dtype!r}")
    if requantize not in REQUANTIZE:
        raise ValueError(f"requantize must be one of {REQUANTIZE}, got {requantize!r}")
    report = QuantizedReport()
    p, q = _Pattern(), _IntegerPattern()
    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            func = byte_layouts(func, report.byte_layouts)  # first: the cores then read the bytes moved
            func = rewrite_call(p.root, lambda call, m: _rewrite(call, m, p, act_dtype, report, requantize), func)
            func = rewrite_call(p.float_root, lambda call, m: _rewrite(call, m, p, act_dtype, report, requantize), func)
            func = rewrite_call(q.root, lambda call, m: _rewrite_integer(call, m, q, act_dtype, report), func)
            func = integer_max_pools(func, report.pools)
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs), report


_QUANTIZE_OPS = ("relax.quantize", "relax.dequantize")


def has_quantize_ops(mod) -> bool:
    """Whether a Relax module quantizes or dequantizes anything (a QDQ or dynamically
    quantized model)."""
    found = []

    def visit(expr):
        op = getattr(expr, "op", None)
        if not found and getattr(op, "name", None) in _QUANTIZE_OPS:
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def qdq_output_step(mod, entry: str) -> float | None:
    """The quantization step of a QDQ model's output: the scale of the ``dequantize`` whose
    value ``mod[entry]`` returns, when it is one constant (else None)."""
    func = mod[entry]
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    value = bound.get(func.body.body, func.body.body)
    while isinstance(value, relax.Var) and value in bound:  # an output var bound to another
        value = bound[value]
    if getattr(getattr(value, "op", None), "name", None) != "relax.dequantize":
        return None
    scale = const_value(value.args[1])
    return float(scale.reshape(())) if scale is not None and scale.size == 1 else None


def QuantizedToInteger(act_dtype: str = "uint8", report: QuantizedReport | None = None, requantize: str = "float"):
    """The module pass (before ``LegalizeOps``); ``report`` collects what it did."""
    sink = report if report is not None else QuantizedReport()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.QuantizedToInteger")
    def _pass(mod, _ctx):
        new, rep = quantized_to_integer(mod, act_dtype, requantize)
        for name in ("integer", "kept", "shifted", "unshifted", "pools"):
            getattr(sink, name).extend(getattr(rep, name))
        return new

    return _pass


__all__ = ["QuantizedReport", "QuantizedToInteger", "has_quantize_ops", "qdq_output_step", "quantized_to_integer"]
