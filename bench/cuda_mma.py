"""cuda_mma on a real GPU: every offload verified there, the tensor-core kernels timed beside
cuBLAS (torch.matmul) on the same GPU, in the same run (JSON out).

cuda_mma schedules a GEMM that one of its declared block tiles divides as its tensor-core
kernel (ldmatrix + mma.sync, 2x2 warps, a cp.async pipeline; `tirbyoc.rewrite.block.tensor_core`);
each row names the tile it chose, times every other declared tile that divides the GEMM
(``tilings``: what the choice left on the table) and the one-warp WMMA schedule the kernel
replaced (``one_warp``). int8 GEMMs take B as [N, K], the layout int8's ldmatrix reads and
the one cuBLAS's int8 GEMM is timed in (``torch._int_mm`` with a column-major B).

Each case is offloaded with ``tirbyoc.offload(func, "cuda_mma")``, which builds the rewritten
kernel for the GPU, runs it there and compares its output with TVM's default build of the
untouched function (on the CPU: an unscheduled PrimFunc has no GPU build). The verified kernel
is then timed with TVM's time evaluator (best of 5 runs of ``number`` calls) and, where torch
is installed, torch's matmul of the same shape and dtypes (cuBLAS) with CUDA events. Rows give
TFLOP/s (TOPS for int8) and the ratio to cuBLAS. Run on a machine with a CUDA GPU:
``python bench/cuda_mma.py [--out bench/results/cuda_mma.json] [--sizes 1024,2048,4096,8192]``.

Sizes above ``--cpu-check-max`` (2048) are offloaded without the CPU check (TVM's unscheduled
build of a 4096^3 GEMM takes minutes on the host) and checked on the GPU instead against
torch's product in fp32 / int32 accumulation on the same inputs; the row says which check
it had. Each size also times TVM's own tensor-core rule (dlight's ``gpu.Matmul``: WMMA, 8 warps
per block, a 2-stage pipeline through ``shared.dyn``), checked the same way, as the point a
user of plain TVM starts from.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import tirbyoc
from tirbyoc._tvm import build, cuda_available, tvm
from tirbyoc.testing.workloads import matmul

DTYPES = (("fp16", "float16", "float32"), ("int8", "int8", "int32"))  # (label, in, accumulator)


def cases(sizes):
    """(name, M, N, K, in dtype, accumulator dtype) for each dtype and size."""
    return [(f"{label} GEMM {s}^3", s, s, s, dt, acc) for label, dt, acc in DTYPES for s in sizes]


def gemm(m, n, k, dtype, acc):
    """The workload: B as [K, N] for fp16, [N, K] for int8 (see the module's docstring)."""
    return matmul(m, n, k, dtype, dtype, acc, trans_b=dtype == "int8")


def group_of(template, dtype: str):
    """The template's group whose operands are ``dtype``."""
    return next(g for g in template.groups if g.compute.operands[0].dtype == dtype)


def with_kernel(template, dtype: str, **changes):
    """``template`` with the ``dtype`` group's tensor-core kernel changed (``kernel=None``:
    removed, leaving the one-warp schedule)."""
    from dataclasses import replace

    changed = group_of(template, dtype)

    def group(g):
        if g is not changed:
            return g
        if "kernel" in changes:
            return replace(g, kernel=changes["kernel"])
        return replace(g, kernel=replace(g.kernel, **changes))

    return replace(template, groups=tuple(group(g) for g in template.groups))


def kernel_step(out) -> str:
    steps = [str(s) for s in out.blocks[0].steps]
    return next((s for s in steps if s.startswith("tensor-core kernel") or s.startswith("one warp")), "")


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def time_kernel(func, target) -> float:
    """Milliseconds per call of ``func`` built for ``target``, on the GPU (best of 5)."""
    exe = build(func, target)
    dev = tvm.cuda(0)
    shapes = [(tuple(int(d) for d in b.shape), str(b.dtype)) for b in func.params]
    args = [tvm.runtime.tensor(np.zeros(s, d), device=dev) for s, d in shapes]
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"
    timer = exe.mod.time_evaluator(name, dev, number=20, repeat=5)
    return float(np.min(timer(*args).results)) * 1e3


def time_cublas(m, n, k, dtype) -> float | None:
    """Milliseconds per call of torch.matmul (cuBLAS) of the same shape, or None without torch."""
    try:
        import torch  # deferred: optional, only for the peer's row
    except ImportError:
        return None
    dev = torch.device("cuda")
    if dtype == "int8":  # torch's int8 GEMM with int32 accumulation
        a = torch.randint(-128, 127, (m, k), dtype=torch.int8, device=dev)
        b = torch.randint(-128, 127, (k, n), dtype=torch.int8, device=dev).t().contiguous().t()
        call = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        a = torch.randn(m, k, dtype=torch.float16, device=dev)
        b = torch.randn(k, n, dtype=torch.float16, device=dev)
        call = lambda: torch.matmul(a, b)  # noqa: E731
    for _ in range(5):
        call()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            call()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 20)
    return best


