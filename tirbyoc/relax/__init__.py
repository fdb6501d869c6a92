"""tirbyoc's IRModule => IRModule passes, in the order they run in a Relax pipeline::

    Dispatch(rules) -> LegalizeOps -> [FuseOps / FuseTIR] -> OffloadTIR(templates) -> tvm.compile

`Dispatch` rewrites Relax operators into hand-written TIR or library calls for the current
target (`tirbyoc.relax.dispatch`); `OffloadTIR` offloads the PrimFuncs left after legalization to
templates (`tirbyoc.relax.bridge`).
"""

from tirbyoc.relax.bridge import OffloadReport, OffloadTIR
from tirbyoc.relax.dispatch import Dispatch, DispatchReport, LibraryKernel, Matched, Rule, TIRKernel

__all__ = ["Dispatch", "DispatchReport", "LibraryKernel", "Matched", "OffloadReport", "OffloadTIR",
           "Rule", "TIRKernel"]
