"""A 4-parameter vta design space on int8 ResNet-18: the whole grid, serially and on a local
Dask cluster (a worker killed mid-run), against searches that see a third of it.

1. The grid, serially (one process, every point verified against TVM's build).
2. The same grid on a local Dask cluster of ``--jobs`` workers, one worker killed (SIGKILL)
   after the tenth point: every row must equal the serial one, none lost or doubled.
3. TPE (cycles alone) and NSGA-II (cycles and scratchpad KiB) on the cluster, each with a
   third of the grid's trials: TPE's best against the grid's best cycles, NSGA-II's front
   against the grid's true front.

Points that differ only in timing parameters (DMA bandwidth and latency) share one build per
worker (`Template.timing_params`). JSON in bench/results/vta_search.json, the front plotted in
docs/img/vta_resnet18_pareto.png.

    python bench/design_space_search.py [--jobs 2] [--model builtin:resnet18_int8]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPACE = ["BLOCK_OUT=8,16,32", "ACC_KIB=32..256:x2", "DMA_BYTES_PER_CYCLE=2..32:x2", "DMA_LATENCY=16..128:x2"]


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def _say(done, total, label):
    print(f"[design_space_search] {done}/{total} {label}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:resnet18_int8")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", default="/tmp/tirbyoc_design_space")
    parser.add_argument("--out", default=str(HERE / "results" / "vta_search.json"))
    parser.add_argument("--plot", default=str(HERE.parent / "docs" / "img" / "vta_resnet18_pareto.png"))
    args = parser.parse_args()

    from tirbyoc.app.sweeping.objectives import objective
    from tirbyoc.app.sweeping.search_space import SearchSpace, point_key
    from tirbyoc import search_model
    from tirbyoc.app.sweeping.sweep_report import plot_front
    from tirbyoc.testing.workers import kill_a_worker_after

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*.jsonl"):
        old.unlink()
    space = SearchSpace.parse(SPACE)
    third = space.size // 3
    runs = {}

    def timed(name, **kw):
        t0 = time.perf_counter()
        r = search_model(args.model, "vta", space, results=str(work / f"{name}.jsonl"), **kw)
        runs[name] = {"seconds": round(time.perf_counter() - t0, 1), "trials": r.trials}
        runs[name]["points_per_minute"] = round(60 * r.trials / runs[name]["seconds"], 2)
        print(f"[design_space_search] {name}: {r.trials} points in {runs[name]['seconds']:.0f} s", flush=True)
        return r

    serial = timed("grid_serial", progress=_say)
    killed: list = []
    cluster = timed("grid_dask", engine="dask", jobs=args.jobs, progress=kill_a_worker_after(10, killed, then=_say))
    rows = {point_key(p.params): p.row() for p in serial.points}
    same = [p.row() for p in cluster.points] == [p.row() for p in serial.points]
    cycles = objective("cycles")
    best_grid = serial.best()
    tpe = timed("tpe", strategy="tpe", trials=third, engine="dask", jobs=args.jobs, progress=_say)
    best_tpe = tpe.best()
    both = ("cycles", "scratchpad_kib")
    nsga = timed("nsga2", strategy="nsga2", trials=third, objectives=both, engine="dask", jobs=args.jobs,
                 progress=_say)
    grid_front = search_model(args.model, "vta", space, objectives=both, results=str(work / "grid_serial.jsonl"))
    true_front = {point_key(p.params) for p in grid_front.front()}
    found = {point_key(p.params) for p in nsga.front()}
    result = {
        "benchmark": "design_space_search", "model": args.model, "template": "vta", "space": space.params,
        "grid_points": space.size, "cpu": _cpu(), "cores": os.cpu_count(), "jobs": args.jobs, "runs": runs,
        "dask_rows_equal_serial": same, "worker_killed": bool(killed),
        "search_rows_equal_grid": all(rows.get(point_key(p.params)) == p.row() for r in (tpe, nsga) for p in r.points),
        "grid_best": {"params": best_grid.params, "cycles": best_grid.cycles},
        "tpe_best": {"params": best_tpe.params, "cycles": best_tpe.cycles, "trials": tpe.trials,
                     "within": round(cycles.value(best_tpe) / cycles.value(best_grid) - 1, 4)},
        "true_front": [p.to_json() for p in grid_front.front()],
        "nsga2_front_points_on_true_front": len(found & true_front), "true_front_size": len(true_front),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    plot_front(grid_front, args.plot, title=f"{args.model} on vta: {space.size} variants")
    print(json.dumps({k: v for k, v in result.items() if k != "true_front"}, indent=2))
    print(f"written to {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
