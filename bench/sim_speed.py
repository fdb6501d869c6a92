"""Simulator speed: an int8 ResNet-18 run end to end in tirbyoc.sim on the vta template (JSON out).

The model (batch 1, 224x224, int8 x int8 -> int32 convolutions and classifier) is legalized,
offloaded to vta, built, and run once with the simulator measuring; the figures are the
wall time of that simulated run, the tile operations it executed (GEMM, reset, ALU, DMA) and
their rate, beside the simulated cycles. Goals: the run in <= 10 s, >= 1e6 tile operations
per second. Offload and build times are reported apart (they are not simulation).

    python bench/sim_speed.py [--model builtin:resnet18_int8] [--out bench/results/sim_speed.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:resnet18_int8")
    parser.add_argument("--template", default="vta")
    parser.add_argument("--out", default=str(HERE / "results" / "sim_speed.json"))
    args = parser.parse_args()

    import tvm

    from tirbyoc import PIPELINE, get_template, legalized_model
    from tirbyoc._tvm import make_target, relax_vm
    from tirbyoc.relax.bridge import offload_module
    from tirbyoc.app.running.run import compare

    template = get_template(args.template)
    t0 = time.perf_counter()
    prepared = legalized_model(args.model, [template])
    spec, mod, entry, arrays = prepared.spec, prepared.mod, prepared.entry, prepared.arrays
    offloaded, report = offload_module(mod, [template], verify=False)
    t_offload = time.perf_counter() - t0
    print(f"[sim_speed] {spec}: offloaded {report.coverage:.1%} of {report.total_macs:,} MACs "
          f"in {t_offload:.1f} s", flush=True)

    target = make_target(dict(template.target))
    t0 = time.perf_counter()
    vm = relax_vm(tvm.compile(offloaded, target=target, tir_pipeline=PIPELINE), tvm.cpu())
    t_build = time.perf_counter() - t0
    args_nd = [tvm.runtime.tensor(a) for a in arrays]
    sim = template.simulator
    sim.configure()
    t0 = time.perf_counter()
    out = vm[entry](*args_nd).numpy()
    t_run = time.perf_counter() - t0
    stats = sim.stats()
    ref = relax_vm(tvm.compile(mod, target=target), tvm.cpu())[entry](*args_nd).numpy()
    c = compare(out, ref)
    verified, err = c.passed, c.abs_err
    result = {
        "benchmark": "sim_speed", "model": spec, "template": args.template,
        "coverage": report.coverage, "macs": report.total_macs, "verified": verified,
        "max_abs_err": err, "offload_s": round(t_offload, 2), "build_s": round(t_build, 2),
        "simulated_run_s": round(t_run, 3), "tile_ops": stats.tile_ops,
        "tile_ops_per_s": stats.tile_ops / t_run if t_run else float("nan"),
        "goal_run_s": 10.0, "goal_tile_ops_per_s": 1e6, "simulation": stats.to_json(),
    }
    print(f"[sim_speed] simulated run {t_run:.2f} s, {stats.tile_ops:,} tile ops "
          f"({result['tile_ops_per_s']:.3g}/s), {stats.cycles:,} simulated cycles "
          f"({stats.seconds * 1e3:.1f} ms at {stats.config.clock_mhz} MHz), verified={verified}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
