"""GEMM throughput of tirbyoc's offloads beside baselines measured in the same run (JSON out).

* x86_vnni: u8 x i8 -> i32 GEMM 1024^3 and int8 NHWC convolutions with ResNet-50's layer
  shapes (batch 1), in GOPS (2 x MAC per second), beside: this CPU's VNNI peak (24
  independent ``vpdpbusd`` chains in inline assembly, one thread per core), TVM's default
  build of the same PrimFunc, and ``torch._int_mm`` when torch is installed.
* blas: fp32 GEMM through the blas template beside numpy's matmul (same OpenBLAS family),
  and the per-call overhead on a tiny GEMM.

Timings are medians of interleaved repeats; figures are ratios against baselines run in this
process. Usage: ``python bench/gemm.py [--quick] [--out bench/results/gemm.json]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import threading
import time
from pathlib import Path

import numpy as np

import tirbyoc
from tirbyoc import ExternLibrary
from tirbyoc._tvm import build, to_tensor, tvm
from tirbyoc.offloading.table import render
from tirbyoc.ir.domains import random_array
from tirbyoc.testing.workloads import conv2d, matmul

HERE = Path(__file__).resolve().parent
CORES = 2

# ResNet-50 v1.5 convolutions (batch 1, NHWC): (name, H=W, C, OC, kernel, stride)
RESNET_CONVS = [
    ("res2 3x3", 56, 64, 64, 3, 1),
    ("res2 1x1 expand", 56, 64, 256, 1, 1),
    ("res3 3x3", 28, 128, 128, 3, 1),
    ("res4 3x3", 14, 256, 256, 3, 1),
    ("res5 3x3", 7, 512, 512, 3, 1),
    ("res5 1x1 reduce", 7, 2048, 512, 1, 1),
]


def progress(msg: str) -> None:
    print(f"  .. {msg}", flush=True)


def time_tvm(executable, args, number: int, repeat: int) -> float:
    """Median seconds per call (TVM's own timer: warm-up, then `repeat` x `number` calls)."""
    timer = executable.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
    return statistics.median(timer(*args).results)


def time_py(fn, number: int, repeat: int) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs)


class VnniPeak:
    """This CPU's VNNI peak per thread count: 24 independent ``vpdpbusd`` zmm chains per
    thread, best of several repetitions, sampled again around every kernel (interleaved), so
    that one busy moment cannot set the denominator. `fraction` refuses a kernel above the
    best peak seen: that means the peak was measured while the machine was busy."""

    def __init__(self, seconds: float = 0.25):
        lib = ExternLibrary("tirbyoc_vnni_peak", [HERE / "csrc" / "vnni_peak.c"], ["tirbyoc_vnni_peak"])
        self.fn = lib.load().tirbyoc_vnni_peak
        self.fn.restype, self.fn.argtypes = ctypes.c_int64, [ctypes.c_int64]
        self.fn(100_000)
        self.iters = int(seconds * 2.5e9 / 24)
        self.best: dict[int, float] = {}
        self.samples: dict[int, list] = {}

    def sample(self, threads: int = CORES, reps: int = 3) -> float:
        for _ in range(reps):
            workers = [threading.Thread(target=self.fn, args=(self.iters,)) for _ in range(threads)]
            t = time.perf_counter()
            for th in workers:
                th.start()
            for th in workers:
                th.join()
            gops = threads * self.iters * 24 * 64 * 2 / (time.perf_counter() - t) / 1e9
            self.samples.setdefault(threads, []).append(round(gops, 1))
            self.best[threads] = max(self.best.get(threads, 0.0), gops)
        return self.best[threads]

    def fraction(self, gops: float, what: str, threads: int = CORES) -> float:
        frac = gops / self.best[threads]
        if frac > 1.0:
            raise SystemExit(f"{what}: {gops:.0f} GOPS is {frac:.2f} of the {threads}-thread VNNI "
                             f"peak measured ({self.best[threads]:.0f} GOPS): the peak was taken "
                             "while the machine was busy. Rerun on a quiet machine.")
        return frac


