"""Where a target's code runs, said once per kind of device: the records every command asks.

A `Device` tells, for the targets it claims, whether code built for one can run on this
machine and why not (after building it where building is safe), how one PrimFunc runs once
(natively, on a GPU, under an emulator), whether the model around the offloaded functions
runs on this CPU instead (an emulated device runs one PrimFunc at a time), whether a latency
measured here is the device's (how `tirbyoc build` writes its library is the application's
`deploy.EXPORTERS`, by device name).
`device_of(target)` finds the record; `verify`, `self_check`, `tirbyoc run`, `build`, `tune`
and the fuzzer ask it instead of testing target kinds.

**A new device** (a DSP behind another emulator, an accelerator with a runtime of its own) is
a `Device` given to `register_device`, ahead of the catch-all for foreign code.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tirbyoc._tvm import build, cuda_available, cuda_source, gpu_default_schedule, is_host_target, isa_features, make_target, to_tensor, tvm
from tirbyoc.decl.host import host_cpu_features, host_target
from tirbyoc.decl.extern import check_loaded
from tirbyoc.errors import TirbyocError, VerificationError, last_line
from tirbyoc.offloading import cuda_toolchain, hexagon
from tirbyoc.offloading.lowering import PIPELINE


def compile_func(func, target, what: str):
    """TVM's build of ``func`` for ``target``; a `VerificationError` that says which build
    failed."""
    if func.attrs is None or "global_symbol" not in func.attrs:
        func = func.with_attr("global_symbol", "main")  # e.g. a private PrimFunc from Relax
    if is_host_target(target):
        try:
            check_loaded(func, f"the {what} function")
        except TirbyocError as err:
            raise VerificationError(str(err)) from None
    try:
        return build(func, target, PIPELINE)
    except Exception as err:  # TVM raises many types; say which build failed
        raise VerificationError(f"building the {what} function for {target} failed: "
                                f"{last_line(err)}") from err


# LLVM's optimization level for a reference build (TVM's lowering of an untouched function,
# run once for its outputs): -O3 spends 10-17 s vectorizing an unscheduled int8 matmul's
# strided reduction (19,000 lines of machine code) that -O2 builds in 0.2 s; the outputs are
# the same (TVM turns on no fast-math flags, so LLVM may not reorder float arithmetic at any
# level). A timed baseline keeps TVM's own default.
REFERENCE_OPT_LEVEL = 2


def reference_target(target=None):
    """``target`` (default: this CPU) as a reference build uses it: an LLVM target built at
    `REFERENCE_OPT_LEVEL` unless it names its own ``opt-level``."""
    target = make_target(target) if target is not None else host_target()
    if str(target.kind.name) != "llvm" or "opt-level" in target.attrs:
        return target
    spec = {k: v for k, v in target.export().items() if k not in ("tag", "keys")}
    return make_target({**spec, "opt-level": REFERENCE_OPT_LEVEL})


def run_executable(executable, arrays, device=None):
    """Run a built function once on copies of ``arrays`` (on ``device``, default the CPU);
    return them all afterwards (outputs included)."""
    tensors = [to_tensor(a, device) for a in arrays]
    executable(*tensors)
    return [t.numpy() for t in tensors]


class EmulatedRunError(VerificationError):
    """An emulated run that did not finish. ``crashed``: the generated code itself failed (an
    error it reported, a fault, a scratchpad overflow) rather than the tools around it;
    ``emulator``: where it ran."""

    def __init__(self, message: str, crashed: bool, emulator: str):
        super().__init__(message)
        self.crashed, self.emulator = crashed, emulator


def _never(target) -> str | None:
    return None


@dataclass(frozen=True)
class Device:
    """One kind of device (see the module's docstring).

    ``claims(target)``: whether a target's code is this device's. ``cannot_run(func,
    target)``: why the rewritten ``func`` cannot run here (built first where that is safe, so a
    build error still shows), or None. ``run(func, target, arrays, capacities)``: (the arrays
    after one run of ``func`` on copies of them, the emulator it ran in or None); capacities
    are bytes per scratchpad scope, for an emulator that models them. ``emulated``: it runs
    here under an emulator, one PrimFunc at a time, so the model around it runs on this CPU and
    a latency measured here is not the device's. ``on_this_cpu``: its code executes on this
    machine's CPU (natively or emulated), not an accelerator. ``unavailable(target)``: why no code
    for ``target`` runs here at all, without building anything (None: it can); ``advice``:
    what to do instead, said when a command refuses the target for that."""

    name: str
    claims: Callable
    cannot_run: Callable
    run: Callable
    emulated: bool = False
    on_this_cpu: bool = True
    unavailable: Callable = _never
    advice: str = ""  # what a user without the device can do instead, for a refusal
    emulator_name: Callable = lambda target: ""  # how reports name an emulated device's runs
    runtime_device: Callable = lambda: tvm.cpu()  # the TVM device a built module of this kind runs on
    # an untouched PrimFunc as TVM's default pipeline for this device would build it (a GPU's
    # is scheduled by dlight there: unscheduled, it does not build)
    as_default_built: Callable = lambda func, target: func

    def model_target(self, target):
        """Where a model whose offloaded functions run on this device is built and run: the
        target, or this CPU for an emulated device."""
        return host_target() if self.emulated else make_target(target)


# ---------------------------------------------------------------------------- this CPU
def _cpu_cannot_run(func, target) -> str | None:
    """Why code built for ``target`` cannot run here: the instruction-set features it lets LLVM
    use that this CPU lacks (checked whatever the ``mcpu``: a machine may hide features of its
    own CPU model). The function is built first, so a build error is reported as one."""
    missing = sorted(isa_features(target) - host_cpu_features())
    if missing:
        compile_func(func, target, "rewritten")
        return f"built for {target.attrs.get('mcpu') or 'this target'}; this CPU lacks {', '.join(missing)}"
    return None


def _run_built(device_of_run):
    def run(func, target, arrays, capacities):
        exe = compile_func(func, target, "rewritten")
        return run_executable(exe, [a.copy() for a in arrays], device_of_run()), None
    return run


CPU = Device("cpu", lambda t: str(t.kind.name) in ("llvm", "c") and is_host_target(t),
             _cpu_cannot_run, _run_built(tvm.cpu))


# ---------------------------------------------------------------------------- CUDA GPUs
def _no_gpu(target) -> str | None:
    return None if cuda_available() else "this machine has no CUDA device"


def _cuda_cannot_run(func, target) -> str | None:
    """Without a GPU: built, and compiled on to GPU machine code where a CUDA compiler is here
    (`cuda_toolchain.machine_code_note`); a source the compiler rejects fails the check."""
    if cuda_available():
        return None
    built = compile_func(func, target, "rewritten")
    try:
        note = cuda_toolchain.machine_code_note(cuda_source(built), target)
    except RuntimeError as err:
        raise VerificationError(f"the rewritten function's CUDA C does not compile: {last_line(err)}") from err
    return f"built for CUDA{note}; no GPU here to run it"


CUDA = Device("cuda", lambda t: str(t.kind.name) == "cuda", _cuda_cannot_run,
              _run_built(lambda: tvm.cuda(0)), on_this_cpu=False, unavailable=_no_gpu,
              runtime_device=lambda: tvm.cuda(0), as_default_built=gpu_default_schedule,
              advice="Without a GPU, `tirbyoc match` shows what offloads to cuda_mma, and "
                     "tirbyoc.offload(func, 'cuda_mma') builds the kernels and compiles them to GPU "
                     "machine code (NVRTC from `pip install 'tirbyoc[cuda]'`, or a toolkit's nvcc) "
                     "without running them")


# ---------------------------------------------------------------------------- Hexagon under QEMU
def _hexagon_cannot_run(func, target) -> str | None:
    reason = hexagon.cannot_run(target)
    if reason is None:
        return None
    if str(target.kind.name) != "llvm":
        # Not built: this TVM's `hexagon` kind aborts LLVM on vrmpy, which no handler catches.
        return f"not built: {reason}"
    with tempfile.TemporaryDirectory() as tmp:
        hexagon.build_object(func, target, Path(tmp) / "kernel.o")
    return f"built for Hexagon only: {reason}"


def _hexagon_run(func, target, arrays, capacities):
    vtcm = (capacities or {}).get(hexagon.VTCM) or hexagon.DEFAULT_VTCM_BYTES
    try:
        done = hexagon.run(func, target, arrays, vtcm)  # reads them, writes files
    except hexagon.HexagonRunError as err:
        raise EmulatedRunError(str(err), err.crashed, hexagon.emulator_name(target)) from err
    return done.arrays, done.emulator


HEXAGON = Device("hexagon", hexagon.is_hexagon, _hexagon_cannot_run, _hexagon_run, emulated=True,
                 unavailable=hexagon.cannot_run,
                 emulator_name=hexagon.emulator_name)


# ---------------------------------------------------------------------------- anything else
def _foreign(func, target) -> str:
    # Not even built here: cross-compiling some device intrinsics aborts LLVM in-process
    # (Hexagon vrmpy), which no exception handler can catch.
    kind = str(target.kind.name)
    mtriple = target.attrs.get("mtriple")
    return f"{kind} code{f' for {mtriple}' if mtriple else ''} cannot run on this machine"


def _not_here(func, target, arrays, capacities):
    raise VerificationError(_foreign(func, make_target(target)))


FOREIGN = Device("foreign", lambda t: True, _foreign, _not_here, on_this_cpu=False,
                 unavailable=lambda t: _foreign(None, make_target(t)))

DEVICES: list[Device] = [CPU, CUDA, HEXAGON, FOREIGN]  # asked in order; FOREIGN claims the rest


def register_device(device: Device) -> Device:
    """Add a device, asked before the catch-all for foreign code (see the module's docstring)."""
    if any(d.name == device.name for d in DEVICES):
        raise TirbyocError(f"a device named {device.name!r} is registered already")
    DEVICES.insert(DEVICES.index(FOREIGN), device)
    return device


def device_of(target) -> Device:
    """The device whose code ``target`` (a Target or a target dict) builds."""
    target = make_target(target)
    return next(d for d in DEVICES if d.claims(target))


__all__ = ["CPU", "CUDA", "DEVICES", "Device", "EmulatedRunError", "FOREIGN", "HEXAGON", "compile_func", "device_of",
           "register_device", "run_executable"]
