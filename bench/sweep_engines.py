"""Sweep throughput: points per minute of one grid of template variants run by each engine.

Each engine runs in a process of its own (`tirbyoc sweep ... --json`, timed from outside): the
local worker processes (``--jobs N``, one process per point) and a local Dask cluster of N
workers (``--engine dask --jobs N``, workers kept across points). Both must give the same rows
(every field but the wall time); the figures are points per minute and the speed-up over a
serial sweep, on this machine's CPU with N workers sharing its cores.

    python bench/sweep_engines.py [--model builtin:cnn_int8] [--param BLOCK_OUT=8,16 ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PARAMS = ["BLOCK_OUT=8,16", "ACC_KIB=64,128", "DMA_BYTES_PER_CYCLE=4,16"]


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def _run(model: str, template: str, params: list[str], extra: list[str]) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "tirbyoc", "sweep", "-q", "--json", "-t", template, "-m", model]
    for p in params:
        cmd += ["-p", p]
    t0 = time.perf_counter()
    done = subprocess.run(cmd + extra, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd + extra)} failed:\n{done.stderr[-2000:]}")
    rows = [{k: v for k, v in p.items() if k != "seconds"} for p in json.loads(done.stdout)["points"]]
    return seconds, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:cnn_int8")
    parser.add_argument("--template", default="vta")
    parser.add_argument("--param", action="append", help=f"as tirbyoc sweep takes it (default {DEFAULT_PARAMS})")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "results" / "sweep_engines.json"))
    args = parser.parse_args()
    params = args.param or DEFAULT_PARAMS
    runs = {}
    for name, extra in (("serial", []), (f"local --jobs {args.jobs}", ["--jobs", str(args.jobs)]),
                        (f"dask --jobs {args.jobs}", ["--engine", "dask", "--jobs", str(args.jobs)])):
        seconds, rows = _run(args.model, args.template, params, extra)
        runs[name] = {"seconds": round(seconds, 1), "points": len(rows),
                      "points_per_minute": round(60 * len(rows) / seconds, 2), "rows": rows}
        print(f"[sweep_engines] {name}: {len(rows)} points in {seconds:.0f} s "
              f"({runs[name]['points_per_minute']:.2f} per minute)", flush=True)
    serial = runs["serial"]
    for run in runs.values():
        run["same_rows_as_serial"] = run["rows"] == serial["rows"]
        run["speedup_over_serial"] = round(serial["seconds"] / run["seconds"], 2)
    result = {"benchmark": "sweep_engines", "model": args.model, "template": args.template, "params": params,
              "cpu": _cpu(), "cores": os.cpu_count(), "jobs": args.jobs,
              "runs": {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in runs.items()}}
    for name, run in result["runs"].items():
        print(f"[sweep_engines] {name}: x{run['speedup_over_serial']} over serial, "
              f"same rows: {run['same_rows_as_serial']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
