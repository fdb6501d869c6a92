"""The pad of a channel-wise reduction (a pooling window, a depthwise convolution) read through
bounds checks inside the reduction (after) or copied into a padded workspace first (before).

Each function alone (ResNet's stem max pool, MobileNetV2's depthwise layers, NHWC, as the rest
schedule builds them) and whole built-in models, both forms built in one process and timed in
turns (median of 7 or 9 measurements); outputs compared bit for bit. Prints a table, writes JSON.

    TVM_NUM_THREADS=2 python bench/pad_inlining.py [--threads 1,2] [--out bench/results/pad_inlining.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
FUNCS = [("max_pool", "int8", 112, 64, 2), ("max_pool", "float32", 112, 64, 2),
         ("depthwise", "float32", 112, 32, 1), ("depthwise", "float32", 56, 144, 1), ("depthwise", "float32", 28, 192, 1),
         ("depthwise", "float32", 7, 960, 1), ("depthwise", "int8", 112, 32, 1), ("depthwise", "int8", 28, 192, 1),
         ("depthwise", "int8", 56, 144, 2)]
MODELS = [("builtin:mobilenet_v2_int8", "x86_avx2"), ("builtin:resnet18_int8", "x86_avx2"),
          ("builtin:mobilenet_v2", "x86_fp32_avx2")]


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def with_pad(inlined: bool):
    """A context in which the rest schedule inlines pads into channel reductions or not."""
    import contextlib

    import tirbyoc.rewrite.rest_schedule.channel_reduction as cr

    @contextlib.contextmanager
    def ctx():
        original = cr._copy_or_pad
        if not inlined:
            cr._copy_or_pad = lambda stmt: original(stmt) and hasattr(getattr(stmt.body, "value", None), "source")
        try:
            yield
        finally:
            cr._copy_or_pad = original
    return ctx()


def function(kind, dtype, hw, c, stride):
    from tvm import relax
    acc = "int32" if dtype == "int8" else dtype
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, hw, hw, c), dtype))
    w = relax.Var("w", relax.TensorType((3, 3, 1, c), dtype))
    params = [x] if kind == "max_pool" else [x, w]
    with bb.function("main", params):
        y = (relax.op.nn.max_pool2d(x, (3, 3), (stride, stride), (1, 1), layout="NHWC") if kind == "max_pool" else
             relax.op.nn.conv2d(x, w, strides=stride, padding=1, groups=c, data_layout="NHWC", kernel_layout="HWIO",
                                out_dtype=acc))
        bb.emit_func_output(bb.emit(y))
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for g, f in mod.functions.items() if g.name_hint != "main")


def functions_alone() -> list:
    import numpy as np

    from tirbyoc._tvm import vector_bytes
    from tirbyoc.app.running.profiling import time_function
    from tirbyoc.decl.host import host_target
    from tirbyoc.rewrite.rest_schedule.nests import schedule_rest

    tgt, rows = host_target(), []
    for case in FUNCS:
        f = function(*case)
        built = {}
        for form in ("before", "after"):
            with with_pad(form == "after"):
                built[form] = schedule_rest(f, vector_bytes(tgt))[0]
        times = {k: [] for k in built}
        for _ in range(9):
            for k, fn in built.items():
                times[k].append(time_function(fn, tgt, 30))
        med = {k: float(np.median(v)) for k, v in times.items()}
        rows.append({"function": "%s %s %dx%dx%d stride %d" % (case[0], case[1], case[2], case[2], case[3], case[4]),
                     "ms": med, "ratio": med["after"] / med["before"]})
        print(f"  {rows[-1]['function']:<40} {med['before']:.4f} -> {med['after']:.4f} ms ({rows[-1]['ratio']:.2f}x)",
              flush=True)
    return rows


def whole_models() -> list:
    import numpy as np
    import tvm

    import tirbyoc
    from tirbyoc._tvm import relax_vm
    from tirbyoc.app.model_in.legalize import legalized_model
    from tirbyoc.decl.host import host_target
    from tirbyoc.offloading.lowering import PIPELINE
    from tirbyoc.relax.bridge import offload_module
    from tirbyoc.relax.prepack import pack_constant_weights
    from tirbyoc.relax.rest import schedule_rest_of

    rows = []
    for model, name in MODELS:
        t, runs = tirbyoc.get_template(name), {}
        for form in ("before", "after"):
            with with_pad(form == "after"):
                p = legalized_model(model, [t], constant_weights=True)
                mod = pack_constant_weights(offload_module(p.mod, [t], verify=False)[0])[0]
                mod = schedule_rest_of(mod, host_target())[0]
            vm = relax_vm(tvm.compile(mod, target=host_target(), tir_pipeline=PIPELINE), tvm.cpu())
            runs[form] = (vm, p.entry, [tvm.runtime.tensor(a) for a in p.arrays])
        outs = {k: vm[e](*a).numpy() for k, (vm, e, a) in runs.items()}
        times = {k: [] for k in runs}
        for _ in range(7):
            for k, (vm, e, a) in runs.items():
                times[k].append(vm.time_evaluator(e, tvm.cpu(), number=10, repeat=1)(*a).mean * 1e3)
        med = {k: float(np.median(v)) for k, v in times.items()}
        rows.append({"model": model, "template": name, "same_output": bool(np.array_equal(outs["before"], outs["after"])),
                     "ms": med, "ratio": med["after"] / med["before"],
                     "spread_ms": {k: [float(min(v)), float(max(v))] for k, v in times.items()}})
        print(f"  {model:<28} {name:<14} {med['before']:.2f} -> {med['after']:.2f} ms ({rows[-1]['ratio']:.2f}x), "
              f"same output: {rows[-1]['same_output']}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=str(HERE / "results" / "pad_inlining.json"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one thread count
    args = ap.parse_args()
    if args.one:
        print(json.dumps({"functions": functions_alone(), "models": whole_models()}))
        return
    out = {"cpu": cpu_name(), "what": __doc__.split("\n\n")[0], "runs": {}}
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"{out['cpu']}, {threads} thread(s): before (pad copied) -> after (pad inlined)", flush=True)
        env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, __file__, "--one", "1"], env=env, capture_output=True, text=True, check=True)
        lines = done.stdout.rstrip().splitlines()
        print("\n".join(lines[:-1]))
        out["runs"][str(threads)] = json.loads(lines[-1])
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