def check_on_gpu(func, target, m, n, k, dtype) -> tuple[bool, str]:
    """Run ``func`` built for ``target`` on the GPU and compare it with torch's product of the
    same inputs (fp32 accumulation for fp16, exact int32 for int8)."""
    import torch  # deferred: the check at sizes the CPU reference cannot reach needs it

    exe = build(func, target)
    dev, tdev = tvm.cuda(0), torch.device("cuda")
    rng = np.random.default_rng(0)
    if dtype == "int8":  # B as [N, K]
        a, b = rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (n, k), dtype=np.int8)
        want = torch._int_mm(torch.from_numpy(a).to(tdev), torch.from_numpy(b).to(tdev).t()).cpu().numpy()
        out_dtype = "int32"
    else:
        a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (k, n)))
        want = (torch.from_numpy(a).to(tdev).float() @ torch.from_numpy(b).to(tdev).float()).cpu().numpy()
        out_dtype = "float32"
    args = [tvm.runtime.tensor(a, device=dev), tvm.runtime.tensor(b, device=dev),
            tvm.runtime.tensor(np.zeros((m, n), out_dtype), device=dev)]
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "main"
    exe.mod[name](*args)
    got = args[2].numpy()
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    tol = 0.0 if dtype == "int8" else 1e-3 * float(np.max(np.abs(want))) + 1e-2
    return err <= tol, f"on the GPU against torch (max |err| {err:.3g}, tolerance {tol:.3g})"


def dlight_func(m, n, k, dtype, acc, target):
    """TVM's own tensor-core schedule of the same GEMM (dlight's gpu.Matmul rule)."""
    from tvm.s_tir import dlight  # deferred: imports TVM's CUDA tensor intrinsics (slow)

    mod = tvm.IRModule({"main": matmul(m, n, k, dtype, dtype, acc)})
    with target:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(mod)
    return mod["main"]


def rates(ms: float, peer: float | None, ops: int) -> dict:
    return dict(ms=round(ms, 4), tflops=round(ops / ms / 1e9, 2),
                vs_cublas=None if peer is None else round(peer / ms, 3))


def variant_row(template, case, peer) -> dict:
    """One schedule of the case (a forced tile, or the one-warp schedule): checked on the GPU
    against torch, then timed."""
    _, m, n, k, dtype, acc = case
    try:
        out = tirbyoc.offload(gemm(m, n, k, dtype, acc), template, verify=False)
        target = template.tvm_target()
        ok, how = check_on_gpu(out.func, target, m, n, k, dtype)
        row = {"schedule": kernel_step(out), "verified": ok, "verification": how}
        if ok:
            row.update(rates(time_kernel(out.func, target), peer, 2 * m * n * k))
        return row
    except Exception as err:  # noqa: BLE001 - one variant failing is a finding, not a stop
        return {"verified": False, "error": f"{type(err).__name__}: {str(err)[-300:]}"}


VARIANTS = ("tilings", "rasters", "fragments", "one_warp", "dlight")  # what --variants may name


def alternatives(case, peer, variants=VARIANTS) -> dict:
    """Beside the chosen schedule: every other declared tile that divides the GEMM
    (``tilings``); from 2048, the first tile that fits with its thread blocks in groups of 4
    and 8 block rows (``rasters``) and with its fragments double-buffered in registers at
    block_k x1 and x2 (``fragments``); the one-warp schedule (``one_warp``)."""
    from dataclasses import replace

    _, m, n, k, dtype, _ = case
    template = tirbyoc.get_template("cuda_mma")
    kernel = group_of(template, dtype).kernel
    first = next((t for t in kernel.tilings if t.divides(m, n, k)), None)
    out = {}
    if "tilings" in variants:
        out["tilings"] = {t.describe(): variant_row(with_kernel(template, dtype, tilings=(t,), min_blocks=1), case, peer)
                          for t in kernel.tilings if t.divides(m, n, k)}
    if "rasters" in variants and first is not None and min(m, n) >= 2048:  # L2 reuse
        out["rasters"] = {f"{first.describe()}, groups of {g} block rows": variant_row(
            with_kernel(template, dtype, tilings=(first,), min_blocks=1, raster=g), case, peer) for g in (4, 8)}
    if "fragments" in variants and first is not None and min(m, n) >= 2048:
        rows = {}
        for scale in (1, 2):
            t = replace(first, block_k=first.block_k * scale)
            if t.divides(m, n, k):
                rows[f"{t.describe()}, ldmatrix one step ahead"] = variant_row(
                    with_kernel(template, dtype, tilings=(t,), min_blocks=1, fragment_pipeline=True), case, peer)
        out["fragments"] = rows
    if "one_warp" in variants:
        out["one_warp"] = variant_row(with_kernel(template, dtype, kernel=None), case, peer)
    return out


