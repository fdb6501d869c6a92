"""MetaSchedule on x86_vnni: tirbyoc's schedule rule vs TVM's MultiLevelTilingWithIntrin.

Same run, same trial budget, same builder and runner, the same VNNI intrinsic for both
(tirbyoc's ``x86_vnni.dot_16x4_u8i8i32``: TVM's ``dot_16x4_vnni`` description, with the
implementation fixed for LLVM 22, on which TVM's own does not build). TVM's space is its
x86 VNNI default: AutoInline, MultiLevelTilingWithIntrin (SSRSRS), plain MultiLevelTiling
for what the intrinsic rule leaves, ParallelizeVectorizeUnroll, RandomComputeLocation, with
the default LLVM post-processors plus RewriteTensorize, tuned with ``tune_tir``. tirbyoc's is
``tirbyoc.tuning.tune`` (`TirbyocRule` alone; its default rewrite is the first candidate).

Per workload and space: how many measured candidates were valid, how many valid ones call
the intrinsic (a ``Tensorize`` step with it in their trace) and whether the best does; the
best record rebuilt here and checked against TVM's default build - where it is wrong, the
fastest correct record, which the speedup compares. The builds (both spaces' bests, tirbyoc's
untuned rewrite, TVM's default build) are then timed side by side in this process, in
interleaved rounds. MetaSchedule stops early when a space has no new candidates left
(tirbyoc's register-block space is small), so a space may measure fewer than the budget.

    python bench/tune.py [--trials 32] [--out bench/results/tune.json]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import tirbyoc  # noqa: E402
from tirbyoc import legalized_model  # noqa: E402
from tirbyoc.offloading.table import render  # noqa: E402
from tirbyoc.tuning import local_builder, tune, tuning_target  # noqa: E402
from tirbyoc.tuning.tuner import FAILED, without_tvm_intrinsic_library  # noqa: E402
from tirbyoc.testing.workloads import matmul  # noqa: E402

INTRIN = "x86_vnni.dot_16x4_u8i8i32"
U8 = ("uint8", "int8", "int32")


def resnet50_conv():
    """The 3x3, 64 -> 64 channel conv at 56x56 of ResNet-50's first stage, as LegalizeOps
    writes it for the int8 model (pad block + conv block, NCHW, uint8 x int8 -> int32)."""
    tmpl = tirbyoc.get_template("x86_vnni")
    mod = legalized_model("builtin:resnet50_int8", [tmpl]).mod
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or "conv2d" not in gv.name_hint:
            continue
        shapes = [tuple(int(s) for s in p.shape) for p in func.params]
        if shapes[:2] == [(1, 64, 56, 56), (64, 64, 3, 3)]:
            return func
    raise RuntimeError("ResNet-50's 3x3 64->64 conv not found in the legalized model")


def workloads():
    return [
        ("int8 dense 512x512x512, W[N,K]", matmul(512, 512, 512, *U8, trans_b=True), 512 ** 3),
        ("int8 dense 100x200x300 (odd), W[N,K]", matmul(100, 200, 300, *U8, trans_b=True), 100 * 200 * 300),
        ("int8 matmul 256^3, W[K,N]", matmul(256, 256, 256, *U8), 256 ** 3),
        ("ResNet-50 conv 3x3 64->64 @56x56", resnet50_conv(), 64 * 64 * 9 * 56 * 56),
    ]


def tvm_space():
    R = ms.schedule_rule
    rules = [
        R.AutoInline(into_producer=False, into_consumer=True, inline_const_tensor=True,
                     disallow_if_then_else=True, require_injective=True, require_ordered=True,
                     disallow_op=["tirx.exp"]),
        R.AddRFactor(max_jobs_per_core=16, max_innermost_factor=64),
        R.MultiLevelTilingWithIntrin(INTRIN, structure="SSRSRS", tile_binds=None, max_innermost_factor=64,
                                     vector_load_lens=None, reuse_read=None,
                                     reuse_write=R.ReuseType(req="may", levels=[1, 2], scope="global")),
        R.MultiLevelTiling(structure="SSRSRS", tile_binds=None, max_innermost_factor=64,
                           vector_load_lens=None, reuse_read=None,
                           reuse_write=R.ReuseType(req="may", levels=[1, 2], scope="global")),
        R.ParallelizeVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=64,
                                     unroll_max_steps=[0, 16, 64, 512], unroll_explicit=True),
        R.RandomComputeLocation(),
    ]
    postprocs = list(ms.postproc.Postproc.create("llvm")) + [ms.postproc.RewriteTensorize(vectorize_init_loop=True)]
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs,
                                             mutator_probs=dict(ms.mutator.Mutator.create("llvm")))


class Counter:
    def __init__(self):
        self.trials = self.valid = 0


def tune_with_tirbyoc(func, trials: int, work: str):
    """`tirbyoc.tuning.tune`, as ``tirbyoc tune`` runs it: TirbyocRule's space, the default
    rewrite measured first, MetaSchedule's evolutionary search for the rest of the budget."""
    return tune(func, "x86_vnni", trials=trials, work_dir=work, seed=1).database


