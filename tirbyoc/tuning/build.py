"""Building MetaSchedule candidates without TVM's tensor-intrinsic library.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin`` in every builder
worker (about 40 s of TVMScript parsing, past the builder's own timeout). A candidate from
`TirbyocRule` is already tensorized - the intrinsic's implementation is in the IR - so the
build needs none of them: this is the default build minus that import.
"""

from __future__ import annotations

from tvm.driver import build as tvm_build
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, LocalBuilder, PyBuilder
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from tirbyoc._tvm import IRModule, PrimFunc, make_target
from tirbyoc.decl.registry import as_template
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.offloading.offloader import prepare_for_simulator


def build(mod, target, _params=None):
    """Build one scheduled candidate (the ``f_build`` of MetaSchedule's ``LocalBuilder``)."""

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target, pipeline=PIPELINE)  # tirbyoc's passes (double buffering)


def local_builder(max_workers: int | None = None, timeout_sec: float = 60.0):
    """MetaSchedule's ``LocalBuilder`` using `build`."""

    return LocalBuilder(max_workers=max_workers, timeout_sec=timeout_sec, f_build=build)


@derived_object
class SimulatorBuilder(PyBuilder):
    """For a simulated template: each candidate prepared in this process as `offload`
    prepares its result (`prepare_for_simulator`: double-buffer marks, the scratchpad footprint
    the simulator checks), then built by ``inner`` - a candidate is measured as the code it
    would become, not a single-buffered variant of it."""

    def __init__(self, template, inner):
        super().__init__()
        self.template, self.inner = as_template(template), inner

    def build(self, build_inputs):
        prepared = []
        for item in build_inputs:
            mod = IRModule({gv: prepare_for_simulator(f, self.template) if isinstance(f, PrimFunc) else f
                            for gv, f in item.mod.functions.items()})
            prepared.append(BuilderInput(mod, item.target, item.params))
        return self.inner.build(prepared)


def tuning_target(template, target=None):
    """The target records are tuned and looked up for (the template's by default)."""

    return make_target(target if target is not None else as_template(template).target)
__all__ = ["SimulatorBuilder", "build", "local_builder", "tuning_target"]
