"""Building MetaSchedule candidates without TVM's tensor-intrinsic library.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin`` in every builder
worker (about 40 s of TVMScript parsing, past the builder's own timeout). A candidate from
`TirbyocRule` is already tensorized - the intrinsic's implementation is in the IR - so the
build needs none of them: this is the default build minus that import.
"""

from __future__ import annotations

from tvm.driver import build as tvm_build
from tvm.s_tir.meta_schedule.builder import LocalBuilder
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from tirbyoc._tvm import make_target
from tirbyoc.decl.registry import as_template
from tirbyoc.offloading.lowering import PIPELINE


def build(mod, target, _params=None):
    """Build one scheduled candidate (the ``f_build`` of MetaSchedule's ``LocalBuilder``)."""

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target, pipeline=PIPELINE)  # tirbyoc's passes (double buffering)


def local_builder(max_workers: int | None = None, timeout_sec: float = 60.0):
    """MetaSchedule's ``LocalBuilder`` using `build`."""

    return LocalBuilder(max_workers=max_workers, timeout_sec=timeout_sec, f_build=build)




def tuning_target(template, target=None):
    """The target records are tuned and looked up for (the template's by default)."""

    return make_target(target if target is not None else as_template(template).target)
__all__ = ["build", "local_builder", "tuning_target"]