def int_mm_gops(m: int, n: int, k: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(CORES)
    a = torch.randint(-128, 127, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 127, (k, n), dtype=torch.int8)
    sec = time_py(lambda: torch._int_mm(a, b), number=5, repeat=5)
    return 2 * m * n * k / sec / 1e9


def int8_args(func):
    """Seeded arguments in the function's parameter order (tirbyoc.verify's test data)."""
    rng = np.random.default_rng(0)
    return [to_tensor(random_array([int(x) for x in buf.shape], str(buf.dtype), rng))
            for buf in func.params]


def vnni_case(name: str, func, macs: int, *, baseline: bool) -> dict:
    progress(f"x86_vnni: {name}")
    target = tirbyoc.get_template("x86_vnni").target
    off = tirbyoc.offload(func, "x86_vnni")
    if not off.offloaded:
        return {"workload": name, "offloaded": False, "reason": off.blocks[0].reason}
    args = int8_args(func)
    fast = build(off.func, target)
    number = max(1, int(2e8 / macs))
    sec = time_tvm(fast, args, number, 7)
    row = {"workload": name, "macs": macs, "offloaded": True, "verified": bool(off.verification),
           "tirbyoc_gops": 2 * macs / sec / 1e9}
    if baseline:
        slow = build(func, target)
        row["tvm_default_gops"] = 2 * macs / time_tvm(slow, args, 1, 3) / 1e9
    return row


def blas_case(n: int) -> dict:
    progress(f"blas: sgemm {n}^3 vs numpy")
    func = matmul(n, n, n, trans_b=False)
    off = tirbyoc.offload(func, "blas")
    exe = build(off.func, tirbyoc.get_template("blas").target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    args = [to_tensor(a), to_tensor(b), to_tensor(np.zeros((n, n), np.float32))]
    number = max(1, int(5e7 / n ** 3))
    ours, theirs = [], []
    for _ in range(5):  # interleaved: the machine is shared and noisy
        ours.append(time_tvm(exe, args, number, 1))
        theirs.append(time_py(lambda: a @ b, number, 1))
    t_ours, t_np = statistics.median(ours), statistics.median(theirs)
    return {"n": n, "verified": bool(off.verification), "tirbyoc_gflops": 2 * n ** 3 / t_ours / 1e9,
            "numpy_gflops": 2 * n ** 3 / t_np / 1e9, "ratio_vs_numpy": t_np / t_ours,
            "tirbyoc_us": t_ours * 1e6, "numpy_us": t_np * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer layers")
    ap.add_argument("--out", default=str(HERE / "results" / "gemm.json"))
    args = ap.parse_args()
    size = 512 if args.quick else 1024
    convs = RESNET_CONVS[:2] if args.quick else RESNET_CONVS

    rows, peak = [], None
    vnni = tirbyoc.get_template("x86_vnni")
    if vnni.runs_here():
        progress("VNNI peak microbenchmark (1 and 2 threads)")
        peak = VnniPeak()
        peak.sample(1)
        peak.sample(CORES)
        cases = [(f"GEMM {size}^3 (B [N,K])",
                  matmul(size, size, size, "uint8", "int8", "int32", trans_b=True), size ** 3, True)]
        for name, hw, c, oc, kernel, stride in convs:
            func = conv2d(1, c, hw + kernel - 1, hw + kernel - 1, oc, kernel, kernel, layout="NHWC",
                          stride=stride, dtype="uint8", wdtype="int8", acc="int32")
            cases.append((f"conv {name} {hw}x{hw}x{c}->{oc}", func, hw * hw * c * oc * kernel * kernel,
                          False))
        for name, func, macs, baseline in cases:
            row = vnni_case(name, func, macs, baseline=baseline)
            peak.sample(CORES)  # interleaved: the peak is sampled around every kernel
            rows.append(row)
        rows[0]["torch_int_mm_gops"] = int_mm_gops(size, size, size)
        for r in rows:
            if r.get("offloaded"):
                r["fraction_of_peak"] = peak.fraction(r["tirbyoc_gops"], r["workload"])
    else:
        progress(f"x86_vnni skipped: {vnni.unavailable_reason()}")
    blas = [blas_case(n) for n in ((64, 256, 512) if args.quick else (64, 256, 512, 1024))]
    tiny = blas_case(2)

    if peak is not None:
        print(f"\nVNNI peak (this CPU; best of {len(peak.samples[CORES])} samples): "
              + ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.0f} GOPS" for t, g in sorted(peak.best.items()))
              + "\n")
        table = [(r["workload"], f"{r.get('tirbyoc_gops', 0):.0f}", f"{r.get('fraction_of_peak', 0):.2f}",
                  f"{r['tvm_default_gops']:.1f}" if "tvm_default_gops" in r else "-",
                  f"{r['torch_int_mm_gops']:.0f}" if r.get("torch_int_mm_gops") else "-",
                  "yes" if r.get("verified") else "NO") for r in rows]
        print(render(["x86_vnni workload", "GOPS", "of peak", "TVM default", "torch._int_mm", "verified"], table))
        print()
    print(render(["blas n", "GFLOP/s", "numpy GFLOP/s", "ratio", "verified"],
                 [(b["n"], f"{b['tirbyoc_gflops']:.1f}", f"{b['numpy_gflops']:.1f}",
                   f"{b['ratio_vs_numpy']:.2f}", "yes" if b["verified"] else "NO") for b in blas]))
    print(f"\nblas 2x2x2 call: {tiny['tirbyoc_us']:.2f} us (numpy matmul {tiny['numpy_us']:.2f} us)")
    result = {"machine": platform.processor() or platform.machine(), "cores": CORES,
              "vnni_peak_gops": None if peak is None else {str(t): g for t, g in peak.best.items()},
              "vnni_peak_samples": None if peak is None else {str(t): v for t, v in peak.samples.items()},
              "x86_vnni": rows if peak is not None else f"skipped: {vnni.unavailable_reason()}",
              "blas": blas, "blas_tiny_call": tiny, "quick": args.quick}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
