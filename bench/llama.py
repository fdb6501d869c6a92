"""A Llama decoder layer against its limits and against ONNX Runtime (JSON out).

The layer is a 1B-class model's (`tirbyoc.testing.decoder`: hidden 2048, 16 heads of 128,
SiLU MLP 5632; 206 MB of float32 weights) in the two ONNX files a serving export writes: the
decode model (one new token per sequence, the KV cache of ``past`` positions in and grown by
one out) and the prefill model (the prompt). Each engine takes the file as it is, its
``batch``, ``seq`` and ``past`` named: tirbyoc builds it once (symbolic, the sizes bound at run
time) and ONNX Runtime with its dynamic shapes; each runs in its own process, the two timed in
turns (`bench/models.py`'s machinery: spreads, checks against TVM's build, ONNX Runtime's
agreement). Beside them, in processes of their own with the same thread count:

* **decode** is a pass over the weights per step: its row gives the bytes one step must move
  (the weights, the past keys and values read, the present ones written, as the file's Concat
  defines them) over its time, as a fraction of the memory bandwidth measured in the same run
  (a STREAM-like copy of 512 MB: TVM's parallel, vectorized loop, bytes read + written);
* **prefill** is a GEMM of ``batch x seq`` rows: its row gives the multiply-adds over its time
  as a fraction of the template's peak measured in the same run (`bench/gemm_workers.peak`:
  the fused multiply-add's for fp32, ``vpdpbusd``'s for int8).

``--precisions fp32,int8``: int8 is the same file through ONNX Runtime's dynamic quantization
(int8 weights, activations quantized at run time; `models.DYNAMIC_QUANTIZATION`), on the int8
template this CPU runs (the attention's float matmuls on the fp32 one, their own loops at a
decoding step's few rows: `tirbyoc.offloading.few_rows`); a decode step then
moves a byte a weight. Its row is checked bit for bit against TVM's build, and against ONNX
Runtime by accuracy: each engine's output against the float file's (ONNX Runtime), tirbyoc's
error within 1.25x of ONNX Runtime's (`models._float_output` says why not bit for bit).

Usage: ``python bench/llama.py [--threads 1,2] [--precisions fp32,int8]
[--cases decode_b1,decode_b8,prefill_128,prefill_512] [--rounds 3] [--cache DIR]
[--out bench/results/llama.json]``. Every figure names this CPU and
the thread count; unset ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` in the command as for the
other benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# case -> (model of bench/models.py, the sizes it runs at)
CASES = {
    "decode_b1": ("llama_decode", {"batch": 1, "seq": 1, "past": 128}),
    "decode_b8": ("llama_decode", {"batch": 8, "seq": 1, "past": 128}),
    "prefill_128": ("llama_prefill", {"batch": 1, "seq": 128}),
    "prefill_512": ("llama_prefill", {"batch": 1, "seq": 512}),
}
COPY_MB = 512  # the bandwidth copy: far beyond every cache level


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def bandwidth_worker(threads: int) -> dict:
    """GB/s of a parallel, vectorized copy of `COPY_MB` (bytes read + written; best of 7),
    built by TVM for this CPU: its thread pool is the one the engines run on."""
    import numpy as np
    import tvm
    from tvm.script import tirx as T

    from tirbyoc.decl.host import host_target

    n = COPY_MB * 1024 * 1024 // 4
    chunk = 1 << 16

    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for io in T.parallel(n // chunk):
            for ii in range(chunk // 8):
                for v in T.vectorized(8):
                    with T.sblock("copy"):
                        i = T.axis.spatial(n, io * chunk + ii * 8 + v)
                        b[i] = a[i]

    exe = tvm.compile(tvm.IRModule({"main": copy}), target=host_target())
    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.ones(n, "float32"), dev)
    b = tvm.runtime.tensor(np.zeros(n, "float32"), dev)
    timer = exe.mod.time_evaluator("main", dev, number=3, repeat=7)
    best = min(timer(a, b).results)
    return {"copy_mb": COPY_MB, "gb_per_s": 2 * n * 4 / best / 1e9, "threads": threads}


def _spawn_bandwidth(threads: int) -> dict:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, "--bandwidth-worker", str(threads)], env=env,
                          stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spawn_peak(threads: int, template: str) -> float:
    """GFLOP/s of ``template``'s fused multiply-add at ``threads`` threads (bench/gemm.py's
    worker, a process of its own)."""
    from gemm import spawn

    return spawn("peak", threads, template=template)["best"][str(threads)]


def step_bytes(size, sizes: dict, weight_bytes: int = 4) -> dict:
    """The bytes one run of the layer at ``sizes`` must move: its weights (``weight_bytes`` a
    weight: 4 in float32, 1 in int8), the past keys and values it reads, the present ones it
    writes (past + seq positions; float32 in both files)."""
    weights = weight_bytes * size.weights
    per_position = 2 * 4 * size.hidden * sizes["batch"]  # keys and values of every head
    past = sizes.get("past", 0)
    return {"weights": weights, "kv_read": per_position * past, "kv_written": per_position * (past + sizes["seq"]),
            "total": weights + per_position * (2 * past + sizes["seq"])}


def macs(size, sizes: dict) -> int:
    """Multiply-adds of the layer at ``sizes``: the projections and MLP per token, and the
    attention's two matmuls over the past and new positions."""
    tokens = sizes["batch"] * sizes["seq"]
    positions = sizes.get("past", 0) + sizes["seq"]
    return tokens * size.weights + 2 * tokens * positions * size.hidden


