"""tirbyoc's IRModule => IRModule passes, in the order they run in a Relax pipeline::

    [QuantizedToInteger] -> [FastMath] -> [Bfloat16] -> [ChannelsLast] -> Dispatch(rules) -> LegalizeOps
        -> [FuseOps / FuseTIR]
        -> OffloadTIR(templates) -> PackConstantWeights -> ScheduleRest(target) -> tvm.compile

`QuantizedToInteger` makes a quantized (QDQ) model's float conv/matmul chains integer cores
(`tirbyoc.relax.quantized`); `FastMath`, opt-in, computes float32 erf, tanh, exp, softmax,
sigmoid, SiLU and GELU with TVM's vectorizable approximations (`tirbyoc.relax.fast_math`);
`Bfloat16`, opt-in, makes a float model's convolutions and matmuls read bfloat16 with float32
sums (`tirbyoc.relax.bf16`);
`ChannelsLast` converts the convolutions and everything between them to NHWC once, for a
template whose cores read channels innermost (`tirbyoc.relax.layout`);
`Dispatch` rewrites Relax operators into hand-written TIR or
library calls for the current target (`tirbyoc.relax.dispatch`); `OffloadTIR` offloads the
PrimFuncs left after legalization to templates (`tirbyoc.relax.bridge`);
`PackConstantWeights` runs the copies an offloaded PrimFunc makes of a constant weight once, at
compile time (`tirbyoc.relax.prepack`); `ScheduleRest` fuses the functions no template took, as
TVM's pipeline would, and runs their loops in parallel and in vectors, bit for bit as TVM's
build computes them (`tirbyoc.relax.rest`).
"""

from tirbyoc.relax.bf16 import Bf16Report, Bfloat16
from tirbyoc.relax.bridge import OffloadReport, OffloadTIR
from tirbyoc.relax.dispatch import Dispatch, DispatchReport, LibraryKernel, Matched, Rule, TIRKernel
from tirbyoc.relax.fast_math import FastMath, FastMathReport
from tirbyoc.relax.layout import ChannelsLast, LayoutReport
from tirbyoc.relax.prepack import PackConstantWeights, PackedWeights
from tirbyoc.relax.quantized import QuantizedReport, QuantizedToInteger
from tirbyoc.relax.rest import RestSchedule, ScheduleRest

__all__ = ["Bf16Report", "Bfloat16", "ChannelsLast", "Dispatch", "DispatchReport", "FastMath", "FastMathReport", "LayoutReport", "LibraryKernel", "Matched", "OffloadReport", "OffloadTIR",
           "PackConstantWeights", "PackedWeights",
           "QuantizedReport", "QuantizedToInteger", "RestSchedule", "Rule", "ScheduleRest", "TIRKernel"]
