"""A float model's ReLU6 as Relax operators again, so that the layout conversion moves it.

TVM's ONNX importer writes ``Clip(x, min, max)`` as two TensorIR calls, ``call_tir(maximum,
(x, lo))`` then ``call_tir(minimum, (.., hi))``, each against a 0-d tensor. ``ConvertLayout``
has no rule for a ``call_tir``: converted to NHWC, MobileNetV2's 35 ReLU6 each ran between a
transpose to NCHW and one back (AMD Zen 4, one thread: 14 of its 20 ms). Each such call whose
PrimFunc is exactly ``out[i] = max(x[i], s[()])`` (or ``min``) over the whole tensor is written
back as ``relax.op.maximum(x, s)`` (``minimum``), which legalizes to the same computation, so
the values are the same bit for bit, and which follows the layout like any elementwise operator.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax import expr_functor

import tvm_ffi

from tirbyoc._tvm import TensorLoad, tirx

OPS = {tirx.Max: relax.op.maximum, tirx.Min: relax.op.minimum}


def _scalar_bound(func) -> object | None:
    """The Relax operator ``func`` (a PrimFunc) computes when it is one elementwise max / min of
    its first parameter with its second, a 0-d buffer; else None."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) != 3:
        return None
    x, s, out = func.params
    if len(s.shape) != 0 or list(x.shape) != list(out.shape) or str(x.dtype) != str(out.dtype):
        return None
    stores = []
    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, stores.append), order="pre")
    if len(stores) != 1 or not stores[0].buffer.same_as(out):
        return None
    value, indices = stores[0].value, list(stores[0].indices)
    op = OPS.get(type(value))
    if op is None:
        return None
    a, b = value.a, value.b
    same = isinstance(a, TensorLoad) and a.source.same_as(x) and len(a.indices) == len(indices) and \
        all(i.same_as(j) for i, j in zip(a.indices, indices))
    scalar = isinstance(b, TensorLoad) and b.source.same_as(s)
    return op if same and scalar else None


@expr_functor.mutator
class _Restorer(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod, self.restored = mod, 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.call_tir" or not isinstance(call.args[1], relax.Tuple):
            return call
        callee = self.mod.functions.get(call.args[0]) if isinstance(call.args[0], relax.GlobalVar) else None
        op = _scalar_bound(callee)
        if op is None or len(call.args[1].fields) != 2:
            return call
        self.restored += 1
        return op(*call.args[1].fields)


def restore_scalar_bounds(mod):
    """(``mod`` with its scalar-bound ``call_tir`` calls as Relax operators, how many);
    the PrimFuncs no longer called are dropped."""
    restorer = _Restorer(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            restorer.builder_.update_func(gv, restorer.visit_expr(func))
    new = restorer.builder_.get()
    return (relax.transform.DeadCodeElimination()(new) if restorer.restored else mod), restorer.restored


__all__ = ["restore_scalar_bounds"]
