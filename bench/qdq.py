"""Quantized models as users bring them: ONNX Runtime's quantizer on float ONNX models, run
through `tirbyoc run --reference onnxruntime` on every int8 template that runs here (JSON out).

Models (float, random He-initialised weights, made with `tirbyoc.testing.qdq`, then
``quantize_static`` in QDQ format: per-channel int8 weights, uint8 activations, 8 calibration
inputs): a ResNet-18-shaped CNN at 224x224 and one transformer encoder layer (seq 128, d 256).
Per model and template: the chains made integer, MAC coverage, the offload's verification
(against TVM's build of the integer model), the integer model against the float QDQ graph and
against ONNX Runtime (fast session and the graph as written), in output quantization steps, and
three latencies: tirbyoc's offloaded build, TVM's default build of the QDQ model, ONNX Runtime
(each timed the same way in this process, ONNX Runtime's spinning off). A simulated template's
latency is the host running its simulator, not the accelerator: its cycles are reported too.
An emulated template's offloaded PrimFuncs run under QEMU (hexagon_hvx): no latency, the
calls it emulated are reported instead.

Also, for every int8 template (those that cannot run here included), the reach: the share of
conv / matmul MACs the offload takes once the chains are integer (`offload_module` without
verification, as bench/reach.py measures it).

    python bench/qdq.py [--templates vta,x86_vnni,hexagon_hvx] [--out bench/results/qdq.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import tirbyoc
from tirbyoc import legalized_model, run_model
from tirbyoc.relax.bridge import offload_module
from tirbyoc.offloading.table import render
from tirbyoc.testing.qdq import float_resnet18, float_transformer, ort_quantize

HERE = Path(__file__).resolve().parent
MODELS = {"resnet18_qdq": lambda p: float_resnet18(p),
          "encoder_qdq": lambda p: float_transformer(p, seq=128, dim=256, hidden=1024)}


def measure(path: Path, template: str, repeat: int) -> dict:
    r = run_model(str(path), [template], repeat=repeat, reference="onnxruntime")
    q, ref = r.quantized, r.reference
    row = {"template": template, "integer_chains": len(q.integer) if q else 0,
           "kept_float": [k for k in q.kept] if q else [], "coverage": r.report.coverage,
           "verified": r.verified, "steps_vs_float_qdq": round(q.float_max_abs_diff / q.step) if q and q.step else None,
           "latency_ms": {"tirbyoc": r.latency_ms.get("offloaded"), "tvm_default": r.latency_ms.get("baseline"),
                          "onnxruntime": ref.latency_ms if ref else None},
           "onnxruntime": ref.to_json() if ref else None}
    for name, st in r.simulation.items():
        row["simulated"] = {"template": name, "cycles": st.cycles, "utilization": st.utilization}
    if r.emulated is not None:
        row["emulated"] = r.emulated.to_json()
    return row


def _ms(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


REACH_TEMPLATES = ("x86_vnni", "vta", "hexagon_hvx", "cuda_mma")


def reach(path: Path) -> dict:
    """template -> (integer chains, MAC coverage) of the QDQ model, without running it."""
    out = {}
    for name in REACH_TEMPLATES:
        template = tirbyoc.get_template(name)
        prepared = legalized_model(str(path), [template])
        mod, report = prepared.mod, prepared.quantized
        _, offload = offload_module(mod, [template], verify=False)
        out[name] = {"integer_chains": len(report.integer), "kept_float": len(report.kept),
                     "coverage": offload.coverage}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--templates", default="vta,x86_vnni,hexagon_hvx")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "qdq.json"))
    args = parser.parse_args()
    templates = [t for t in args.templates.split(",") if tirbyoc.get_template(t).runs_here()]
    skipped = {t: tirbyoc.get_template(t).unavailable_reason() for t in args.templates.split(",")
               if t not in templates}
    results, rows, reaches = [], [], {}
    with tempfile.TemporaryDirectory() as work:
        for name, make in MODELS.items():
            qdq = ort_quantize(make(Path(work) / f"{name}.onnx"), Path(work) / f"{name}_qdq.onnx")
            reaches[name] = reach(qdq)
            for t in templates:
                t0 = time.perf_counter()
                row = {"model": name, **measure(qdq, t, args.repeat), "seconds": time.perf_counter() - t0}
                results.append(row)
                lat = row["latency_ms"]
                rows.append((name, t, f"{row['integer_chains']}", f"{row['coverage']:.1%}", str(row["verified"]),
                             str(row["steps_vs_float_qdq"]),
                             f"{row['onnxruntime']['max_abs_err'] / row['onnxruntime']['step']:.0f}"
                             if row["onnxruntime"]["step"] else "-",
                             _ms(lat["tirbyoc"]), _ms(lat["tvm_default"]), _ms(lat["onnxruntime"], 2)))
    print(render(("model", "template", "int chains", "coverage", "verified", "steps vs QDQ",
                  "steps vs ORT", "tirbyoc ms", "TVM ms", "ORT ms"), rows))
    print("\nreach (MAC coverage once the chains are integer; not run):")
    print(render(("model", *REACH_TEMPLATES),
                 [(m, *(f"{r[t]['coverage']:.1%}" for t in REACH_TEMPLATES)) for m, r in reaches.items()]))
    Path(args.out).write_text(json.dumps({"benchmark": "qdq", "skipped": skipped, "results": results,
                                          "reach": reaches}, indent=1, default=str) + "\n")
    print(f"\nwritten to {args.out}" + (f"; not run here: {skipped}" if skipped else ""))


if __name__ == "__main__":
    main()
