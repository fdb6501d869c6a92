"""Inputs for a whole model: seeded, in each input's valid domain, with weights at the scale
a trained network has; or the user's own.

A model's entry function takes its activations and (for ``relax.frontend.nn`` exports and
the built-ins) its weights. Uniform [-1, 1] weights make deep float networks overflow
(ResNet-50's activations grow ~sqrt(fan-in) per layer: all NaN by the head), so a float
parameter named ``*.weight`` is drawn as ``torch.nn`` initialises it, uniform in
``+-1/sqrt(fan_in)`` (its ``*.bias`` too, with the weight's fan-in), a 1-D ``weight`` (a norm's
scale) around 1. Every other input gets the domain its uses imply
(`tirbyoc.ir.domains`, read from the PrimFuncs it is passed to through ``call_tir``): token ids
within the embedding table, shift amounts below the width, non-zero divisors.
"""

from __future__ import annotations

from math import prod, sqrt

import numpy as np
from tvm import relax

from tirbyoc._tvm import is_buffer, tirx, tvm
from tirbyoc.dtypes import numpy_dtype
from tirbyoc.errors import TirbyocError
from tirbyoc.ir.domains import Domain, buffer_domains, draw


def _shape(param) -> tuple[int, ...] | None:
    """A Relax parameter's static shape, or None when a dimension is symbolic."""
    try:
        return tuple(int(d) for d in param.ty.shape.values)  # TVM 0.27: struct info is ``.ty``
    except (AttributeError, TypeError):
        return None


def _static_shape(param, sizes: dict | None = None) -> tuple[int, ...]:
    """A parameter's shape, its named dimensions given by ``sizes`` (``{"n": 17}``)."""
    shape = _shape(param)
    if shape is not None:
        return shape
    dims = list(param.ty.shape.values) if getattr(param.ty, "shape", None) is not None else []
    named = [str(d.name) for d in dims if isinstance(d, tirx.Var)]
    if dims and len(named) == sum(1 for d in dims if not isinstance(d, tirx.IntImm)) and \
            all(n in (sizes or {}) for n in named):
        return tuple(sizes[str(d.name)] if isinstance(d, tirx.Var) else int(d) for d in dims)
    how = f"--size {named[0]}=V1,V2,... (runs the model at each), " if named else ""
    raise TirbyocError(
        f"model input {param.name!r} has no static shape ({param.ty}); give its sizes with {how}"
        "its shape (--input-shape NAME=D0,D1,...) or its values (--inputs FILE.npz)")


def call_tir_domains(mod, func) -> dict[str, Domain]:
    """``{parameter name: Domain}`` for ``func``'s parameters that are passed straight to a
    PrimFunc (``R.call_tir``) whose use of that buffer implies a domain; a parameter passed
    to several gets the intersection."""


    call_tir = tvm.ir.Op.get("relax.call_tir")
    params = {p.name: p for p in func.params}
    found: dict[str, Domain] = {}
    cache: dict[str, dict] = {}  # callee -> {argument position: Domain}
    callees = {g.name_hint for g in mod.get_global_vars()}

    def visit(expr):
        if not (isinstance(expr, relax.Call) and expr.op.same_as(call_tir)):
            return
        gv = expr.args[0]
        if gv.name_hint not in cache:
            prim = mod[gv] if gv.name_hint in callees else None
            domains = buffer_domains(prim) if isinstance(prim, tirx.PrimFunc) else {}
            cache[gv.name_hint] = {i: domains[str(b.name)] for i, b in enumerate(prim.params)
                                   if is_buffer(b) and str(b.name) in domains} if domains else {}
        args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else [expr.args[1]]
        for i, arg in enumerate(args):
            dom = cache[gv.name_hint].get(i)
            if dom is not None and isinstance(arg, relax.Var) and arg.name in params and params[arg.name].same_as(arg):
                name = arg.name
                found[name] = found[name].intersect(dom) if name in found else dom

    relax.analysis.post_order_visit(func, visit)
    return found


def weight_bound(name: str, shapes: dict[str, tuple]) -> Domain | None:
    """The torch.nn initialisation range of a float parameter named like a layer's weight or
    bias (``conv.weight``, ``fc.bias``), or None for anything else."""
    prefix, _, last = name.rpartition(".")
    if last == "weight":
        shape = shapes[name]
        if len(shape) >= 2:
            b = 1.0 / sqrt(max(1, prod(shape[1:])))
            return Domain(-b, b, why="a layer's weight: +-1/sqrt(fan-in)")
        return Domain(0.75, 1.25, why="a norm's scale: around 1")
    if last == "bias":
        weight = shapes.get(f"{prefix}.weight") if prefix else None
        fan_in = prod(weight[1:]) if weight is not None and len(weight) >= 2 else None
        b = 1.0 / sqrt(fan_in) if fan_in else 0.1
        return Domain(-b, b, why="a layer's bias")
    return None


def model_inputs(mod, entry: str, seed: int, given: dict | None = None,
                 sizes: dict | None = None) -> list[np.ndarray]:
    """One array per parameter of ``mod[entry]``: ``given[name]`` where the user gave it, else
    seeded data in the parameter's domain (see the module's docstring), a named dimension
    (``n``) of the size ``sizes`` gives it."""
    func = mod[entry]
    params = list(func.params)
    given = dict(given or {})
    if "" in given and params:  # a bare .npy: the first input
        given[params[0].name] = given.pop("")
    unknown = sorted(set(given) - {p.name for p in params})
    if unknown:
        raise TirbyocError(f"--inputs names {unknown}, which the model's {entry} does not take; "
                           f"its inputs are {[p.name for p in params]}")
    domains = call_tir_domains(mod, func)
    shapes = {p.name: (_static_shape(p, sizes) if p.name not in given else None) for p in params}
    rng = np.random.default_rng(seed)
    arrays = []
    for p in params:
        name, dtype = p.name, str(p.ty.dtype)
        if name in given:
            arrays.append(_given(p, given[name]))
            continue
        domain = domains.get(name)
        if dtype.startswith(("float", "bfloat")):
            bound = weight_bound(name, shapes)
            if bound is not None:
                domain = bound if domain is None else domain.intersect(bound)
        arrays.append(draw(shapes[name], dtype, rng, domain))
    return arrays


def _given(param, value) -> np.ndarray:
    dtype = str(param.ty.dtype)
    arr = np.ascontiguousarray(np.asarray(value).astype(numpy_dtype(dtype)))
    want = _shape(param)
    if want is None:
        return arr  # a symbolic shape: the model checks it when it runs
    if arr.shape != want:
        raise TirbyocError(f"input {param.name!r} has shape {arr.shape}; the model wants {want}")
    return arr


def load_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (or one ``.npy``, for a one-input model) file by name."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise TirbyocError(f"--inputs {path}: cannot read it as .npz or .npy ({err})") from None
    if isinstance(data, np.ndarray):
        return {"": data}  # one array: the model's first input
    with data:
        return {k: data[k] for k in data.files}


__all__ = ["call_tir_domains", "load_inputs", "model_inputs", "weight_bound"]
