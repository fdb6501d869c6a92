"""Load the workloads a user points tirbyoc at: TVMScript Python files and ONNX models.

Each loader returns an IRModule of schedulable PrimFuncs (a Relax module is legalized with
TVM's ``LegalizeOps`` first), or raises `LoadError` saying what is wrong with which file.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from .errors import TirbyocError


class LoadError(TirbyocError):
    """A workload file that cannot be loaded (missing, malformed, raises at import, ...)."""


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


def load_python(path: Path, obj: str | None = None):
    """The PrimFunc or IRModule a Python file defines (``obj`` picks one by name)."""
    from ._tvm import IRModule

    try:
        namespace = runpy.run_path(str(path), run_name="__tirbyoc_workload__")
    except SyntaxError as err:
        raise LoadError(f"{path}:{err.lineno}: Python syntax error: {err.msg}") from None
    except Exception as err:  # the user's file failed while importing
        raise LoadError(f"{path} raised {type(err).__name__} while being imported: {err}") from err
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


def load_onnx(path: Path, opset: int | None = None):
    """An ONNX model imported with TVM's Relax frontend and legalized."""
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
        mod = from_onnx(model, opset=opset, keep_params_in_input=False)
    except Exception as err:
        raise LoadError(f"TVM could not import {path}: {type(err).__name__}: {err}") from err
    return legalize(mod)


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