def case_row(args, threads: str, case: str, precision: str, limits: dict) -> dict:
    """One case at one precision measured by bench/models.py's `measure` (engines in turns,
    checks), with the case's bytes or multiply-adds against the limit measured in the run."""
    import models

    from tirbyoc.testing.decoder import DecoderSize

    model, sizes = CASES[case]
    args.size = [f"{k}={v}" for k, v in sizes.items()]
    row = {"case": case, **models.measure(args, threads, model, precision)}
    if "latency_ms" not in row:
        return row
    size, seconds = DecoderSize(), row["latency_ms"]["tirbyoc"] / 1e3
    ort_seconds = row["latency_ms"]["onnxruntime"] / 1e3
    if model == "llama_decode":
        moved = step_bytes(size, sizes, 1 if precision == "int8" else 4)
        gbs = limits["bandwidth"]["gb_per_s"]
        row["decode"] = {"bytes": moved, "tirbyoc_gb_per_s": moved["total"] / seconds / 1e9,
                         "onnxruntime_gb_per_s": moved["total"] / ort_seconds / 1e9, "bandwidth_gb_per_s": gbs,
                         "fraction_of_bandwidth": moved["total"] / seconds / 1e9 / gbs,
                         "onnxruntime_fraction_of_bandwidth": moved["total"] / ort_seconds / 1e9 / gbs}
    else:
        flops = 2 * macs(size, sizes)
        peak = limits["peak_gops"][precision]
        row["prefill"] = {"flops": flops, "tirbyoc_gflops": flops / seconds / 1e9,
                          "onnxruntime_gflops": flops / ort_seconds / 1e9, "peak_gops": peak,
                          "fraction_of_peak": flops / seconds / 1e9 / peak,
                          "onnxruntime_fraction_of_peak": flops / ort_seconds / 1e9 / peak}
    return row


def table(rows) -> str:
    from tirbyoc.offloading.table import render  # deferred: imports TVM

    out = []
    for r in rows:
        if "latency_ms" not in r:
            out.append((r["case"], r["precision"], str(r["threads"]), "not run: " + str(r.get("not_run"))[:50],
                        "", "", "", ""))
            continue
        lat = r["latency_ms"]
        spread = (r.get("ratio_spread") or {}).get("onnxruntime")
        limit = (f"{r['decode']['fraction_of_bandwidth']:.2f} / {r['decode']['onnxruntime_fraction_of_bandwidth']:.2f}"
                 " of bandwidth" if "decode" in r else
                 f"{r['prefill']['fraction_of_peak']:.2f} / {r['prefill']['onnxruntime_fraction_of_peak']:.2f} of peak")
        out.append((r["case"], r["precision"], str(r["threads"]), f"{lat['tirbyoc']:.2f}", f"{lat['onnxruntime']:.2f}",
                    f"{r['speedup_vs_onnxruntime']:.2f}x " + (f"[{spread[0]:.2f}-{spread[1]:.2f}]" if spread else ""),
                    limit, "yes" if r["checks"]["verified_vs_tvm"] and r["checks"]["agrees_with_onnxruntime"] else "NO"))
    return render(("case", "precision", "threads", "tirbyoc ms", "ORT ms", "tirbyoc vs ORT (round range)",
                   "tirbyoc / ORT against the limit", "checked"), out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default="decode_b1,decode_b8,prefill_128,prefill_512")
    ap.add_argument("--precisions", default="fp32", help="fp32, int8 (ONNX Runtime's dynamic quantization)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds in turns, at least (bench/models.py)")
    ap.add_argument("--max-rounds", type=int, default=7)
    ap.add_argument("--spread", type=float, default=0.10)
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement")
    ap.add_argument("--cache", help="folder for the ONNX files (default: a temporary one)")
    ap.add_argument("--out", default=str(HERE / "results" / "llama.json"))
    ap.add_argument("--bandwidth-worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bandwidth_worker:
        print(json.dumps(bandwidth_worker(args.bandwidth_worker)))
        return
    args.fast_math, args.int8_template, args.fp32_template, args.bf16_template = False, None, None, None
    import models

    rows, limits = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        args.cache = args.cache or tmp
        Path(args.cache).mkdir(parents=True, exist_ok=True)
        precisions = args.precisions.split(",")
        templates = {p: models.template_for(p, args).split(",")[0] for p in precisions}
        for threads in args.threads.split(","):
            progress(f"memory bandwidth and the peak of {', '.join(templates.values())} at {threads} thread(s)")
            limits[threads] = {"bandwidth": _spawn_bandwidth(int(threads)),
                               "peak_gops": {p: _spawn_peak(int(threads), t) for p, t in templates.items()},
                               "templates": templates}
            for precision in precisions:
                for case in args.cases.split(","):
                    progress(f"{case} {precision} at {threads} thread(s): tirbyoc and ONNX Runtime in turns")
                    t0 = time.perf_counter()
                    rows.append(case_row(args, threads, case, precision, limits[threads]))
                    progress(f"{case}: {time.perf_counter() - t0:.0f} s")
    print(table(rows))
    result = {"benchmark": "llama", "cpu": models._cpu(), "limits": limits, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
