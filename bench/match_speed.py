"""How long matching takes on full-size models: ResNet-50 and BERT-base, legalized, every
PrimFunc against every shipped intrinsic. Goal: <= 1 s in total on a 2-core machine.

Prints JSON (and writes it with --out): time to build and legalize (not counted), the
one-time cost of reading the intrinsics' descriptions, the matching time itself, and the
numbers of PrimFuncs, blocks, (block, intrinsic) pairs and matches.
"""

import argparse
import json
import time

import tirbyoc
from tirbyoc.app.model_in.loaders import legalize
from tirbyoc.matching.matcher import explain, intrinsic_pattern
from tirbyoc import build_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    templates = tirbyoc.templates()
    intrinsics = [i for t in templates for i in t.intrinsics()]

    t0 = time.perf_counter()
    mods = {name: legalize(build_model(name)) for name in ("resnet50", "bert_base")}
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for intrin in intrinsics:
        intrinsic_pattern(intrin)
    prepare_s = time.perf_counter() - t0

    report = {"templates": [t.name for t in templates], "intrinsics": len(intrinsics),
              "build_and_legalize_s": round(build_s, 3), "read_intrinsics_s": round(prepare_s, 3),
              "models": {}}
    total = 0.0
    for name, mod in mods.items():
        t0 = time.perf_counter()
        results = explain(mod, templates)
        elapsed = time.perf_counter() - t0
        total += elapsed
        funcs = {r.function for r in results}
        report["models"][name] = {
            "primfuncs": len(funcs), "blocks": len(results), "pairs": len(results) * len(intrinsics),
            "blocks_matched": sum(1 for r in results if r.matches),
            "matches": sum(len(r.matches) for r in results), "match_s": round(elapsed, 3),
        }
    report["match_total_s"] = round(total, 3)
    report["goal_s"] = 1.0
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