def tune_with_tvm(func, trials: int, work: str):
    """MetaSchedule's ``tune_tir`` in TVM's VNNI space (`tvm_space`)."""
    return ms.tune_tir(tvm.IRModule({"main": func}), tuning_target("x86_vnni"), work,
                       max_trials_global=trials, num_trials_per_iter=min(16, trials), space=tvm_space(),
                       builder=local_builder(), runner=ms.runner.LocalRunner(), cost_model="random", seed=1)


def tune_one(func, tuner, trials: int, reference):
    """Tune ``func`` with ``tuner`` (``reference``: TVM's default build's output, which the
    best records are checked against): trials, valid candidates, how many call the intrinsic,
    whether the best does, time spent; and the best record and the best correct record
    built (``libs``), to be timed side by side with the baselines."""
    target = tuning_target("x86_vnni")
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="tirbyoc-bench-tune-") as work, without_tvm_intrinsic_library():
        try:
            db = tuner(func, trials, work)
        except Exception as err:  # noqa: BLE001 - a space that yields nothing is a result too
            return {"error": str(err).strip().splitlines()[-1][:200], "seconds": time.time() - start}, {}
        records = list(db.get_all_tuning_records())
    spent = time.time() - start

    def mean(r):
        return sum(float(x) for x in r.run_secs) / len(r.run_secs)

    ranked = sorted((r for r in records if r.run_secs and min(float(x) for x in r.run_secs) < FAILED), key=mean)
    tensorized = [any(str(i.kind.name) == "Tensorize" and str(i.attrs[0]) == INTRIN for i in r.trace.insts)
                  for r in ranked]
    result = {"trials": len(records), "valid": len(ranked), "valid_tensorized": sum(tensorized),
              "tensorized": bool(ranked and tensorized[0]), "seconds": spent,
              "best_s": mean(ranked[0]) if ranked else None}
    libs, wrong = {}, 0
    for rank, rec in enumerate(ranked):
        lib, ok = build_record(rec, func, target, reference)
        if rank == 0:
            libs["best"], result["verified"] = lib, ok
        if ok:
            # a wrong answer is not a schedule: what a space offers is its best correct record
            if rank:
                libs["correct"] = lib
            result["wrong_faster"] = wrong
            break
        wrong += 1
    return result, libs


def _compile(func, target):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target).mod


def _run(lib, func):
    """Run ``lib`` once on the bench's fixed random inputs; the argument tensors."""
    from tirbyoc.ir.domains import random_array

    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(random_array(tuple(int(x) for x in p.shape), str(p.dtype), rng))
            for p in func.params[:-1]]
    out = func.params[-1]
    args.append(tvm.runtime.tensor(np.zeros(tuple(int(x) for x in out.shape), str(out.dtype))))
    lib["main"](*args)
    return args


def build_record(record, func, target, reference):
    """The record rebuilt here, and whether its output equals ``reference``."""
    from tvm.s_tir import Schedule

    from tirbyoc.offloading.verification import compare_arrays

    sch = Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    lib = _compile(sch.mod["main"], target)
    new = _run(lib, func)[-1].numpy()
    return lib, compare_arrays(reference, new, str(func.params[-1].dtype)).passed is True


