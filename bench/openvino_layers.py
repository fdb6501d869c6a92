"""OpenVINO's own time per layer of an ONNX model (its ``PERF_COUNT`` counters), beside which
tirbyoc's per-function profile (`bench/models.py`'s ``profile``) shows where a gap is.

OpenVINO times each executed node inside its own runs (hot caches as a model run leaves
them, not a layer alone); the kernel it chose is named (``brgconv_avx512_amx_I8``: oneDNN's
AMX convolution; ``jit_avx512_I8``: a vector one). Layers are listed slowest first, with the
node's type and kernel, averaged over ``--runs`` inferences after ``--warmup``.

    python bench/openvino_layers.py /tmp/bcache/resnet50_qdq.onnx --threads 1 [--out F.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np


def layer_times(path: str, threads: int, runs: int, warmup: int) -> dict:
    """{"wall_ms", "layers": [{"node", "type", "kernel", "ms"}] slowest first} for one model."""
    import openvino as ov  # deferred: optional, a peer's engine

    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        "PERF_COUNT": "YES", "INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    shape = [d if d > 0 else 1 for d in compiled.input(0).shape]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    for _ in range(warmup):
        request.infer({0: x})
    total, kinds = collections.defaultdict(float), {}
    start = time.perf_counter()
    for _ in range(runs):
        request.infer({0: x})
        for info in request.get_profiling_info():
            total[info.node_name] += info.real_time.total_seconds() * 1e3 / runs
            kinds[info.node_name] = (info.node_type, info.exec_type)
    wall = (time.perf_counter() - start) / runs * 1e3
    layers = [{"node": name, "type": kinds[name][0], "kernel": kinds[name][1], "ms": ms}
              for name, ms in sorted(total.items(), key=lambda kv: -kv[1]) if ms > 0]
    return {"wall_ms": wall, "layers_ms": sum(total.values()), "layers": layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an ONNX file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--top", type=int, default=40, help="layers printed (all are written)")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args()
    found = layer_times(args.model, args.threads, args.runs, args.warmup)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"{args.model}: {found['wall_ms']:.2f} ms a run, layers {found['layers_ms']:.2f} ms "
          f"({cpu}, {args.threads} thread(s))")
    print(f"{'ms':>7}  {'type':14s} {'kernel':28s} node")
    for layer in found["layers"][:args.top]:
        print(f"{layer['ms']:7.3f}  {layer['type']:14s} {layer['kernel']:28s} {layer['node']}")
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "openvino_layers", "cpu": cpu, "threads": args.threads,
                                        "model": Path(args.model).name, **found}, indent=1))
        print("written to", args.out)


if __name__ == "__main__":
    main()
