"""Load the workloads a user points tirbyoc at: TVMScript Python files and ONNX models.

Each loader returns an IRModule of schedulable PrimFuncs (a Relax module is legalized with
TVM's ``LegalizeOps`` first), or raises `LoadError` saying what is wrong with which file.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from .errors import ModelError, TirbyocError


class LoadError(TirbyocError):
    """A workload file that cannot be loaded (missing, malformed, raises at import, ...)."""


class ModelImportError(LoadError, ModelError):
    """TVM's importer (or torch.export, or the model file's own code) failed on the model
    (exit code 3, where a file tirbyoc cannot use is a usage error, 2)."""


def legalize(mod):
    """Relax functions -> PrimFuncs called through ``call_tir`` (TVM's ``LegalizeOps``)."""
    from tvm import relax

    if any(isinstance(f, relax.Function) for f in mod.functions.values()):
        mod = relax.transform.LegalizeOps()(mod)
    return mod


def _candidates(namespace: dict) -> dict[str, object]:
    from ._tvm import IRModule, PrimFunc

    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and isinstance(v, (PrimFunc, IRModule))}


def _run_python_file(path: Path, run_name: str) -> dict:
    """The namespace a user's Python file defines; its errors (and a ``sys.exit``, which must
    not end this process) become `LoadError` naming the file."""
    try:
        return runpy.run_path(str(path), run_name=run_name)
    except SyntaxError as err:
        raise LoadError(f"{path}:{err.lineno}: Python syntax error: {err.msg}") from None
    except (Exception, SystemExit) as err:
        raise LoadError(f"{path} raised {type(err).__name__} while being imported: {err}") from None


def load_python(path: Path, obj: str | None = None):
    """The PrimFunc or IRModule a Python file defines (``obj`` picks one by name)."""
    from ._tvm import IRModule

    namespace = _run_python_file(path, "__tirbyoc_workload__")
    found = _candidates(namespace)
    if obj is not None:
        if obj not in namespace:
            raise LoadError(f"{path} defines no object named {obj!r}; it defines "
                            f"{sorted(found) or 'no PrimFunc or IRModule'}")
        value = namespace[obj]
        if obj not in found:
            raise LoadError(f"{path}: {obj!r} is a {type(value).__name__}, not a PrimFunc or IRModule")
    else:
        if not found:
            raise LoadError(f"{path} defines no PrimFunc or IRModule (write one with "
                            "@T.prim_func(s_tir=True) or @I.ir_module)")
        if len(found) > 1:
            raise LoadError(f"{path} defines several workloads {sorted(found)}; choose one with --object NAME")
        (value,) = found.values()
    if not isinstance(value, IRModule):
        value = IRModule({obj or next(iter(found)): value})
    return legalize(value)


def import_onnx(path: Path, opset: int | None = None):
    """An ONNX model imported with TVM's Relax frontend (not legalized). The file is parsed
    as protobuf data and checked with ``onnx.checker``; nothing in it is executed."""
    try:
        import onnx
    except ImportError:
        raise LoadError("reading .onnx files needs the onnx package: pip install 'tirbyoc[onnx]'") from None
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise LoadError(f"{path} is not a valid ONNX model: {type(err).__name__}: {err}") from None
    from tvm.relax.frontend.onnx import from_onnx

    try:
        return from_onnx(model, opset=opset, keep_params_in_input=False)
    except Exception as err:
        raise ModelImportError(f"TVM could not import {path}: {type(err).__name__}: {err}") from err


def load_onnx(path: Path, opset: int | None = None):
    """An ONNX model imported with TVM's Relax frontend and legalized."""
    return legalize(import_onnx(path, opset))


def _relax_functions(mod) -> list[str]:
    from tvm import relax

    return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]


def _from_torch(path: Path, model, namespace: dict):
    example = namespace.get("example_inputs")
    if not isinstance(example, tuple):
        raise LoadError(f"{path}: a torch.nn.Module model needs `example_inputs`, a tuple of "
                        "tensors it is called with (torch.export traces it with them)")
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    try:
        exported = torch.export.export(model.eval(), example)
        return from_exported_program(exported, keep_params_as_input=False)
    except Exception as err:
        raise ModelImportError(f"{path}: exporting the torch model failed: {type(err).__name__}: {err}") from err


def load_model_file(path: str | Path):
    """A Relax model (not legalized) from a file: ``.onnx``, or a ``.py`` file defining one of

    * a Relax ``IRModule`` (TVMScript ``@I.ir_module`` with an ``@R.function``),
    * a ``torch.nn.Module`` instance plus ``example_inputs`` (a tuple of tensors), imported
      with ``torch.export`` and TVM's PyTorch frontend,
    * a ``tvm.relax.frontend.nn.Module`` instance plus ``spec`` (its ``export_tvm`` spec).
    """
    from ._tvm import IRModule

    path = Path(path)
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    if path.suffix == ".onnx":
        return import_onnx(path)
    if path.suffix != ".py":
        raise LoadError(f"{path}: unsupported model file {path.suffix!r}; give an .onnx file or a "
                        ".py file defining a Relax IRModule, a torch.nn.Module or a relax nn.Module")
    namespace = _run_python_file(path, "__tirbyoc_model__")
    public = {k: v for k, v in namespace.items() if not k.startswith("_")}
    modules = {k: v for k, v in public.items() if isinstance(v, IRModule) and _relax_functions(v)}
    if len(modules) == 1:
        return next(iter(modules.values()))
    if len(modules) > 1:
        raise LoadError(f"{path} defines several Relax modules {sorted(modules)}; keep one")
    torch = __import__("sys").modules.get("torch")
    if torch is not None:
        models = [v for v in public.values() if isinstance(v, torch.nn.Module)]
        if len(models) == 1:
            return _from_torch(path, models[0], public)
    from tvm.relax.frontend import nn

    models = [v for v in public.values() if isinstance(v, nn.Module)]
    if len(models) == 1:
        spec = public.get("spec")
        if not isinstance(spec, dict):
            raise LoadError(f"{path}: a relax.frontend.nn model needs `spec`, its export_tvm "
                            "spec, e.g. {'forward': {'x': nn.spec.Tensor((1, 64), 'float32')}}")
        try:
            mod, _ = models[0].export_tvm(spec)
        except Exception as err:
            raise ModelImportError(f"{path}: export_tvm failed: {type(err).__name__}: {err}") from err
        return mod
    raise LoadError(f"{path} defines no model: write a Relax IRModule (@I.ir_module), a "
                    "torch.nn.Module instance with example_inputs, or a relax.frontend.nn.Module "
                    "instance with spec")


def load_workload(path: str | Path, obj: str | None = None):
    """Dispatch on the file's suffix: ``.py`` (TVMScript) or ``.onnx``."""
    path = Path(path)
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    if path.suffix == ".py":
        return load_python(path, obj)
    if path.suffix == ".onnx":
        return load_onnx(path)
    raise LoadError(f"{path}: unsupported file type {path.suffix!r}; give a .py file with TVMScript or an .onnx model")