def measure(case, cpu_check_max: int, compare: bool, variants=VARIANTS) -> dict:
    name, m, n, k, dtype, acc = case
    t0 = time.time()
    target = tirbyoc.get_template("cuda_mma").tvm_target()
    cpu_check = max(m, n, k) <= cpu_check_max
    out = tirbyoc.offload(gemm(m, n, k, dtype, acc), "cuda_mma", verify=cpu_check)
    if cpu_check:
        verified, how = bool(out.verification.passed), out.verification.describe()
    else:
        verified, how = check_on_gpu(out.func, target, m, n, k, dtype)
    row = {"case": name, "M": m, "N": n, "K": k, "dtype": dtype,
           "b_layout": "[N, K]" if dtype == "int8" else "[K, N]", "schedule": kernel_step(out),
           "coverage": out.coverage, "verification": how, "verified": verified}
    ops = 2 * m * n * k
    peer = time_cublas(m, n, k, dtype)
    row.update(cublas_ms=None if peer is None else round(peer, 4),
               cublas_tflops=None if peer is None else round(ops / peer / 1e9, 2))
    if verified:
        row.update(rates(time_kernel(out.func, target), peer, ops))
    if compare:
        row.update(alternatives(case, peer, variants))
    if "dlight" not in variants:
        row["seconds"] = round(time.time() - t0, 1)
        return row
    try:
        plain = dlight_func(m, n, k, dtype, acc, target) if dtype == "float16" else None
        if plain is None:
            raise NotImplementedError("dlight's int8 rule does not build in TVM 0.27 (bench/results/cuda_mma_h100.json)")
        ok, plain_how = check_on_gpu(plain, target, m, n, k, dtype)
        row["tvm_dlight"] = {"verified": ok, "verification": plain_how,
                             **(rates(time_kernel(plain, target), peer, ops) if ok else {})}
    except Exception as err:  # noqa: BLE001 - TVM's own rule failing is a finding, not a stop
        row["tvm_dlight"] = {"verified": False, "error": f"{type(err).__name__}: {str(err)[-300:]}"}
    row["seconds"] = round(time.time() - t0, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cuda_mma.json"))
    ap.add_argument("--sizes", default="1024,2048,4096,8192", help="square GEMM sizes")
    ap.add_argument("--cpu-check-max", type=int, default=1024,
                    help="largest size checked against TVM's CPU build (larger: against torch on the GPU)")
    ap.add_argument("--no-compare", action="store_true",
                    help="time only the chosen schedule (not the other tiles and the one-warp schedule)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"what to time beside the chosen schedule, some of {', '.join(VARIANTS)}")
    args = ap.parse_args(argv)
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if not cuda_available():
        print("no CUDA GPU visible to TVM here: this benchmark runs on a GPU machine", file=sys.stderr)
        return 2
    dev = tvm.cuda(0)
    rows = []
    result = {"gpu": dev.device_name, "compute_version": dev.compute_version,
              "host": platform.processor() or platform.machine(), "target": "cuda_mma (sm_80)",
              "cuda_mma_schedule": "tensor-core kernel (ldmatrix + mma.sync, cp.async pipeline) where a tile fits",
              "rows": rows}
    for case in cases([int(v) for v in args.sizes.split(",")]):
        progress(case[0])
        rows.append(measure(case, args.cpu_check_max, not args.no_compare, variants))
        print(json.dumps(rows[-1]), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")  # each row kept as it comes
    print(f"{'case':20} {'verified':9} {'ms':>8} {'TFLOP/s':>8} {'cuBLAS ms':>10} {'x cuBLAS':>9} "
          f"{'one warp x':>11} {'dlight x':>9}  schedule")
    for r in rows:
        d, w = r.get("tvm_dlight", {}), r.get("one_warp", {})
        print(f"{r['case']:20} {str(r['verified']):9} {r.get('ms', '-'):>8} {r.get('tflops', '-'):>8} "
              f"{str(r.get('cublas_ms', '-')):>10} {str(r.get('vs_cublas', '-')):>9} "
              f"{str(w.get('vs_cublas', '-')):>11} {str(d.get('vs_cublas', '-')):>9}  {r['schedule']}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
