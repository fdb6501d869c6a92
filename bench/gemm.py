"""GEMM and convolution throughput of tirbyoc's offloads beside baselines measured in the same
run, every engine in a process of its own (JSON out).

* int8 templates (each one this CPU runs: x86_amx with AMX-INT8 (its peak: four independent
  ``tdpbusd`` tile chains), x86_vnni with AVX-512 VNNI, x86_avx512bw with AVX-512 BW,
  x86_avx2_gemm (the kernel call) and x86_avx2 with AVX2; ``--int8-templates`` picks): u8 x i8
  -> i32 GEMM 1024^3 and int8 NHWC convolutions with ResNet-50's layer shapes (batch 1), in GOPS (2 x MAC per
  second), at 1 and 2 threads, as a deployed model runs them - the weight packed once
  (`tirbyoc.relax.prepack`, what `tirbyoc run` / `build` do with a model's constant weights) -
  and with the weight packed on every call; each as a fraction of the peak of the template's
  own instruction (independent ``vpdpbusd`` chains for x86_vnni, ``vpmaddwd`` + ``vpaddd``
  chains for the others, in inline assembly, one thread per core) measured before and after
  the kernels in this run. Each template's code is built for its declared CPU (x86_avx2 for
  Haswell), so an AVX2 row measured on a newer CPU is the code an AVX2 machine runs. Beside
  the GEMM: TVM's default build and ``torch._int_mm`` (when torch is installed).
* fp32 templates (x86_fp32_avx512 with AVX-512F, x86_fp32_avx2 with AVX2 + FMA3;
  ``--fp32-templates`` picks): BERT-base's matmuls (sequence 128) and the same ResNet-50
  convolutions in fp32, the weight packed once and per call, in GFLOP/s, as a fraction of the
  fused multiply-add's peak (independent ``vfmadd231ps`` chains) measured in the run, beside
  numpy's matmul of the same shape (OpenBLAS) in its own process.
* blas: fp32 GEMM through the blas template beside numpy's matmul (OpenBLAS both), at 1 and 2
  threads, and the per-call overhead on a tiny GEMM. The OpenBLAS kernel each ran is recorded:
  unset ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` in the benchmark's command to let
  OpenBLAS pick this CPU's own kernel.

Each measurement runs in a fresh process with its thread pools sized before they start
(``TVM_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, torch's threads): in one process, whichever
pool spun last steals the cores of the next, and the same GEMM reads 0.04x or 1.2x numpy by
order. Usage: ``python bench/gemm.py [--quick] [--threads 1,2] [--out bench/results/gemm.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

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
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def spawn(kind: str, threads: int, quick: bool = False, **opts) -> dict:
    """Run one measurement in a process of its own, its pools sized to ``threads``; its JSON."""
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads)}
    env.pop("TIRBYOC_BLAS_THREADS", None)  # whole blas calls share TVM's pool, sized above
    cmd = [sys.executable, __file__, "--worker", kind, "--threads", str(threads)]
    for key, value in opts.items():
        cmd += [f"--{key}", str(value)]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"{kind} {opts} on {threads} thread(s) failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer layers")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--out", default=str(HERE / "results" / "gemm.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--int8-templates", help="int8 templates to time (default: every one of x86_amx, x86_vnni, "
                    "x86_avx512bw, x86_avx2_gemm, x86_avx2 this CPU runs; 'none': no int8 rows)")
    ap.add_argument("--fp32-templates", help="fp32 templates to time (default: every one of x86_fp32_avx512, "
                    "x86_fp32_avx2 this CPU runs; 'none': no fp32 rows)")
    ap.add_argument("--no-blas", action="store_true", help="leave out the blas rows")
    for hidden in ("--case", "--n"):
        ap.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--template", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        from gemm_workers import WORKERS  # deferred: imports TVM, after the pools are sized

        threads = int(args.threads)
        opts = {"template": args.template} if args.template else {}
        opts |= {"precision": args.precision} if args.precision else {}
        print(json.dumps(WORKERS[args.worker](threads=threads, case=args.case, n=args.n, quick=args.quick, **opts)))
        return
    from gemm_workers import FP32_PEAKS, INT8_PEAKS, report, templates_here  # deferred: as above

    threads = [int(t) for t in args.threads.split(",")]
    sizes = (64, 256, 512) if args.quick else (64, 256, 512, 1024)
    kernels, skipped = {}, {}
    for precision, peaks, wanted in (("int8", INT8_PEAKS, args.int8_templates),
                                     ("fp32", FP32_PEAKS, args.fp32_templates)):
        runs, why_not = templates_here(peaks)
        if wanted:
            runs = [t for t in runs if t in wanted.split(",")]
            why_not = {t: why for t, why in why_not.items() if t in wanted.split(",")}
        skipped |= why_not
        kernels[precision] = {t: _kernel_rows(t, threads, args.quick, precision) for t in runs}
    for template, why in skipped.items():
        progress(f"{template} skipped: {why}")
    blas = []
    for t in threads if not args.no_blas else []:
        for n in sizes:
            progress(f"blas sgemm {n}^3 and numpy, {t} thread(s), each in its own process, {BLAS_ROUNDS} rounds in turns")
            ours, theirs = _best_in_turns(t, n)
            blas.append({"n": n, "threads": t, **ours, **theirs, "ratio_vs_numpy": ours["tirbyoc_gflops"] / theirs["numpy_gflops"]})
    tiny = {**spawn("blas", 1, n=2), **spawn("numpy", 1, n=2)} if not args.no_blas else None
    result = {"machine": platform.processor() or platform.machine(), "cpu": _cpu(), "threads": threads,
              "int8": kernels["int8"], "fp32": kernels["fp32"], "skipped": skipped,
              "blas": blas, "blas_tiny_call": tiny, "quick": args.quick}
    print(report(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


BLAS_ROUNDS = 3  # blas and numpy processes in turns; the best of each: one run apart read 0.90 and 1.31x


def _best_in_turns(threads: int, n: int) -> tuple[dict, dict]:
    """(the blas GEMM's, numpy's matmul's) best of `BLAS_ROUNDS` processes each, started in
    turns: a slow stretch of a shared host falls on both, not on whichever ran then."""
    ours, theirs = [], []
    for _ in range(BLAS_ROUNDS):
        ours.append(spawn("blas", threads, n=n))
        theirs.append(spawn("numpy", threads, n=n))
    best_ours = max(ours, key=lambda r: r["tirbyoc_gflops"])
    best_theirs = max(theirs, key=lambda r: r["numpy_gflops"])
    return ({**best_ours, "tirbyoc_samples": [r["tirbyoc_gflops"] for r in ours]},
            {**best_theirs, "numpy_samples": [r["numpy_gflops"] for r in theirs]})


def _kernel_rows(template: str, threads: list[int], quick: bool, precision: str = "int8") -> dict:
    """``template``'s GEMM and convolution rows at each thread count, each a fraction of its
    instruction's peak measured before and after them (the best sample of the two runs); fp32
    matmul rows beside numpy's matmul of the same shape."""
    from gemm_workers import PEAKS, fp32_cases, fraction_of_peak, int8_cases

    progress(f"{template}: peak microbenchmark ({PEAKS[template][2]})")
    peaks = [spawn("peak", max(threads), template=template)]
    cases = fp32_cases(quick) if precision == "fp32" else int8_cases(quick)
    rows = []
    for t in threads:
        for case in range(len(cases)):
            row = spawn("kernel", t, quick, case=case, template=template, precision=precision)
            if precision == "fp32" and cases[case][3] is not None:
                row["numpy_gops"] = spawn("numpy", t, quick, n=0, case=case)["numpy_gflops"]
            progress(f"{template} {row['workload']}, {t} thread(s): {row.get('packed_gops', 0):.0f} "
                     f"{'GFLOP/s' if precision == 'fp32' else 'GOPS'}")
            rows.append(row)
        if precision == "int8":
            rows[-len(cases)]["torch_int_mm_gops"] = spawn("torch", t, quick)["gops"]
    peaks.append(spawn("peak", max(threads), template=template))
    peak = {t: max(p["best"].get(str(t), 0.0) for p in peaks) for t in threads}
    samples = {t: [s for p in peaks for s in p["samples"].get(str(t), [])] for t in threads}
    for r in rows:
        for key in ("packed", "per_call"):
            if f"{key}_gops" in r:
                r[f"{key}_of_peak"] = fraction_of_peak(r[f"{key}_gops"], peak[r["threads"]],
                                                       f"{template} {r['workload']}", r["threads"])
    return {"peak": PEAKS[template][2], "peak_gops": {str(t): g for t, g in peak.items()},
            "peak_samples": {str(t): s for t, s in samples.items()}, "rows": rows}


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
