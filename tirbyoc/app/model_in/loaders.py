"""The file loaders behind `tirbyoc.app.model_in.frontends`: ONNX models and Python files.

Each returns an IRModule (a Relax module, or TensorIR), or raises `LoadError` saying what is
wrong with which file; `legalize` turns a Relax module's operators into PrimFuncs.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from tvm import relax
from tvm.relax.frontend import nn

from tirbyoc._tvm import IRModule, PrimFunc
from tirbyoc.app.model_in.load_errors import LoadError, ModelImportError
from tirbyoc.app.model_in.torch_export import from_torch


def legalize(mod):
    """Relax functions -> PrimFuncs called through ``call_tir`` (TVM's ``LegalizeOps``)."""

    if any(isinstance(f, relax.Function) for f in mod.functions.values()):
        mod = relax.transform.LegalizeOps()(mod)
    return mod


def _run_python_file(path: Path, run_name: str) -> dict:
    """The namespace a user's Python file defines; its errors (and a ``sys.exit``, which must
    not end this process) become `LoadError` naming the file."""
    try:
        return runpy.run_path(str(path), run_name=run_name)
    except SyntaxError as err:
        raise LoadError(f"{path}:{err.lineno}: Python syntax error: {err.msg}") from None
    except (Exception, SystemExit) as err:
        raise LoadError(f"{path} raised {type(err).__name__} while being imported: {err}") from None


def _pick_function(mod, obj: str):
    """The module with only its function ``obj`` (``--object`` naming a function inside a
    module, e.g. one PrimFunc of a module of workloads)."""

    names = [gv.name_hint for gv in mod.get_global_vars()]
    if obj not in names:
        return None
    gv = mod.get_global_var(obj)
    return IRModule({gv: mod[gv]})


def import_onnx(path: Path, opset: int | None = None, shapes: dict | None = None):
    """An ONNX model imported with TVM's Relax frontend (not legalized). The file is parsed
    as protobuf data and checked with ``onnx.checker``; nothing in it is executed. ``shapes``
    (input name -> shape) fixes dynamic dimensions (a batch-dynamic export)."""
    try:
        # deferred: optional dependency (onnx; TVM's ONNX frontend imports it too)
        import onnx
        from tvm.relax.frontend.onnx import from_onnx
    except ImportError:
        raise LoadError("reading .onnx files needs the onnx package: pip install 'tirbyoc[onnx]'") from None
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise LoadError(f"{path} is not a valid ONNX model: {type(err).__name__}: {err}") from None
    if shapes:
        inputs = [i.name for i in model.graph.input]
        unknown = sorted(set(shapes) - set(inputs))
        if unknown:
            raise LoadError(f"--input-shape names {unknown}, which {path} does not take; its inputs "
                            f"are {inputs}")

    try:
        return from_onnx(model, shape_dict=dict(shapes) if shapes else None, opset=opset,
                         keep_params_in_input=False)
    except Exception as err:
        raise ModelImportError(f"TVM could not import {path}: {type(err).__name__}: {err}") from err


def _relax_functions(mod) -> list[str]:

    return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]


def _kind(value, torch) -> str | None:
    """What a file-level object is as a model, or None."""


    if isinstance(value, IRModule):
        return "Relax module" if _relax_functions(value) else "TensorIR module"
    if isinstance(value, PrimFunc):
        return "PrimFunc"
    if isinstance(value, relax.Function):
        return "Relax function"
    if torch is not None and isinstance(value, torch.nn.Module):
        return "torch.nn.Module"
    if isinstance(value, nn.Module):
        return "relax.frontend.nn.Module"
    return None


def _as_module(path: Path, name: str, value, kind: str, public: dict):

    if kind in ("Relax module", "TensorIR module"):
        return value
    if kind in ("PrimFunc", "Relax function"):
        return IRModule({name: value})
    if kind == "torch.nn.Module":
        return from_torch(path, value, public)
    spec = public.get("spec")
    if not isinstance(spec, dict):
        raise LoadError(f"{path}: a relax.frontend.nn model needs `spec`, its export_tvm "
                        "spec, e.g. {'forward': {'x': nn.spec.Tensor((1, 64), 'float32')}}")
    try:
        mod, _ = value.export_tvm(spec)
    except Exception as err:
        raise ModelImportError(f"{path}: export_tvm failed: {type(err).__name__}: {err}") from err
    return mod


# When a file defines several models, the one a command takes without --object: a whole
# model before a single kernel.
_PREFERENCE = ("Relax module", "torch.nn.Module", "relax.frontend.nn.Module", "Relax function",
               "TensorIR module", "PrimFunc")


def load_python_file(path: Path, obj: str | None = None):
    """An IRModule (not legalized) from a ``.py`` file defining

    * a Relax ``IRModule`` (TVMScript ``@I.ir_module`` with an ``@R.function``),
    * a ``torch.nn.Module`` instance plus ``example_inputs`` (a tuple of tensors), imported
      with ``torch.export`` and TVM's PyTorch frontend,
    * a ``tvm.relax.frontend.nn.Module`` instance plus ``spec`` (its ``export_tvm`` spec),
    * a TensorIR PrimFunc, or an ``IRModule`` of them (workloads).

    ``obj`` names the object to take when the file defines several, or one function inside a
    module (``--object dense_int8`` of a module of workloads); without it, a file with several
    candidates of the same kind is refused with their names. `tirbyoc.app.model_in.frontends` calls it
    for a ``.py`` model.
    """
    namespace = _run_python_file(path, "__tirbyoc_model__")
    public = {k: v for k, v in namespace.items() if not k.startswith("_")}
    torch = __import__("sys").modules.get("torch")
    found = {k: kind for k, v in public.items() if (kind := _kind(v, torch)) is not None}
    listing = ", ".join(f"{k} ({kind})" for k, kind in sorted(found.items())) or "none"
    if obj is not None:
        if obj in found:
            return _as_module(path, obj, public[obj], found[obj], public)
        for name, kind in found.items():
            if kind in ("Relax module", "TensorIR module"):
                picked = _pick_function(public[name], obj)
                if picked is not None:
                    return picked
        raise LoadError(f"{path} defines no model or function named {obj!r}; its candidates: {listing}")
    if not found:
        raise LoadError(f"{path} defines no model: write a Relax IRModule (@I.ir_module), a "
                        "torch.nn.Module instance with example_inputs, a relax.frontend.nn.Module "
                        "instance with spec, or a TensorIR PrimFunc")
    for kind in _PREFERENCE:
        names = sorted(k for k, v in found.items() if v == kind)
        if len(names) == 1:
            return _as_module(path, names[0], public[names[0]], kind, public)
        if len(names) > 1:
            raise LoadError(f"{path} defines several candidates: {listing}; choose one with "
                            "--object NAME")
    raise AssertionError("unreachable: every kind is in _PREFERENCE")


