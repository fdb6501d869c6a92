"""A torch model in a ``.py`` file, imported: ``torch.export`` then TVM's PyTorch frontend.

The file defines the module, ``example_inputs`` (a tuple of tensors it is called with) and,
for sizes known only at run time, ``dynamic_shapes`` as ``torch.export`` takes it (per input,
``{dim: torch.export.Dim("batch", ...)}``). torch names a dynamic dimension by a symbol of its
own (``s77``); the Relax module gets the ``Dim``'s name instead, so that ``--size batch=1,3``
and the manifest of ``tirbyoc build`` speak the model's words, and torch's bounds on it stay
(``tir_var_upper_bound``, which TVM's memory planning reads).
"""

from __future__ import annotations

import inspect
from pathlib import Path

from tirbyoc._tvm import expr_dtype, tirx
from tvm import relax

from tirbyoc.app.model_in.load_errors import LoadError, ModelImportError
from tirbyoc.relax.pt2e import CONVERTERS as PT2E_CONVERTERS
from tirbyoc.relax.pt2e import fold_constant_casts

BOUND_ATTRS = ("tir_var_upper_bound", "tir_var_lower_bound")


def from_torch(path: Path, model, namespace: dict):
    """The Relax module of ``model`` as the file's ``example_inputs`` and ``dynamic_shapes``
    export it (see the module's docstring)."""
    example = namespace.get("example_inputs")
    if not isinstance(example, tuple):
        raise LoadError(f"{path}: a torch.nn.Module model needs `example_inputs`, a tuple of "
                        "tensors it is called with (torch.export traces it with them)")
    dynamic = namespace.get("dynamic_shapes")
    # deferred: optional dependency (torch; TVM's PyTorch frontend imports it too)
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    try:
        exported = torch.export.export(_in_eval_mode(model), example, dynamic_shapes=dynamic)
        # PT2E's quantize/dequantize ops: TVM's frontend has no converter of its own
        mod = from_exported_program(exported, keep_params_as_input=False, custom_convert_map=PT2E_CONVERTERS)
    except Exception as err:
        raise ModelImportError(f"{path}: exporting the torch model failed: {type(err).__name__}: {err}") from err
    names = dim_names(exported, model, dynamic) if dynamic is not None else {}
    return fold_constant_casts(renamed_sizes(mod, names) if names else mod)


def _in_eval_mode(model):
    """``model`` in inference mode; a PT2E model (an exported GraphModule, which refuses
    ``eval()``) is used as it is, as ``convert_pt2e`` left it."""
    try:
        return model.eval()
    except NotImplementedError:
        return model


def dim_names(exported, model, dynamic) -> dict[str, str]:
    """torch's symbol (``"s77"``) -> the name of the ``Dim`` the user gave for it, read from
    the exported program's input placeholders, in the order of ``dynamic_shapes``."""
    specs = _per_input(model, dynamic)
    vals = [n.meta.get("val") for n in exported.graph_module.graph.nodes
            if n.op == "placeholder" and n.name in set(exported.graph_signature.user_inputs)]
    names: dict[str, str] = {}
    for spec, val in zip(specs, vals):
        pairs = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, dim in pairs:
            name = getattr(dim, "__name__", None)
            size = val.shape[axis] if val is not None and hasattr(val, "shape") else None
            if name and hasattr(size, "node"):
                names.setdefault(str(size.node.expr), name)
    return names


def _per_input(model, dynamic) -> list:
    """``dynamic_shapes`` as one entry per positional input (a dict is keyed by the forward
    function's parameter names)."""
    if isinstance(dynamic, dict):
        params = list(inspect.signature(model.forward).parameters)
        return [dynamic.get(p) for p in params]
    return list(dynamic)


def renamed_sizes(mod, names: dict[str, str]):
    """``mod`` with each Relax function's size variables renamed (``names``: old -> new),
    their bound attributes following them."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        present = {str(v.name): v for v in relax.analysis.defined_symbolic_vars(func)}
        binding = {present[o]: tirx.Var(n, expr_dtype(present[o])) for o, n in names.items() if o in present}
        if not binding:
            continue
        new = func.bind_symbolic_vars(binding)
        for attr in BOUND_ATTRS:
            bounds = func.attrs.get(attr) if func.attrs is not None else None
            if bounds is not None:
                new = new.with_attr(attr, {names.get(str(k), str(k)): v for k, v in bounds.items()})
        mod[gv] = new
    return mod
