"""Reach: how much of a real model's multiply-accumulate work each template takes (JSON out).

For ResNet-50, MobileNetV2 and BERT-base (batch 1, full size, random weights) and each
template, the MAC coverage - MACs of conv / dense / matmul blocks that are rewritten to the
template's intrinsics or library kernels, over all such MACs, each PrimFunc weighted by its
call sites - of:

* **tirbyoc**: `offload_module` on the legalized model (the real rewrite: tiling, padding,
  layout staging, DMA staging; verification off here, it is the tests' job);
* **TVM exact**: TVM's own path for a registered intrinsic, ``tile_with_tensor_intrin``
  (no padding) then ``tensorize``, tried with every compute intrinsic of the template - it
  needs the block's computation to be the description's exactly (same index expressions, same
  operand order, same dtypes), up to loop tiling.

Models are legalized as ``tirbyoc run`` prepares them for the template: float32 for ``blas``;
for an int8 template the built-in's ``_int8`` variant (`tirbyoc.app.model_in.models.quantize`: QDQ,
calibrated) made integer by `QuantizedToInteger` (uint8 x int8 -> int32 cores for ``x86_vnni``
and ``hexagon_hvx``; int8 x int8 for ``vta`` and ``cuda_mma``).

``--qdq`` measures the same three models as a user of an int8 accelerator brings them: built
as float ONNX graphs (`tirbyoc.testing.qdq`: the same architectures, batch norms folded,
He-initialised weights), quantized by ONNX Runtime's ``quantize_static`` (QDQ, per-channel
int8 weights, uint8 activations, 8 calibration inputs; needs ``onnx`` and ``onnxruntime``),
imported by TVM and made integer by `QuantizedToInteger` for each int8 template, as
``tirbyoc run`` does (the chains it made integer and those it kept float are counted).
Usage::

    python bench/reach.py [--models resnet50,mobilenet_v2,bert_base] [--templates T,...]
                          [--qdq] [--out bench/results/reach.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import tirbyoc
from tirbyoc.app.model_in.models import bert_base, mobilenet_v2, resnet50
from tirbyoc.app.model_in.preparation import preparation
from tirbyoc.relax.bridge import call_counts, mac_blocks, offload_module
from tirbyoc.offloading.table import render

HERE = Path(__file__).resolve().parent
MODELS = {"resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "bert_base": bert_base}
TEMPLATES = ("x86_vnni", "blas", "vta", "hexagon_hvx", "cuda_mma")
VARIANT = {"blas": "float32", "x86_vnni": "uint8", "hexagon_hvx": "uint8", "vta": "int8", "cuda_mma": "int8"}


QDQ_BUILDERS = {"resnet50": "float_resnet50", "mobilenet_v2": "float_mobilenet_v2", "bert_base": "float_bert_base"}
INT8_TEMPLATES = ("x86_vnni", "vta", "hexagon_hvx", "cuda_mma")


def qdq_model(model: str, folder: Path) -> Path:
    """The QDQ ONNX file of ``model`` (made once: float graph, then ONNX Runtime's quantizer)."""
    from tirbyoc.testing import qdq

    out = folder / f"{model}_qdq.onnx"
    if not out.exists():
        t0 = time.perf_counter()
        floating = getattr(qdq, QDQ_BUILDERS[model])(folder / f"{model}.onnx")
        qdq.ort_quantize(floating, out)
        print(f"[reach] {model}: float ONNX quantized by ONNX Runtime in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def legalized_qdq(path: Path, template):
    """(the QDQ model made integer for ``template`` and legalized, the QuantizedReport)."""
    from tirbyoc import legalized_model

    prepared = legalized_model(str(path), [template])
    return prepared.mod, prepared.quantized


def legalized(model: str, template):
    """(the built-in legalized as `tirbyoc run` prepares it for ``template``: float for blas,
    its ``_int8`` QDQ variant made integer for an int8 template, the QuantizedReport or None)."""
    from tirbyoc import legalized_model

    name = model if VARIANT.get(template.name, "float32") == "float32" else f"{model}_int8"
    prepared = legalized_model(f"builtin:{name}", [template])
    mod, report = prepared.mod, prepared.quantized
    return mod, (report if report.integer or report.kept else None)


def tvm_exact_covers(func, block: str, intrinsics) -> bool:
    """TVM's tile_with_tensor_intrin (no padding) + tensorize with any of ``intrinsics``."""
    from tvm.s_tir.schedule.transform import tile_with_tensor_intrin

    from tirbyoc._tvm import Schedule

    for intrin in intrinsics:
        intrin.register()
        try:
            sch = Schedule(func)
            blk = sch.get_sblock(block)
            loop = tile_with_tensor_intrin(sch, blk, intrin.name, allow_padding=False)
            if loop is None:
                continue
            if sch.get(blk).init is not None:
                sch.decompose_reduction(blk, sch.get_loops(blk)[0])
            sch.tensorize(loop, intrin.name)
            return True
        except Exception:  # noqa: BLE001 - TVM reports each mismatch with its own error type
            continue
    return False


def tvm_exact_coverage(mod, template) -> tuple[int, int]:
    from tirbyoc._tvm import tirx

    counts = call_counts(mod)
    computes = [g.compute for g in template.groups]
    total = covered = 0
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        calls = counts.get(gv.name_hint, 1)
        for block, macs in mac_blocks(func).items():
            total += macs * calls
            if tvm_exact_covers(func.with_attr("global_symbol", "main"), block, computes):
                covered += macs * calls
    return total, covered


def top_reasons(report, limit: int = 3) -> list[dict]:
    lost: dict[str, int] = {}
    for f in report.functions:
        missing = (f.macs - f.offloaded_macs) * f.calls
        if missing and f.reason:
            key = f.reason.split("; ")[0][:160]
            lost[key] = lost.get(key, 0) + missing
    return [{"reason": r, "macs": m} for r, m in sorted(lost.items(), key=lambda kv: -kv[1])[:limit]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--templates", default=None, help=f"default {','.join(TEMPLATES)} ({','.join(INT8_TEMPLATES)} with --qdq)")
    parser.add_argument("--qdq", action="store_true", help="the models quantized by ONNX Runtime (QDQ ONNX), int8 templates")
    parser.add_argument("--out", default=None, help="default bench/results/reach.json (reach_qdq.json with --qdq)")
    args = parser.parse_args()
    out = Path(args.out or HERE / "results" / ("reach_qdq.json" if args.qdq else "reach.json"))
    templates = args.templates.split(",") if args.templates else (INT8_TEMPLATES if args.qdq else TEMPLATES)
    rows, results = [], []
    cache = {}
    folder = Path(tempfile.mkdtemp(prefix="tirbyoc-reach-"))
    for model in args.models.split(","):
        for name in templates:
            template = tirbyoc.get_template(name)
            variant = VARIANT.get(name, "float32")
            key = (model, preparation([template]))
            if key not in cache:
                t0 = time.perf_counter()
                cache[key] = (legalized_qdq(qdq_model(model, folder), template) if args.qdq
                              else legalized(model, template))
                print(f"[reach] {model} ({'QDQ, ' if args.qdq else ''}{variant}) legalized in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
            mod, quantized = cache[key]
            t0 = time.perf_counter()
            _, report = offload_module(mod, [template], verify=False, whole_calls=False)
            t_offload = time.perf_counter() - t0
            t0 = time.perf_counter()
            total, exact = tvm_exact_coverage(mod, template)
            t_exact = time.perf_counter() - t0
            entry = {
                "model": model, "template": name, "variant": variant, "total_macs": report.total_macs,
                "tirbyoc_macs": report.offloaded_macs, "tirbyoc_coverage": report.coverage,
                "tvm_exact_macs": exact, "tvm_exact_coverage": exact / total if total else 0.0,
                "seconds": {"tirbyoc": round(t_offload, 1), "tvm_exact": round(t_exact, 1)},
                "not_covered": top_reasons(report),
            }
            if quantized is not None:
                made_by = "ONNX Runtime" if args.qdq else "tirbyoc.app.model_in.models.quantize"
                entry["variant"] = f"QDQ ({made_by}), {variant} activations"
                entry["chains_integer"] = len(quantized.integer)
                entry["chains_kept_float"] = [{"chain": c, "why": w} for c, w in quantized.kept]
            assert total == report.total_macs, (total, report.total_macs)
            results.append(entry)
            print(f"[reach] {model} on {name}: tirbyoc {report.coverage:.1%}, TVM exact "
                  f"{entry['tvm_exact_coverage']:.1%} ({t_offload:.0f} s + {t_exact:.0f} s)", flush=True)
            rows.append([model, name, ("QDQ " if quantized else "") + variant, f"{report.total_macs / 1e9:.2f} G",
                         f"{report.coverage:.1%}", f"{entry['tvm_exact_coverage']:.1%}"]
                        + [f"{len(quantized.integer)} / {len(quantized.kept)}" if quantized else "-"])
    print()
    print(render(["model", "template", "operands", "MACs", "tirbyoc", "TVM exact"]
                 + ["chains integer / float"], rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "reach_qdq" if args.qdq else "reach", "results": results}, indent=2))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
