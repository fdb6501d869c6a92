"""Self-checks of intrinsic declarations: does the implementation compute the description?

`self_check` builds the description and the implementation as standalone functions, runs
both on the same seeded random data spanning each dtype's full range, and compares every
buffer. `tensorize_exact` tensorizes a workload of exactly the intrinsic's shape with TVM's
own ``Schedule.tensorize``, which is what every later rewrite relies on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tirbyoc._tvm import Schedule, build, make_target
from tirbyoc.decl.intrinsic_check import leaf_block, param_buffers
from tirbyoc.decl.packed_desc import packed_description
from tirbyoc.ir.domains import random_array
from tirbyoc.errors import VerificationError
from tirbyoc.offloading.devices import device_of
from tirbyoc.offloading.verification import compare_arrays, reduction_length, run_executable


def compile_prim_func(func, target):
    """Build ``func`` for ``target``; return the callable entry point."""

    return build(func.with_attr("global_symbol", "main"), target)["main"]


def run_prim_func(func, target, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Build ``func`` for ``target``, run it once on copies of ``arrays``, return them all."""
    return run_executable(compile_prim_func(func, target), arrays)


@dataclass(frozen=True)
class SelfCheck:
    intrinsic: str
    max_error: float
    passed: bool
    detail: str = ""


def self_check(intrin, target=None, seed: int = 0, trials: int = 3) -> SelfCheck:
    """Run description and implementation on random data and compare every buffer. For an
    emulated device's ``target`` (Hexagon) the implementation runs in its emulator
    (qemu-hexagon) and the description on this CPU."""

    # packed operands (`Layout.packed`): both functions take them in the stored layout
    desc, impl = packed_description(intrin.desc, intrin.operands), intrin.impl
    target = target or {"kind": "llvm"}
    rng = np.random.default_rng(seed)
    # Build each function once; the trials only draw new data.
    device = device_of(target)
    if device.emulated:  # the description on this CPU, the implementation in the emulator
        reason = device.unavailable(make_target(target))
        if reason is not None:
            raise VerificationError(f"{intrin.name}: cannot run its implementation: {reason}")
        run_desc = compile_prim_func(desc, device.model_target(target))

        def run_impl(*arrays):  # one emulated run; results written back like a TVM call
            outs, _ = device.run(impl, make_target(target), [a.numpy() for a in arrays], None)
            for arr, out in zip(arrays, outs):
                arr.copyfrom(out)
    else:
        run_desc, run_impl = compile_prim_func(desc, target), compile_prim_func(impl, target)
    bufs = param_buffers(desc)
    reduction = reduction_length(desc)
    worst, detail = 0.0, ""
    for _ in range(trials):
        inputs = [random_array(b.shape, str(b.dtype), rng, full_range=True) for b in bufs]
        want = run_executable(run_desc, [a.copy() for a in inputs])
        got = run_executable(run_impl, [a.copy() for a in inputs])
        for buf, w, g in zip(bufs, want, got):
            c = compare_arrays(w, g, str(buf.dtype), reduction)
            if c.passed is False and not detail:
                detail = f"buffer {buf.name}: max error {c.abs_err} > tolerance {c.tolerance}"
            worst = max(worst, c.abs_err)
    return SelfCheck(intrin.name, worst, not detail, detail)


def tensorize_exact(intrin):
    """Tensorize a workload of exactly the intrinsic's shape; return the scheduled IRModule.

    The workload is the description itself, made a standalone function; its outermost loop
    is replaced by the intrinsic with ``Schedule.tensorize``.
    """

    name = intrin.register()
    # A fresh build: tensorize cannot map a workload onto a description that shares its
    # very Buffer objects.
    desc = packed_description(intrin.fresh_desc(), intrin.operands).with_attr("global_symbol", "main")
    sch = Schedule(desc)
    block = sch.get_sblock(leaf_block(intrin.name, desc).name_hint)
    loops = sch.get_loops(block)
    if loops:
        sch.tensorize(loops[0], name)
    else:
        sch.tensorize(block, name)
    return sch.mod
