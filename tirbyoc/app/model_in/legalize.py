"""A model as tirbyoc offloads it: loaded (`tirbyoc.app.model_in.frontends.load_model`), made integer
where it is quantized, optionally given fast math, legalized, and its inputs drawn.

`run`, `build`, `sweep` and the benchmarks all start here, so that they offload the same
module and a user's model and a built-in take one path.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax

from tirbyoc.app.model_in.frontends import load_model
from tirbyoc.app.model_in.model_inputs import model_inputs
from tirbyoc.app.model_in.models import CALIBRATION_SEEDS, MODELS
from tirbyoc.app.options import RunOptions
from tirbyoc.app.model_in.preparation import (
    fuses_epilogues,
    integer_module,
    reduction_tile,
    wants_channels_last,
    with_constant_weights,
)
from tirbyoc.app.model_in.sizes import bindings as size_bindings
from tirbyoc.errors import TirbyocError
from tirbyoc.app.run_target import run_target
from tirbyoc.decl.registry import as_template
from tirbyoc.relax.bf16 import Bf16Report, bf16_of
from tirbyoc.relax.byte_tables import ByteTableReport, byte_tables
from tirbyoc.relax.bridge import fuse
from tirbyoc.relax.fast_math import FastMathReport, fast_math_of
from tirbyoc.relax.transposed_operands import TransposedReport, transposed_in_place
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


@dataclass
class LegalizedModel:
    """A model as tirbyoc offloads it (`legalized_model`), and what preparing it did."""

    spec: str  # what was loaded (a file, ``builtin:NAME``)
    mod: object  # the legalized IRModule the templates offload
    entry: str  # the Relax function a run calls
    arrays: list  # its inputs (the model's own only, when the weights are constants)
    quantized: QuantizedReport  # the chains made integer, the 8-bit boundaries
    layout: LayoutReport  # the convolutions converted to NHWC
    fast_math: FastMathReport | None = None  # filled in when the options ask for fast math
    bf16: Bf16Report | None = None  # filled in when the options' precision is bf16
    tables: ByteTableReport | None = None  # the 8-bit chains computed as tables (`byte_tables`)
    as_given: object = None  # with ``as_given=True``: the model legalized as it was given
    transposed: TransposedReport | None = None  # matmuls reading an operand in place of its transpose


def legalized_model(model: str | None, templates, options: RunOptions | None = None, *,
                    constant_weights: bool = False, as_given: bool = False) -> LegalizedModel:
    """``model`` prepared for ``templates`` as `RunOptions` says (``options``: its seed,
    inputs, obj, input_shapes, fast_math, precision, and the first binding of its sizes): the
    user's inputs (name -> array) where given, else seeded data in each input's domain
    (`tirbyoc.app.model_in.model_inputs`), at the first binding of ``options.sizes``. A quantized
    model's chains are made integer first (`integer_module`). For a template that fuses
    epilogues the module comes fused (`fuse`), each fused output that ends in a quantize and a
    dequantize stored as its 8-bit value and dequantized by its readers (`narrow_boundaries`;
    named in the record's ``quantized``). ``fast_math``: the model's float32 erf, tanh, exp,
    softmax, sigmoid, SiLU and GELU become TVM's fast approximations (`tirbyoc.relax.fast_math`),
    in the module and in ``as_given`` alike. For a template whose convolutions read NHWC the
    module is converted to NHWC once (`tirbyoc.relax.layout`), while ``as_given`` keeps the
    model's own layout. Precision ``bf16``: the model's float32 convolutions and matmuls read
    bfloat16 (`tirbyoc.relax.bf16`), while ``as_given`` keeps float32 (the accuracy the
    conversion costs is measured against it). For a template that fuses epilogues, a matmul
    whose run-time operand is transposed for it alone reads it in place
    (`tirbyoc.relax.transposed_operands`). ``constant_weights``: the weights bound as
    constants, as a deployed model has them (`with_constant_weights`); the arrays are then the
    model's own inputs only. ``as_given``: also legalize the model as it was given (the same
    module when nothing was made integer, converted or fused)."""
    opts = options or RunOptions()
    spec, loaded = load_model(model, templates, opts.obj, opts.input_shapes)
    done = LegalizedModel(spec, None, "", [], QuantizedReport(), LayoutReport(),
                          FastMathReport() if opts.fast_math else None,
                          Bf16Report() if opts.precision == "bf16" else None)
    converted = integer_module(loaded, templates, done.quantized)
    if converted is not loaded:
        done.quantized.step = qdq_output_step(loaded, entry_function(loaded))
    if done.fast_math is not None:
        fast, changed = fast_math_of(converted)
        done.fast_math.add(changed)
        loaded, converted = (fast if converted is loaded else fast_math_of(loaded)[0]), fast
    if done.bf16 is not None:
        converted, changed = bf16_of(converted)
        done.bf16.add(changed)
    laid = (channels_last(converted, done.layout, reduction_tile(templates))[0] if wants_channels_last(templates)
            else converted)
    if fuses_epilogues(templates):
        laid, done.transposed = transposed_in_place(laid)
    laid = _with_byte_tables(laid, templates, opts, done)
    mod = relax.transform.LegalizeOps()(laid)
    given = (mod if laid is loaded else relax.transform.LegalizeOps()(loaded)) if as_given else None
    if fuses_epilogues(templates):
        mod, narrowed = narrow_boundaries(fuse(mod))
        done.quantized.boundaries += narrowed
    done.entry = entry_function(mod)
    arrays = done.arrays = model_inputs(mod, done.entry, opts.seed, opts.inputs, size_bindings(opts.sizes)[0])
    if constant_weights:
        bound, done.arrays = with_constant_weights(mod, done.entry, arrays)
        if given is not None:
            given = bound if given is mod else with_constant_weights(given, done.entry, arrays)[0]
        mod = bound
    done.spec, done.mod, done.as_given = spec, mod, given
    return done


def _with_byte_tables(mod, templates, opts: RunOptions, done: LegalizedModel):
    """``mod`` with its 8-bit elementwise chains as tables computed for the run's target
    (`tirbyoc.relax.byte_tables`), named in ``done.tables`` when there were any."""
    if not templates:
        return mod
    new, report = byte_tables(mod, run_target(as_template(templates[0]), opts.target))
    done.tables = report if report.replaced or report.failed else None  # a failure is said
    return new


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


__all__ = ["LegalizedModel", "entry_function", "importing", "legalized_model"]
