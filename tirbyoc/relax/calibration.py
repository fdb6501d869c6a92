"""Static quantization of a float Relax model into QDQ form, calibrated on sample inputs.

A vendor's int8 model arrives quantized by a toolchain - ONNX Runtime's ``quantize_static``,
PyTorch's PT2E flow, VTA's quantizer - as quantize / dequantize pairs around float
convolutions and matmuls (QDQ), which `QuantizedToInteger` turns into integer cores. This
module quantizes a float Relax model the way those toolchains do, so that a model made here
(the built-ins' ``_int8`` variants) takes the same path as a user's:

- **calibration** (MinMax, ONNX Runtime's default): the float model runs on the calibration
  inputs (TVM's build of it, on this CPU) and each tensor a core reads or writes gets its
  observed range, widened to hold 0;
- **weights**: symmetric int8 per output channel (``max|w| / 127``), stored as int8 constants;
  a bias as int32 at the input scale x the weight scale (ONNX Runtime's bias quantization);
- **activations**: per tensor, asymmetric in ``act_dtype`` (a zero point);
- ``power_of_two`` (VTA's quantizer): symmetric activations, one weight scale per tensor, every
  scale a power of two, so that an accumulator comes back to the next layer's scale by a
  shift (`QuantizedToInteger` with ``requantize="shift"``).

A *core* is a ``conv2d`` or ``matmul`` of two float32 tensors; its *chain* is ``core (+ a
constant bias) (-> relu)``. Each core's inputs and each chain's end are quantized and
dequantized (the QDQ pairs ONNX Runtime writes, the shape `QuantizedToInteger` matches);
everything else computes in float between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from tirbyoc._tvm import build, const_value, relax_vm, to_tensor, tvm
from tirbyoc.decl.host import host_target
from tirbyoc.relax.requantize import ACT_RANGE

_CORES = ("relax.nn.conv2d", "relax.matmul")


@dataclass
class Core:
    """One core and its chain, as bindings of the (non-dataflow) function."""

    var: relax.Var  # the conv2d / matmul binding
    kind: str  # "conv2d" or "matmul"
    x: relax.Var  # the input
    weight: object | None  # a constant second operand
    other: relax.Var | None  # a second activation (attention), before any permute_dims
    bias: relax.Var | None  # the binding that adds a constant bias
    end: relax.Var  # the chain's last binding: the core, its bias add or its relu


def _op(value) -> str:
    op = getattr(value, "op", None)
    return str(getattr(op, "name", ""))


def _is_const(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.GenericConst)


def _float32(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "float32"


def _uses(func) -> dict:
    """How many times each var is used (by a binding or as the function's result)."""
    counts: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    for block in func.body.blocks:
        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return counts


def find_cores(func) -> list[Core]:
    """The cores of a non-dataflow Relax function (``ToNonDataflow``) and their chains."""
    bindings = [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]
    value = {b.var: b.value for b in bindings}
    uses = _uses(func)
    user = {}  # var -> the binding that uses it, where it has one user
    for b in bindings:
        for arg in getattr(b.value, "args", ()):
            if isinstance(arg, relax.Var) and uses.get(arg) == 1:
                user[arg] = b
    cores = []
    for b in bindings:
        v = b.value
        if _op(v) not in _CORES or not all(_float32(a) for a in v.args[:2]) or not isinstance(v.args[0], relax.Var):
            continue
        w = v.args[1]
        other = None
        if isinstance(w, relax.Var):
            bound = value.get(w)
            other = bound.args[0] if _op(bound) == "relax.permute_dims" and isinstance(bound.args[0], relax.Var) else w
        core = Core(b.var, _op(v).split(".")[-1], v.args[0], w if _is_const(w) else None,
                    other, None, b.var)
        nxt = user.get(core.end)
        if core.weight is not None and nxt is not None and _op(nxt.value) == "relax.add" \
                and any(_is_const(a) and _float32(a) for a in nxt.value.args):
            core.bias = core.end = nxt.var
            nxt = user.get(core.end)
        if nxt is not None and _op(nxt.value) == "relax.nn.relu":
            core.end = nxt.var
        cores.append(core)
    return cores


def observed(cores: list[Core]) -> list:
    """The tensors calibration measures: each core's inputs and each chain's end, once each."""
    seen: list = []
    for c in cores:
        for v in (c.x, c.other, c.end):
            if v is not None and not any(v.same_as(s) for s in seen):
                seen.append(v)
    return seen


def calibrate(func, tensors: list, samples: list[list[np.ndarray]]) -> list[tuple[float, float]]:
    """(min, max) of each of ``tensors`` (vars of the non-dataflow ``func``) over the
    calibration ``samples`` (one list of input arrays each), from TVM's build of ``func``
    returning them."""
    body = relax.SeqExpr(func.body.blocks, relax.Tuple(tensors))
    probe = relax.Function(func.params, body, relax.TupleType([t.ty for t in tensors]))
    vm = relax_vm(build(tvm.IRModule({"main": probe}), host_target()), tvm.cpu())
    lo = [np.inf] * len(tensors)
    hi = [-np.inf] * len(tensors)
    for arrays in samples:
        outs = vm["main"](*[to_tensor(a) for a in arrays])
        for i, out in enumerate(outs):
            values = out.numpy()
            lo[i], hi[i] = min(lo[i], float(values.min())), max(hi[i], float(values.max()))
    return list(zip(lo, hi))


def _pow2(value: float) -> float:
    return float(2.0 ** np.ceil(np.log2(value)))


def activation_params(lo: float, hi: float, dtype: str, power_of_two: bool) -> tuple[float, int]:
    """(scale, zero point) of a tensor observed in [lo, hi]: ONNX Runtime's MinMax (the range
    widened to hold 0, asymmetric), or with ``power_of_two`` symmetric with a power-of-two
    scale (a uint8 tensor with no negative value keeps zero point 0)."""
    qmin, qmax = ACT_RANGE[dtype]
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if power_of_two:
        if dtype == "uint8" and lo >= 0:
            return _pow2(max(hi, 1e-8) / qmax), 0
        zero = 0 if dtype == "int8" else 128
        return _pow2(max(-lo, hi, 1e-8) / 127), zero
    scale = max(hi - lo, 1e-8) / (qmax - qmin)
    return float(np.float32(scale)), int(np.clip(round(qmin - lo / scale), qmin, qmax))


def weight_params(w: np.ndarray, axis: int, power_of_two: bool) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, scales): symmetric per output channel (``axis``), or with
    ``power_of_two`` one power-of-two scale for the tensor."""
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    peak = np.abs(moved).max(axis=1)
    if power_of_two:
        scale = np.full(w.shape[axis], _pow2(max(float(peak.max()), 1e-8) / 127), np.float32)
    else:
        scale = (np.maximum(peak, 1e-8) / 127).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype("int8")
    return q, scale


def _const(value, dtype: str):
    return relax.const(np.asarray(value).astype(dtype), dtype)


def _dequantized(q: np.ndarray, scale: np.ndarray, zero_dtype: str, axis: int, shape, name: str):
    """A function of the block builder emitting ``dequantize(q)`` (per channel along ``axis``
    unless ``scale`` is one value), reshaped to ``shape``."""

    def emit(bb):
        s = scale.reshape(()) if scale.size == 1 else scale
        dq = bb.emit(relax.op.dequantize(relax.const(q), _const(s, "float32"), _const(np.zeros(s.shape), zero_dtype),
                                         axis if s.ndim else -1), name)
        return dq if tuple(q.shape) == tuple(shape) else bb.emit(relax.op.reshape(dq, shape), name + "_r")

    return emit


class _Plan:
    """What `quantize_static` inserts: a QDQ pair after each observed tensor (``qdq``: var ->
    (scale, zero point)), a dequantized int8 weight into each core and a dequantized int32
    bias into each bias add (``args``: binding var -> {argument index: emitter})."""

    def __init__(self, cores: list[Core], ranges: dict, act_dtype: str, power_of_two: bool, values: dict):
        self.act_dtype = act_dtype
        self.values = values  # var -> the value bound to it
        self.qdq = {v: activation_params(lo, hi, act_dtype, power_of_two) for v, (lo, hi) in ranges.items()}
        self.args: dict = {}
        for c in cores:
            if c.weight is not None:
                self._core(c, power_of_two)

    def _core(self, c: Core, power_of_two: bool):
        w = const_value(c.weight)
        axis = 0 if c.kind == "conv2d" else w.ndim - 1
        w_q, sw = weight_params(w, axis, power_of_two)
        sw = sw[:1] if power_of_two else sw
        self.args[c.var] = {1: _dequantized(w_q, sw, "int8", axis, w.shape, c.var.name + "_weight")}
        if c.bias is None:
            return
        add = self.values[c.bias]
        index = next(i for i, a in enumerate(add.args) if _is_const(a))
        b = const_value(add.args[index])
        channels = w.shape[axis]
        if b.size != channels:
            return  # not a per-channel bias: left float, outside the chain
        sb = (sw * np.float32(self.qdq[c.x][0])).astype(np.float32)
        info = np.iinfo(np.int32)
        b_q = np.clip(np.round(b.reshape(-1).astype(np.float64) / sb), info.min, info.max).astype("int32")
        self.args[c.bias] = {index: _dequantized(b_q, sb, "int32", 0, b.shape, c.var.name + "_bias")}


@mutator
class _Insert(PyExprMutator):
    """Rebuilds a non-dataflow function with a `_Plan`'s quantization inserted."""

    def __init__(self, mod, plan: _Plan, params: list):
        super().__init__(mod)
        self.plan = plan
        self.pending = [p for p in params if p in plan.qdq]

    def _qdq(self, key, var, name: str):
        scale, zero = self.plan.qdq[key]
        s, z = _const(scale, "float32"), _const(zero, self.plan.act_dtype)
        q = self.builder_.emit(relax.op.quantize(var, s, z, -1, self.plan.act_dtype), name + "_q")
        return self.builder_.emit(relax.op.dequantize(q, s, z, -1), name + "_dq")

    def visit_var_binding_(self, binding):
        for param in self.pending:  # the model's own inputs, before the first binding
            self.set_var_remap(param, self._qdq(param, param, param.name))
        self.pending = []
        value = self.visit_expr(binding.value)
        replace = self.plan.args.get(binding.var)
        if replace:
            args = [replace[i](self.builder_) if i in replace else a for i, a in enumerate(value.args)]
            value = relax.Call(value.op, args, value.attrs, value.ty_args)
        new = self.builder_.emit(value, binding.var.name)
        if binding.var in self.plan.qdq:
            new = self._qdq(binding.var, new, binding.var.name)
        self.set_var_remap(binding.var, new)


def quantize_static(mod, entry: str, samples: list[list[np.ndarray]], act_dtype: str = "uint8", *,
                    power_of_two: bool = False):
    """``mod`` (a float Relax module, weights bound as constants) with ``mod[entry]``'s cores
    quantized in QDQ form, calibrated on ``samples`` (each a list of the entry's input arrays;
    see the module's docstring)."""
    if act_dtype not in ACT_RANGE:
        raise ValueError(f"act_dtype must be uint8 or int8, got {act_dtype!r}")
    flat = relax.transform.ToNonDataflow()(mod)
    func = flat[entry]
    cores = find_cores(func)
    if not cores:
        return mod
    tensors = observed(cores)
    ranges = dict(zip(tensors, calibrate(func, tensors, samples)))
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    plan = _Plan(cores, ranges, act_dtype, power_of_two, values)
    inserter = _Insert(flat, plan, list(func.params))
    gv = flat.get_global_var(entry)
    inserter.builder_.update_func(gv, inserter.visit_expr(func))
    out = inserter.builder_.get()
    return relax.transform.ConvertToDataflow(min_size=1)(relax.transform.Normalize()(out))


__all__ = ["Core", "activation_params", "calibrate", "find_cores", "observed", "quantize_static", "weight_params"]
