"""Where a model comes from: one registry of frontends and one function that loads any model.

A model is named by a spec: ``builtin:NAME`` (a built-in model, random weights), or a file
whose suffix says which frontend reads it (``.onnx``: TVM's ONNX importer; ``.py``: a Python
file defining a Relax module, a torch module, a ``relax.frontend.nn`` module or TensorIR).
`FRONTENDS` lists them; `load_model` finds the one that takes a spec and loads it, for every
command (`run`, `build`, `sweep`, `tune`, `match`); `is_float_model` asks it whether the
model computes in float only, before importing it (which template `tirbyoc run` picks).

**A new way in** (a TFLite file, a saved ``.pt2`` program) is a `Frontend` given to
`register_frontend`: the spec it takes (a ``prefix:`` or a ``.suffix``), how an error names
it, and its loader, which returns an IRModule that is not legalized yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tirbyoc.app.model_in.loaders import LoadError, import_onnx, load_python_file
from tirbyoc.app.model_in.models import MODELS, build_model
from tirbyoc.app.model_in.preparation import activation_dtype, requantize_mode
from tirbyoc.errors import TirbyocError

QUANTIZED_ONNX_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                                 "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"})


def _unknown(spec: str) -> bool | None:
    return None


@dataclass(frozen=True)
class Frontend:
    """One way in. ``takes``: a spec prefix ending in ``:`` or a file suffix starting with
    ``.``; ``what``: how an error message names what it takes; ``load(spec, templates, obj,
    input_shapes)``: the model as an IRModule (not legalized); ``is_float(spec)``: True / False
    where the model is known to compute in float only (or not) without importing it, else None;
    ``sizes(spec)``: the sizes of its named dimensions to run it at without ``--size``, or None."""

    name: str
    takes: str
    what: str
    load: Callable
    is_float: Callable[[str], "bool | None"] = _unknown
    sizes: Callable[[str], "dict | None"] = _unknown  # the sizes a model of named dimensions runs at by default
    sizes_are: str = "its own sizes"  # what those sizes are, in `size_origin`'s sentence

    def accepts(self, spec: str) -> bool:
        return spec.startswith(self.takes) if self.takes.endswith(":") else spec.endswith(self.takes)


def _builtin(spec: str, templates, obj, input_shapes):
    if obj is not None or input_shapes:
        raise TirbyocError("--object and --input-shape apply to model files, not built-in models")
    name = spec.split(":", 1)[1]
    if name not in MODELS:
        raise TirbyocError(f"unknown built-in model {name!r}; known: {sorted(MODELS)}")
    return build_model(name, activation_dtype(templates), requantize_mode(templates))


def _builtin_is_float(spec: str) -> bool | None:
    """A built-in without an integer variant of itself (``mlp``, ``resnet18``, not
    ``resnet18_int8``) is float."""
    builder = MODELS.get(spec.split(":", 1)[1])
    return None if builder is None else not getattr(builder, "quantized", False)


def _builtin_sizes(spec: str) -> dict | None:
    """A built-in of named dimensions (``llama_layer``'s ``seq``) runs at its own sizes."""
    return getattr(MODELS.get(spec.split(":", 1)[1]), "sizes", None)


def _existing(spec: str) -> Path:
    path = Path(spec)
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    return path


def _onnx(spec: str, templates, obj, input_shapes):
    path = _existing(spec)
    if obj is not None:
        raise LoadError(f"{path}: --object picks an object of a .py file; an ONNX file holds one model")
    return import_onnx(path, shapes=input_shapes)


@dataclass(frozen=True)
class _OnnxHeader:
    """What a command asks of an ONNX file before importing it: its operators and its inputs'
    named dimensions (an exporter's ``dim_param``)."""

    ops: frozenset
    named: tuple


@lru_cache(maxsize=8)
def _onnx_header_of(spec: str, _mtime_ns: int, _size: int) -> _OnnxHeader | None:
    try:
        import onnx  # deferred: an optional dependency (the reference extra), needed only for .onnx files

        proto = onnx.load(spec, load_external_data=False)
    except Exception:  # the loader reports a missing package or a bad file with context
        return None
    ops = {n.op_type for n in proto.graph.node} | {n.op_type for f in proto.functions for n in f.node}
    weights = {t.name for t in proto.graph.initializer}
    named = [d.dim_param for i in proto.graph.input if i.name not in weights
             for d in i.type.tensor_type.shape.dim if d.dim_param and not d.dim_value]
    return _OnnxHeader(frozenset(ops), tuple(dict.fromkeys(named)))


def _onnx_header(spec: str) -> _OnnxHeader | None:
    """`_OnnxHeader` of the file ``spec`` (None: unreadable), parsed once per version of the
    file: a model's weights inside the file make each parse a pass over all of it."""
    try:
        stat = Path(spec).stat()
    except OSError:
        return None
    return _onnx_header_of(spec, stat.st_mtime_ns, stat.st_size)


def _onnx_is_float(spec: str) -> bool | None:
    """An ONNX file without quantization operators is float (read without its weights)."""
    header = _onnx_header(spec)
    return None if header is None else not header.ops & QUANTIZED_ONNX_OPS


def _onnx_sizes(spec: str) -> dict | None:
    """An ONNX model's named dimensions (``batch``, ``seq``) at the smallest size, 1 each: an
    ONNX file declares no example sizes, and every dimension a served model leaves open takes
    1 (one sequence of one token). `size_origin` says so."""
    header = _onnx_header(spec)
    if header is None or not header.named:
        return None
    return {name: (1,) for name in header.named}


def _python(spec: str, templates, obj, input_shapes):
    path = _existing(spec)
    if input_shapes:
        raise LoadError("--input-shape applies to ONNX models; a .py model declares its shapes "
                        "(example_inputs, spec or the TVMScript signature)")
    return load_python_file(path, obj)


FRONTENDS: list[Frontend] = [
    Frontend("builtin", "builtin:", f"builtin:NAME (NAME one of {sorted(MODELS)})", _builtin, _builtin_is_float,
             _builtin_sizes),
    Frontend("onnx", ".onnx", "an .onnx file", _onnx, _onnx_is_float, _onnx_sizes,
             "the smallest sizes (the file declares none)"),
    Frontend("python", ".py", "a .py file (a Relax IRModule, a torch.nn.Module, a relax nn.Module "
             "or TensorIR PrimFuncs)", _python),
]


def register_frontend(frontend: Frontend) -> Frontend:
    """Add a way in (see the module's docstring); a frontend taking the same spec as one
    registered before it is refused."""
    clash = [f.name for f in FRONTENDS if f.takes == frontend.takes]
    if clash:
        raise TirbyocError(f"frontend {frontend.name!r}: {frontend.takes!r} is taken by {clash[0]!r}")
    FRONTENDS.append(frontend)
    return frontend


def frontend_for(spec: str) -> Frontend:
    """The frontend that takes ``spec``, or a usage error listing what each one takes."""
    for frontend in FRONTENDS:
        if frontend.accepts(spec):
            return frontend
    whats = [f.what for f in FRONTENDS]
    raise TirbyocError(f"model {spec!r}: give {', '.join(whats[:-1])} or {whats[-1]}")


def default_model(templates) -> str:
    """The model a command runs without one: the built-in MLP, quantized to the activation
    dtype of an int8 template."""
    return "builtin:" + ("mlp_int8" if activation_dtype(templates) else "mlp")


def load_model(spec: str | None, templates=(), obj: str | None = None,
               input_shapes: dict | None = None):
    """(the spec, the model as a Relax or TensorIR IRModule, not legalized) for ``spec`` (see
    the module's docstring; None or "builtin": `default_model`). ``obj`` picks an object of a
    ``.py`` file; ``input_shapes`` fixes an ONNX model's dynamic dimensions."""
    if spec in (None, "", "builtin"):
        spec = default_model(templates)
    return spec, frontend_for(spec).load(spec, templates, obj, input_shapes)


def default_sizes(spec: str | None) -> dict | None:
    """The sizes the model ``spec`` names runs at without ``--size`` (None: none of its own)."""
    try:
        return frontend_for(spec).sizes(spec) if spec else None
    except TirbyocError:
        return None


def sizes_to_run(spec: str | None, given: dict | None, input_shapes: dict | None = None) -> dict | None:
    """The sizes a command runs ``spec`` at: those ``given`` (``--size``), else the model's
    own (`default_sizes`: a built-in's named dimensions at its sizes, an ONNX file's at 1);
    none where ``input_shapes`` (``--input-shape``) fix the dimensions instead."""
    if given is not None or input_shapes:
        return given
    return default_sizes(spec) or None


def size_origin(spec: str | None, given: dict | None, sizes: dict | None) -> str | None:
    """A sentence saying where the sizes a model runs at came from when the command was not
    given them (None when it was, or when the model has no named dimensions)."""
    if given is not None or not sizes:
        return None
    at = ", ".join(f"{k}={','.join(map(str, v))}" for k, v in sizes.items())
    return (f"no --size given: run at {frontend_for(spec).sizes_are}, {at}; one build takes any size at run time "
            f"(--size NAME=V1,V2,... runs others)")


def is_float_model(spec: str | None) -> bool | None:
    """Whether the model ``spec`` names is known to compute in float only, before importing
    it; None where that is not known (the default model, a ``.py`` file)."""
    if not spec:
        return None
    try:
        return frontend_for(spec).is_float(spec)
    except TirbyocError:
        return None


__all__ = ["FRONTENDS", "QUANTIZED_ONNX_OPS", "Frontend", "default_model", "default_sizes", "frontend_for", "is_float_model",
           "load_model", "register_frontend", "size_origin", "sizes_to_run"]
