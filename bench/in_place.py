"""Reading in place: ResNet-50's convolutions on blas with their staging copies and without.

Each distinct convolution of ResNet-50 (NCHW, fp32, batch 1) is rewritten once for blas (the
tile `offload` chooses for one core); the
same rewrite is built twice, as the engine leaves it (every staging copy made on each call)
and after `tirbyoc.rewrite.functions.in_place` (copies that move nothing replaced by views), and both
are timed, interleaved, beside the GEMM alone (numpy's matmul of the same M x N x K, the
floor a copy-free call could reach). One thread (TVM's pool and OpenBLAS's); medians. Each
in-place function is verified against TVM's build of the workload first.

    python bench/in_place.py [--repeat 21] [--out bench/results/in_place.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM and numpy load their pools
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent

# (in channels, output size, out channels, kernel): ResNet-50's distinct stride-1 convolutions
LAYERS = [(64, 56, 64, 1), (64, 56, 64, 3), (64, 56, 256, 1), (256, 56, 64, 1),
          (128, 28, 128, 3), (128, 28, 512, 1), (512, 28, 128, 1),
          (256, 14, 256, 3), (256, 14, 1024, 1), (1024, 14, 256, 1),
          (512, 7, 512, 3), (512, 7, 2048, 1), (2048, 7, 512, 1)]


def _median_ms(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def measure(c: int, hw: int, oc: int, k: int, repeat: int) -> dict:
    import numpy as np
    import tvm

    import tirbyoc
    from tirbyoc.app.run_target import complete_target
    from tirbyoc.offloading.offloader import exact_size
    from tirbyoc.offloading.verification import compile_func, verify
    from tirbyoc.rewrite.functions.in_place import read_in_place
    from tirbyoc.testing.workloads import conv2d

    pad = k // 2
    workload = conv2d(1, c, hw + 2 * pad, hw + 2 * pad, oc, k, k)
    match = next(m for m in tirbyoc.match(workload, ["blas"]) if m.block == "conv")
    match = exact_size(workload, match, 1)  # the tile `offload` would choose for one core
    copied = tirbyoc.tensorize(workload, match).func
    in_place, done = read_in_place(copied)
    check = verify(workload, in_place, {"kind": "llvm"})
    if check.passed is not True:
        raise SystemExit(f"conv {c}x{hw}x{hw}->{oc} k{k}: the in-place function did not verify: {check.describe()}")
    target = complete_target({"kind": "llvm"})  # this CPU's mcpu, as tirbyoc run builds
    exes = [compile_func(f, target, what) for f, what in ((copied, "with copies"), (in_place, "in place"))]
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.random((1, c, hw + 2 * pad, hw + 2 * pad), "float32")),
            tvm.runtime.tensor(rng.random((oc, c, k, k), "float32")),
            tvm.runtime.tensor(np.zeros((1, oc, hw, hw), "float32"))]
    a, b = rng.random((oc, c * k * k), "float32"), rng.random((c * k * k, hw * hw), "float32")
    times = {"with_copies": [], "in_place": [], "gemm_alone": []}
    for _ in range(3):  # interleaved, so that a change of machine speed hits all three
        times["with_copies"].append(_median_ms(lambda: exes[0](*args), repeat))
        times["in_place"].append(_median_ms(lambda: exes[1](*args), repeat))
        times["gemm_alone"].append(_median_ms(lambda: a @ b, repeat))
    ms = {name: statistics.median(v) for name, v in times.items()}
    return {"layer": f"{c}x{hw}x{hw} -> {oc}, {k}x{k}", "ms": ms,
            "speedup": ms["with_copies"] / ms["in_place"], "of_gemm_alone": ms["gemm_alone"] / ms["in_place"],
            "in_place": [d.describe() for d in done], "verified": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=21, help="runs per median")
    parser.add_argument("--out", default=str(HERE / "results" / "in_place.json"))
    args = parser.parse_args()
    rows = []
    for layer in LAYERS:
        rows.append(measure(*layer, args.repeat))
        r = rows[-1]
        print(f"{r['layer']:<26} copies {r['ms']['with_copies']:7.3f} ms  in place {r['ms']['in_place']:7.3f} ms  "
              f"GEMM alone {r['ms']['gemm_alone']:7.3f} ms  x{r['speedup']:.2f}  ({', '.join(r['in_place'])})",
              flush=True)
    total = {k: sum(r["ms"][k] for r in rows) for k in rows[0]["ms"]}
    print(f"{'all':<26} copies {total['with_copies']:7.2f} ms  in place {total['in_place']:7.2f} ms  "
          f"GEMM alone {total['gemm_alone']:7.2f} ms")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown")
    Path(args.out).write_text(json.dumps({"benchmark": "in_place", "cpu": cpu, "threads": 1, "rows": rows,
                                          "total_ms": total}, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
