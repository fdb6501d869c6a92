"""cuda_mma on a real GPU: every offload verified there, the tensor-core kernels timed beside
cuBLAS (torch.matmul) on the same GPU, in the same run (JSON out).

Each case is offloaded with ``tirbyoc.offload(func, "cuda_mma")``, which builds the rewritten
kernel for the GPU, runs it there and compares its output with TVM's default build of the
untouched function (on the CPU: an unscheduled PrimFunc has no GPU build). The verified kernel
is then timed with TVM's time evaluator (best of 5 runs of ``number`` calls) and, where torch
is installed, torch's matmul of the same shape and dtypes (cuBLAS) with CUDA events. Rows give
TFLOP/s (TOPS for int8) and the ratio to cuBLAS. Run on a machine with a CUDA GPU:
``python bench/cuda_mma.py [--out bench/results/cuda_mma.json]``.
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

# (name, M, N, K, in dtype, accumulator dtype)
CASES = [
    ("fp16 GEMM 1024^3", 1024, 1024, 1024, "float16", "float32"),
    ("fp16 GEMM 2048^3", 2048, 2048, 2048, "float16", "float32"),
    ("int8 GEMM 1024^3", 1024, 1024, 1024, "int8", "int32"),
    ("int8 GEMM 2048^3", 2048, 2048, 2048, "int8", "int32"),
]


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


def measure(case) -> dict:
    name, m, n, k, dtype, acc = case
    t0 = time.time()
    out = tirbyoc.offload(matmul(m, n, k, dtype, dtype, acc), "cuda_mma")
    row = {"case": name, "M": m, "N": n, "K": k, "dtype": dtype, "coverage": out.coverage,
           "verification": out.verification.describe(), "verified": bool(out.verification.passed)}
    if out.verification.passed:
        target = tirbyoc.get_template("cuda_mma").tvm_target()
        ms = time_kernel(out.func, target)
        peer = time_cublas(m, n, k, dtype)
        ops = 2 * m * n * k
        row.update(ms=round(ms, 4), tflops=round(ops / ms / 1e9, 2),
                   cublas_ms=None if peer is None else round(peer, 4),
                   cublas_tflops=None if peer is None else round(ops / peer / 1e9, 2),
                   vs_cublas=None if peer is None else round(peer / ms, 3))
    row["seconds"] = round(time.time() - t0, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cuda_mma.json"))
    args = ap.parse_args(argv)
    if not cuda_available():
        print("no CUDA GPU visible to TVM here: this benchmark runs on a GPU machine", file=sys.stderr)
        return 2
    dev = tvm.cuda(0)
    rows = []
    for case in CASES:
        progress(case[0])
        rows.append(measure(case))
        print(json.dumps(rows[-1]), flush=True)
    result = {"gpu": dev.device_name, "compute_version": dev.compute_version,
              "host": platform.processor() or platform.machine(), "target": "cuda_mma (sm_80 WMMA)",
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'case':20} {'verified':9} {'ms':>8} {'TFLOP/s':>8} {'cuBLAS ms':>10} {'x cuBLAS':>9}")
    for r in rows:
        print(f"{r['case']:20} {str(r['verified']):9} {r.get('ms', '-'):>8} {r.get('tflops', '-'):>8} "
              f"{str(r.get('cublas_ms', '-')):>10} {str(r.get('vs_cublas', '-')):>9}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
