"""Winograd's form against the direct sum, layer by layer, on this CPU.

Each distinct 3x3 convolution of stride 1 of a float model (ResNet-18 / ResNet-50 from
`tirbyoc.testing.qdq`, as bench/models.py builds them), offloaded three times to the fastest
fp32 template this CPU runs - the direct sum (Winograd off), F(2x2, 3x3), and the template's
declared form (``Template.winograd``: m = 4 where `tile_for` takes it) - weights packed once as
a deployed model has them, each function built and timed alone, the forms in turns
(``--rounds``) in one process, one thread pool. Every offload is
verified against TVM's build of the untouched function. GFLOP/s count the direct sum's
multiply-adds (9 x C per output), so Winograd's figure is an effective rate and can pass the
fused multiply-add's peak.

    python bench/winograd.py [--models resnet50,resnet18] [--threads 1] [--rounds 3]
                             [--cache DIR] [--out bench/results/winograd.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", default=None, help="folder for the ONNX files (default: a temporary one)")
    parser.add_argument("--out", default=str(HERE / "results" / "winograd.json"))
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM is imported
    sys.path.insert(0, str(HERE))
    import models  # deferred: imports TVM's helpers after the thread count is set

    folder = Path(args.cache or tempfile.mkdtemp(prefix="tirbyoc_winograd_"))
    folder.mkdir(parents=True, exist_ok=True)
    template = models.template_for("fp32", argparse.Namespace(fp32_template=None, int8_template=None, bf16_template=None)).split(",")[0]
    rows = []
    for name in args.models.split(","):
        rows += layers(models.model_file(name, "fp32", folder), name, template, args.rounds)
    result = {"benchmark": "winograd", "cpu": models._cpu(), "threads": args.threads, "template": template,
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"\nwritten to {args.out}")


def layers(path: Path, model: str, template: str, rounds: int) -> list[dict]:
    """One row per distinct 3x3 stride-1 convolution function of the model at ``path``."""
    from dataclasses import replace

    import tirbyoc
    from tirbyoc import RunOptions, legalized_model
    from tirbyoc._tvm import iter_blocks, make_target, root_block
    from tirbyoc.app.run_target import complete_target
    from tirbyoc.app.running.profiling import time_function
    from tirbyoc.relax.bridge import offload_module
    from tirbyoc.relax.prepack import pack_constant_weights
    from tirbyoc.relax.rest import schedule_rest_of
    from tirbyoc.rewrite.cpu.winograd import tile_for

    target = make_target(complete_target({"kind": "llvm"}))
    prepared = legalized_model(str(path), [template], RunOptions(), constant_weights=True)
    convs = {gv.name_hint: c for gv, f in prepared.mod.functions.items() if hasattr(f, "body")
             for c in [_first_conv(f)] if c is not None}
    declared = tirbyoc.get_template(template)
    forms = {}
    for label, tmpl in (("direct", replace(declared, winograd=0)), ("winograd_m2", replace(declared, winograd=2)),
                        ("winograd", declared)):
        off, report = offload_module(prepared.mod, [tmpl], verify=True)
        packed = schedule_rest_of(pack_constant_weights(off)[0], target)[0]
        verified = {r.name: r.verified for r in report.functions}
        forms[label] = ({n: packed[n].with_attr("global_symbol", n) for n in convs}, verified)
    rows = []
    for name, conv in convs.items():
        samples = {label: [] for label in forms}
        for _ in range(rounds):
            for label, (funcs, _) in forms.items():
                samples[label].append(time_function(funcs[name], target, 20))
        direct, m2, wino = (statistics.median(samples[k]) for k in ("direct", "winograd_m2", "winograd"))
        flop = 2 * conv.macs()
        rows.append({"model": model, "function": name, "shape": list(conv.shape), "direct_ms": direct,
                     "winograd_m2_ms": m2, "winograd_ms": wino, "tile": tile_for(conv, declared.winograd),
                     "speedup": direct / wino, "samples_ms": samples,
                     "direct_gflops": flop / direct / 1e6, "winograd_effective_gflops": flop / wino / 1e6,
                     "winograd_applied": any(str(b.name_hint) == f"{conv.block}_input"
                                             for b in iter_blocks(root_block(forms["winograd"][0][name]).body)),
                     "verified": all(bool(v.get(name)) for _, v in forms.values())})
        print(f"  .. {model} {name}: direct {direct:.3f} ms, m = 2 {m2:.3f} ms, declared {wino:.3f} ms",
              file=sys.stderr, flush=True)
    return rows


def _first_conv(func):
    """The first block of ``func`` that is a 3x3 stride-1 float convolution, or None."""
    from tirbyoc._tvm import iter_blocks, root_block  # deferred: after the thread count is set
    from tirbyoc.rewrite.cpu.winograd import Conv3x3, conv3x3

    root = root_block(func)
    convs = (conv3x3(b) for b in (iter_blocks(root.body) if root is not None else ()) if b.init is not None)
    return next((c for c in convs if isinstance(c, Conv3x3)), None)


def table(result: dict) -> str:
    from tirbyoc.offloading.table import render

    rows = [(r["model"], r["function"][:36], "x".join(map(str, r["shape"][1:3])) + f" {r['shape'][4]}->{r['shape'][3]}",
             f"{r['direct_ms']:.3f}", f"{r['winograd_m2_ms']:.3f}", f"{r['winograd_ms']:.3f} (m = {r['tile']})",
             f"{r['speedup']:.2f}x",
             f"{r['direct_gflops']:.0f}", f"{r['winograd_effective_gflops']:.0f}",
             "yes" if r["winograd_applied"] else "no (direct)", "yes" if r["verified"] else "NO")
            for r in result["rows"]]
    head = (f"{result['cpu']}, {result['threads']} thread(s), {result['template']}: each function alone, "
            "both forms in turns; GFLOP/s of the direct sum's multiply-adds")
    return head + "\n" + render(["model", "function", "output, channels", "direct ms", "m = 2 ms", "declared ms",
                                 "speedup",
                                 "direct GFLOP/s", "winograd GFLOP/s (effective)", "winograd", "verified"], rows)


if __name__ == "__main__":
    main()
