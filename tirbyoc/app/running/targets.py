"""The target both builds of `tirbyoc run` use, and what TVM's baseline build is.

A template's target may name no CPU (blas, vta); built that way the baseline is generic x86-64
while the offload calls an optimised library, a strawman. `complete_target` (in
`tirbyoc.app.run_target`, which a model's preparation shares) gives such a target this
machine's CPU; `check_templates_on_target` refuses, before any work, a target the
templates' code cannot be built or run for; `baseline_module` is the untouched model as the
chosen baseline compiles it.
"""

from __future__ import annotations

from tvm.s_tir import dlight as dl

from tirbyoc._tvm import isa_features, make_target
from tirbyoc.app.run_target import complete_target
from tirbyoc.decl.template import Runtime
from tirbyoc.errors import TirbyocError, last_line
from tirbyoc.offloading.devices import device_of


BASELINES = {
    "default": "TVM's default CPU pipeline (FuseOps/FuseTIR, PrimFuncs left unscheduled, LLVM)",
    "dlight": "TVM's default CPU pipeline with dlight's CPU schedules (GEMV, Reduction)",
}


def baseline_module(mod, target, baseline: str):
    """The untouched module as the ``baseline`` build compiles it (see `BASELINES`)."""
    if baseline not in BASELINES:
        raise TirbyocError(f"unknown baseline {baseline!r}; use one of {sorted(BASELINES)}")
    if baseline == "dlight":

        with target:
            mod = dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction())(mod)
    return mod


def check_templates_on_target(tmpls, tgt) -> None:
    """Refuse, before any work, a target the templates' code cannot be built or run for: a CUDA
    target without a CUDA device, or an LLVM target whose CPU lacks instructions a template's
    intrinsics emit (LLVM would abort the process, not raise)."""
    kind = str(tgt.kind.name)
    device = device_of(tgt)
    if not device.on_this_cpu and device.unavailable(tgt):
        raise TirbyocError(f"--target {kind}: {device.unavailable(tgt)}, and tirbyoc run builds, runs "
                           f"and compares both builds. {device.advice}".rstrip())
    if kind != "llvm" or tgt.attrs.get("mtriple"):
        return
    have = isa_features(tgt)
    for t in tmpls:
        if t.runtime is not Runtime.LLVM or str(t.target.get("kind")) != "llvm":
            continue
        missing = sorted(isa_features(t.target) - have)
        if missing:
            mcpu = tgt.attrs.get("mcpu") or "generic"
            raise TirbyocError(
                f"template {t.name} emits {', '.join(missing)} instructions (its target is mcpu="
                f"{t.target.get('mcpu')}); the target's CPU {mcpu} has none of them, and LLVM "
                f"would abort. Use -t blas, or a target whose mcpu has them (e.g. "
                f"'{{\"kind\": \"llvm\", \"mcpu\": \"{t.target.get('mcpu')}\"}}')")


def model_target(target):
    """Where the model itself is built and run for ``target``: the target, or this CPU when
    the offloaded code runs in an emulator (Hexagon: each offloaded PrimFunc under
    qemu-hexagon, everything else here)."""
    if device_of(target).emulated:
        return check_target(complete_target({"kind": "llvm"}))
    return make_target(target)


def check_target(target):
    """A ``tvm.target.Target`` from a dict or kind, or a usage error with TVM's reason."""
    try:
        return make_target(target)
    except Exception as err:  # TVM's own message is the last line of a C++ traceback
        raise TirbyocError(f"target {target!r} is not a TVM target: {last_line(err)}") from None


__all__ = ["BASELINES", "baseline_module", "check_target", "check_templates_on_target", "model_target"]
