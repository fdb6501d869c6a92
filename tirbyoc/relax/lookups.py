"""What the byte tables (`tirbyoc.relax.byte_tables`, `tirbyoc.relax.byte_softmax`) share:
computing a table with TVM's own build, and the lookup PrimFuncs TVM's fusion must take for
what they are.

A table is computed by compiling Relax functions of the model's own operators over every byte
(or pair of bytes) for the model's target and running them here, so each entry is the value
TVM's build of the untouched model computes at that input. A lookup is a PrimFunc of its own
(``call_te``), marked with `LOOKUP_ATTR`: TVM's operator-pattern analysis takes its
data-dependent load for opaque, which would keep it out of its producer's fused function;
`elementwise_lookups` (run by `tirbyoc.relax.bridge.fuse`) gives it the pattern it has.
"""

from __future__ import annotations

import numpy as np

from tirbyoc._tvm import expr_dtype, make_target, relax_vm, tirx, tvm

# a lookup PrimFunc's attribute: the operator pattern `fuse` gives it - 0, elementwise (one
# byte's table); 1, broadcast (a softmax's row byte along its axis)
LOOKUP_ATTR = "tirbyoc.byte_lookup"


def bits(v):
    """A byte ``v`` (a TE expression) as the uint8 of its bits: a table's index (an int8 -1
    is entry 255)."""
    return v if expr_dtype(v) == "uint8" else v.astype("uint8")


def all_bytes(dtype: str) -> np.ndarray:
    """The 256 values of 8-bit ``dtype`` in table order (by their bits)."""
    return np.arange(256, dtype=np.uint8).view(dtype)


def as_lookup(builder, call, pattern: int):
    """``call`` (a ``call_tir`` from ``call_te``), its PrimFunc marked as a lookup of operator
    ``pattern`` (`LOOKUP_ATTR`)."""
    gv = call.args[0]
    builder.update_func(gv, builder.get()[gv].with_attr(LOOKUP_ATTR, pattern))
    return call


def elementwise_lookups(mod):
    """``mod`` (op patterns annotated) with each lookup PrimFunc's ``op_pattern`` the one its
    `LOOKUP_ATTR` says."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and LOOKUP_ATTR in func.attrs:
            mod[gv] = func.with_attr("op_pattern", int(func.attrs[LOOKUP_ATTR]))
    return mod


def run_with_tvm(functions: dict, inputs: dict, target) -> dict:
    """Each Relax function of ``functions`` (name -> function) run on its ``inputs`` (name ->
    arrays), compiled together by TVM's default build for ``target``: name -> output array."""
    funcs = {name: f.with_attr("global_symbol", name) for name, f in functions.items()}
    vm = relax_vm(tvm.compile(tvm.IRModule(funcs), target=make_target(target)), tvm.cpu())
    return {name: vm[name](*[tvm.runtime.tensor(a) for a in inputs[name]]).numpy() for name in funcs}


__all__ = ["LOOKUP_ATTR", "all_bytes", "as_lookup", "bits", "elementwise_lookups", "run_with_tvm"]