def time_side_by_side(libs: dict, func, rounds: int = 5) -> dict:
    """Seconds per call of each library: the min over ``rounds`` interleaved rounds of
    20 runs x 5, taken in turns so that a noisy moment on this 2-core machine hits all."""
    args = {name: _run(lib, func) for name, lib in libs.items()}
    best = {name: float("inf") for name in libs}
    for _ in range(rounds):
        for name, lib in libs.items():
            timer = lib.time_evaluator("main", tvm.cpu(), number=20, repeat=5)
            best[name] = min(best[name], float(min(timer(*args[name]).results)))
    return best


def _us(secs, macs) -> str:
    return "-" if secs is None else f"{secs * 1e6:,.0f} us ({2 * macs / secs / 1e9:,.0f} GOPS)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32, help="trials per workload and space")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tune.json"))
    args = parser.parse_args()
    tmpl = tirbyoc.get_template("x86_vnni")
    tmpl.register()
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = tuning_target("x86_vnni")
    rows, out = [], []
    for name, func, macs in workloads():
        entry = {"workload": name, "macs": macs}
        libs = {"tvm default": _compile(func, target)}
        reference = _run(libs["tvm default"], func)[-1].numpy()
        for label, tuner in (("tirbyoc", tune_with_tirbyoc), ("tvm", tune_with_tvm)):
            print(f"[tune] {name}: {label} space, {args.trials} trials", flush=True)
            entry[label], built = tune_one(func, tuner, args.trials, reference)
            libs.update({f"{label} {k}": lib for k, lib in built.items()})
        libs["untuned"] = _compile(tirbyoc.offload(func, tmpl).func, target)  # no search
        print(f"[time] {name}: {len(libs)} builds side by side", flush=True)
        times = time_side_by_side(libs, func)
        entry["tvm_default_s"], entry["tirbyoc_untuned_s"] = times["tvm default"], times["untuned"]
        for label in ("tirbyoc", "tvm"):
            entry[label]["best_remeasured_s"] = times.get(f"{label} best")
            entry[label]["best_correct_s"] = times.get(f"{label} correct") or (
                times.get(f"{label} best") if entry[label].get("verified") else None)
        out.append(entry)
        cells = [name, _us(entry["tvm_default_s"], macs), _us(entry["tirbyoc_untuned_s"], macs)]
        for label in ("tirbyoc", "tvm"):
            r = entry[label]
            if "error" in r:
                cells += ["error: " + r["error"][:40], "-", "-"]
                continue
            best, correct = r["best_remeasured_s"], r["best_correct_s"]
            cell = _us(best, macs)
            if best is not None and not r.get("verified"):
                cell += " WRONG; best correct " + ("none" if correct is None else
                                                    f"{_us(correct, macs)} ({r['wrong_faster']} faster wrong)")
            cells += [cell, f"{r['valid']}/{r['trials']}",
                      f"{r['valid_tensorized']}/{r['valid']}" + (", best" if r["tensorized"] else "")]
        a, b = entry["tirbyoc"].get("best_correct_s"), entry["tvm"].get("best_correct_s")
        cells.append(f"{b / a:.2f}x" if a and b else "TVM: none correct" if a and entry["tvm"].get("valid") else "-")
        rows.append(cells)
    print()
    print(render(["workload", "TVM default", "tirbyoc untuned", "tirbyoc tuned", "valid", "use VNNI",
                  "TVM MLTWithIntrin tuned", "valid", "use VNNI", "tirbyoc speedup"], rows))
    summary = {lbl: sum(1 for e in out if e[lbl].get("tensorized")) for lbl in ("tirbyoc", "tvm")}
    print(f"\nworkloads whose best candidate calls VNNI: tirbyoc {summary['tirbyoc']}/{len(out)}, "
          f"TVM {summary['tvm']}/{len(out)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"trials": args.trials, "target": "x86_vnni (llvm, cascadelake, 2 cores)",
                                          "tensorized": summary, "workloads": out}, indent=2))
    print(f"JSON in {args.out}")


if __name__ == "__main__":
    main()
