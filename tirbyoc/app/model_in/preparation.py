"""How a model is prepared for the templates it is offloaded to, before offload: which
activation dtype and requantization the quantized built-ins take, whether a quantized model's
chains are made integer, whether the module is fused so that a core's PrimFunc carries its
epilogue. `run`, `build`, `sweep` and the benchmarks all prepare models through here.
"""

from __future__ import annotations

from math import prod

import tvm
from tvm import relax

from tirbyoc.app.run_target import run_target
from tirbyoc.decl.registry import as_template
from tirbyoc.relax.quantized import QuantizedReport, QuantizedToInteger, has_quantize_ops


def fuses_epilogues(templates) -> bool:
    """Whether the first template runs the elementwise work after a core on its accumulator
    tile (a `BlockALU`) or in its register block's write-back (``Template.fuses_epilogues``):
    the model is then fused (``FuseOps`` / ``FuseTIR``) before offload, so that each core's
    PrimFunc carries its epilogue."""
    return any(_has_alu(t) or as_template(t).fuses_epilogues for t in templates[:1])


def _has_alu(template) -> bool:
    return getattr(as_template(template), "block_alu", None) is not None


def requantize_mode(templates) -> str:
    """How accumulators come back to the next layer's quantization for ``templates``:
    ``"shift"`` (integer requantization, which an accelerator's ALU runs before a narrowing
    store; the quantized built-ins are then quantized with power-of-two scales, as VTA's
    quantizer does) where the first template's ALU fuses epilogues, else ``"float"``
    (`tirbyoc.relax.requantize`, `tirbyoc.app.model_in.models.quantize`)."""
    return "shift" if any(_has_alu(t) for t in templates[:1]) else "float"


def wants_channels_last(templates) -> bool:
    """Whether the first template's convolutions read NHWC activations: the model is then
    converted to NHWC once (`tirbyoc.relax.layout`)."""
    return any(as_template(t).channels_last for t in templates[:1])


def reduction_tile(templates) -> int:
    """The reduction extent of the first template's first core (x86_vnni: 4 bytes per lane):
    a channels-last model pads a convolution's input channels up to it. A kernel declared for
    any size (``resize``: blas, x86_amx) takes any reduction, save the grouping its packed
    weight needs (x86_amx: 4 bytes, the innermost dimension of its ``Layout.packed`` tile)."""
    for t in templates[:1]:
        for g in as_template(t).groups:
            if g.resize is not None:
                return max((op.layout.tile[-1] for op in g.compute.operands if op.layout.tile), default=1)
            return prod(a.extent for a in g.compute.axes if a.kind == "R")
    return 1


def preparation(templates, target=None) -> tuple:
    """What the model a run offloads depends on in ``templates`` (and ``target``, the run's
    own if given): two template lists with the same preparation offload the same legalized
    model (a sweep builds it once). The target is part of it: a QDQ model's byte tables are
    computed by a build for it (`tirbyoc.relax.byte_tables`)."""
    built_for = str(run_target(as_template(templates[0]), target)) if templates else None
    return (activation_dtype(templates), requantize_mode(templates), fuses_epilogues(templates),
            wants_channels_last(templates), built_for)


def activation_dtype(templates) -> str | None:
    """The activation dtype the first template's GEMM takes (uint8 or int8), if any: the
    quantized built-ins are quantized to it."""

    for t in templates[:1]:
        for g in as_template(t).groups:
            dtype = str(g.compute.operands[0].dtype)
            if dtype in ("uint8", "int8"):
                return dtype
    return None


def integer_module(mod, templates, report: QuantizedReport | None = None):
    """``mod`` (a Relax module, before legalization) as an int8 template offloads it: a
    quantized model's chains made integer (`QuantizedToInteger`; ``report`` collects what it
    did) when the first template computes on 8-bit integers, requantized by a shift where the
    template's ALU can run it and the scales allow (`requantize_mode`), else ``mod`` itself."""
    act = activation_dtype(templates)
    if act is not None and has_quantize_ops(mod):
        return QuantizedToInteger(act, report, requantize_mode(templates))(mod)
    return mod


def bind_weights(mod, entry: str, arrays: list):
    """(``mod`` with the entry's parameters after ``num_input`` bound to ``arrays``' values,
    the arrays the bound entry still takes). A model imported from ONNX or PyTorch has its
    weights as constants already; a ``relax.frontend.nn`` export (the built-ins) takes them as
    parameters after its ``num_input`` inputs."""
    func = mod[entry]
    attrs = func.attrs or {}
    n = int(attrs["num_input"]) if "num_input" in attrs else len(func.params)
    if n >= len(func.params):
        return mod, list(arrays)
    weights = {p.name: tvm.runtime.tensor(a) for p, a in zip(func.params[n:], arrays[n:])}
    bound = relax.transform.BindParams(entry, weights)(mod)
    new = bound[entry]
    bound[entry] = new.with_attr("num_input", n) if "num_input" in attrs else new
    return bound, list(arrays[:n])


def with_constant_weights(mod, entry: str, arrays: list):
    """(``mod`` as it is deployed, the arrays it still takes): its weights bound as constants
    (`bind_weights`) and what depends on them alone computed once (TVM's ``FoldConstant``: a
    quantized built-in's weights are quantized here, an ONNX Gemm's weight transposed here,
    not on every call), as TVM's own
    pipeline would at build time - done before offload, so that the offloaded PrimFuncs see
    constant weights and `tirbyoc.relax.prepack` can pack them once."""
    bound, rest = bind_weights(mod, entry, arrays)
    folded = relax.transform.FoldConstant()(bound)
    return relax.transform.DeadCodeElimination([entry])(folded), rest  # PrimFuncs folded away


__all__ = ["activation_dtype", "bind_weights", "fuses_epilogues", "integer_module", "preparation", "reduction_tile",
           "requantize_mode", "wants_channels_last", "with_constant_weights"]
