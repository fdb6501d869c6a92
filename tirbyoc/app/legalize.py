"""A model as tirbyoc offloads it: loaded (`tirbyoc.app.frontends.load_model`), made integer
where it is quantized, optionally given fast math, legalized, and its inputs drawn.

`run`, `build`, `sweep` and the benchmarks all start here, so that they offload the same
module and a user's model and a built-in take one path.
"""

from __future__ import annotations

from tvm import relax

from tirbyoc.app.frontends import load_model
from tirbyoc.app.model_inputs import model_inputs
from tirbyoc.app.models import CALIBRATION_SEEDS, MODELS
from tirbyoc.app.preparation import (
    fuses_epilogues,
    integer_module,
    reduction_tile,
    wants_channels_last,
    with_constant_weights,
)
from tirbyoc.errors import TirbyocError
from tirbyoc.relax.bf16 import Bf16Report, bf16_of
from tirbyoc.relax.bridge import fuse
from tirbyoc.relax.fast_math import FastMathReport, fast_math_of
from tirbyoc.relax.layout import LayoutReport, channels_last
from tirbyoc.relax.narrow_boundary import narrow_boundaries
from tirbyoc.relax.quantized import QuantizedReport, qdq_output_step


def importing(model: str | None) -> str:
    """What the import phase says it does: a calibrated ``_int8`` built-in is quantized first,
    which runs TVM's build of the float model (a minute for BERT-base)."""
    name = (model or "").split(":", 1)[-1] if (model or "").startswith("builtin:") else None
    if name and getattr(MODELS.get(name), "calibrated", False):
        return (f"importing {model} (quantizing it: calibration runs TVM's build of the float model "
                f"on {len(CALIBRATION_SEEDS)} sample inputs, once per process)")
    return f"importing {model or 'the built-in model'}"


def legalized_model(model: str | None, templates, seed: int, inputs: dict | None = None, *,
                    obj: str | None = None, input_shapes: dict | None = None,
                    quantized: QuantizedReport | None = None, as_given: list | None = None,
                    constant_weights: bool = False, fast_math: FastMathReport | None = None,
                    layout: LayoutReport | None = None, sizes: dict | None = None,
                    bf16: Bf16Report | None = None):
    """(spec, legalized module, entry function, inputs) of a model for ``templates``: the
    user's ``inputs`` (name -> array) where given, else seeded data in each input's domain
    (`tirbyoc.app.model_inputs`). A quantized model's chains are made integer first
    (`integer_module`; ``quantized`` collects the report); ``as_given`` receives the model
    legalized as it was given (the same module when nothing was made integer). For a
    template that fuses epilogues the module comes fused (`fuse`), each fused output that ends
    in a quantize and a dequantize stored as its 8-bit value and dequantized by its readers
    (`narrow_boundaries`; named in ``quantized``). ``constant_weights``: the
    weights bound as constants, as a deployed model has them (`with_constant_weights`); the
    inputs returned are then the model's own inputs only. ``fast_math``: when given, the
    model's float32 erf, tanh, exp, softmax, sigmoid, SiLU and GELU become TVM's fast
    approximations (`tirbyoc.relax.fast_math`), in this module and in ``as_given`` alike, and
    the report is filled in. For a template whose convolutions read NHWC the module is
    converted to NHWC once (`tirbyoc.relax.layout`; ``layout`` collects what it did), while
    ``as_given`` keeps the model's own layout. ``sizes``: the size of each named dimension of
    the inputs drawn (``{"n": 17}``). ``bf16``: when given, the model's float32 convolutions
    and matmuls read bfloat16 (`tirbyoc.relax.bf16`) in this module, while ``as_given`` keeps
    float32 (the accuracy the conversion costs is measured against it); the report is filled in."""
    spec, loaded = load_model(model, templates, obj, input_shapes)
    converted = integer_module(loaded, templates, quantized)
    if quantized is not None and converted is not loaded:
        quantized.step = qdq_output_step(loaded, entry_function(loaded))
    if fast_math is not None:
        fast, done = fast_math_of(converted)
        fast_math.add(done)
        loaded, converted = (fast if converted is loaded else fast_math_of(loaded)[0]), fast
    if bf16 is not None:
        converted, done = bf16_of(converted)
        bf16.add(done)
    laid = (channels_last(converted, layout, reduction_tile(templates))[0] if wants_channels_last(templates)
            else converted)
    mod = relax.transform.LegalizeOps()(laid)
    if as_given is not None:
        as_given.append(mod if laid is loaded else relax.transform.LegalizeOps()(loaded))
    if fuses_epilogues(templates):
        mod, narrowed = narrow_boundaries(fuse(mod))
        if quantized is not None:
            quantized.boundaries += narrowed
    entry = entry_function(mod)
    arrays = model_inputs(mod, entry, seed, inputs, sizes)
    if constant_weights:
        given = as_given[-1] if as_given else None
        bound, arrays_left = with_constant_weights(mod, entry, arrays)
        if given is not None:
            as_given[-1] = bound if given is mod else with_constant_weights(given, entry, arrays)[0]
        mod, arrays = bound, arrays_left
    return spec, mod, entry, arrays


def entry_function(mod) -> str:
    """The Relax function a run calls: ``forward`` (relax.frontend.nn, built-ins), ``main``
    (ONNX, PyTorch), or the only one there is."""

    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    for name in ("forward", "main"):
        if name in names:
            return name
    if len(names) == 1:
        return names[0]
    if not names:
        raise TirbyocError("the model has no Relax function to run (a TensorIR workload?); "
                           "`tirbyoc match` explains it, tirbyoc.offload(func, template) offloads it")
    raise TirbyocError(f"the model has Relax functions {sorted(names)}; name the entry forward or main")


__all__ = ["entry_function", "importing", "legalized_model"]
