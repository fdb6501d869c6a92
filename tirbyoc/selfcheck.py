"""Self-checks of intrinsic declarations: does the implementation compute the description?

`self_check` builds the description and the implementation as standalone functions, runs
both on the same seeded random data spanning each dtype's full range, and compares every
buffer. `tensorize_exact` tensorizes a workload of exactly the intrinsic's shape with TVM's
own ``Schedule.tensorize``, which is what every later rewrite relies on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import is_float

# Accumulators start in a range where a few thousand products cannot overflow int32, so
# wrap-around (undefined in LLVM's nsw arithmetic) never decides a comparison.
_ACC_BOUND = 1 << 20


def random_array(shape, dtype: str, rng: np.random.Generator, *, accumulator: bool = False):
    """Seeded data spanning the dtype's full range (bounded for accumulators)."""
    shape = tuple(int(s) for s in shape)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype("bool")
    if is_float(dtype):
        np_dtype = "float32" if dtype.startswith("bfloat") else dtype
        return rng.uniform(-1.0, 1.0, size=shape).astype(np_dtype)
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    if accumulator or info.bits > 16:
        lo, hi = max(lo, -_ACC_BOUND), min(hi, _ACC_BOUND)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


def tolerance(dtype: str) -> float:
    """Absolute/relative tolerance suited to a dtype (0 for integers)."""
    if not is_float(dtype):
        return 0.0
    return {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4, "float64": 1e-9}.get(dtype, 1e-4)


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    if got.dtype.kind in "iub":
        return float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))


def compile_prim_func(func, target):
    """Build ``func`` for ``target``; return the callable entry point."""
    from ._tvm import build

    return build(func.with_attr("global_symbol", "main"), target)["main"]


def run_compiled(entry, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run a built function once on copies of ``arrays``; return them all afterwards."""
    from ._tvm import to_tensor

    tensors = [to_tensor(a) for a in arrays]
    entry(*tensors)
    return [t.numpy() for t in tensors]


def run_prim_func(func, target, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Build ``func`` for ``target``, run it once on copies of ``arrays``, return them all."""
    return run_compiled(compile_prim_func(func, target), arrays)


@dataclass(frozen=True)
class SelfCheck:
    intrinsic: str
    max_error: float
    passed: bool
    detail: str = ""


def self_check(intrin, target=None, seed: int = 0, trials: int = 3) -> SelfCheck:
    """Run description and implementation on random data and compare every buffer."""
    from .intrinsic_check import param_buffers

    desc, impl = intrin.desc, intrin.impl
    target = target or {"kind": "llvm"}
    rng = np.random.default_rng(seed)
    # Build each function once; the trials only draw new data.
    run_desc, run_impl = compile_prim_func(desc, target), compile_prim_func(impl, target)
    bufs = param_buffers(desc)
    written = {r.source.name for r in _root_writes(desc)}
    worst, detail = 0.0, ""
    for _ in range(trials):
        inputs = [
            random_array(b.shape, str(b.dtype), rng, accumulator=b.name in written) for b in bufs
        ]
        want = run_compiled(run_desc, inputs)
        got = run_compiled(run_impl, inputs)
        for buf, w, g in zip(bufs, want, got):
            err = max_error(g, w)
            tol = tolerance(str(buf.dtype)) * max(1.0, float(np.max(np.abs(w), initial=0)))
            if err > tol and not detail:
                detail = f"buffer {buf.name}: max error {err} > tolerance {tol}"
            worst = max(worst, err)
    return SelfCheck(intrin.name, worst, not detail, detail)


def _root_writes(func):
    from .tir_walk import root_block

    return root_block(func).writes


def tensorize_exact(intrin):
    """Tensorize a workload of exactly the intrinsic's shape; return the scheduled IRModule.

    The workload is the description itself, made a standalone function; its outermost loop
    is replaced by the intrinsic with ``Schedule.tensorize``.
    """
    from ._tvm import Schedule
    from .intrinsic_check import leaf_block

    name = intrin.register()
    # A fresh build: tensorize cannot map a workload onto a description that shares its
    # very Buffer objects.
    desc = intrin.fresh_desc().with_attr("global_symbol", "main")
    sch = Schedule(desc)
    block = sch.get_sblock(leaf_block(intrin.name, desc).name_hint)
    loops = sch.get_loops(block)
    if loops:
        sch.tensorize(loops[0], name)
    else:
        sch.tensorize(block, name)
    return sch.mod
