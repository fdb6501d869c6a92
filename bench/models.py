"""Whole models against ONNX Runtime and OpenVINO on this CPU: tirbyoc's offloaded build, the
same with its weights copied on every call (no compile-time packing), TVM's default build,
ONNX Runtime, and OpenVINO where it is installed (``pip install openvino``; its default
precision, latency hint, ``INFERENCE_NUM_THREADS`` set: on a CPU with AMX it runs QDQ models
in int8 on AMX and float models in bf16, which the row records).

Models (float ONNX files with random He-initialised weights, made by `tirbyoc.testing.qdq`):
ResNet-18, ResNet-50 and MobileNetV2 at 224x224 and a BERT-base encoder (12 layers, seq 128);
``bert_base_dynamic`` is the same encoder exported with ``batch`` and ``seq`` named, as a served
model is: every engine takes that one file (tirbyoc and TVM build it once for any size) and runs
it at batch 1 x seq 128, or at ``--size batch=8 --size seq=384``; ``llama_decode`` and
``llama_prefill`` are a decoder layer's two serving files (`tirbyoc.testing.decoder`; bench/llama.py
runs them against the memory bandwidth and the FMA peak);
``--int8`` also their QDQ versions from ONNX Runtime's recommended flow (``quant_pre_process``,
then ``quantize_static``), ``--precisions int8`` those alone (the decoder's int8 file is ONNX
Runtime's dynamic quantization instead, `DYNAMIC_QUANTIZATION`). Each precision goes to the fastest
template of that precision this CPU runs, the choice `tirbyoc run` makes: fp32 to
x86_fp32_avx512 with AVX-512, else x86_fp32_avx2, else blas (`tirbyoc.app.running.run.FLOAT_TEMPLATES`);
int8 to x86_amx (then x86_vnni for what its kernel refuses) where AMX is granted, else
x86_vnni with AVX-512 VNNI, else x86_avx512bw, else x86_avx2 (`INT8_TEMPLATES`), followed by
the fp32 one for the float matmuls an int8 model keeps (the decoder's attention).
``--precisions bf16`` runs the float file as ``tirbyoc run --precision bf16`` does (its
convolutions and matmuls on bfloat16, summed in float32) on x86_amx_bf16 or x86_avx512_bf16
(then the fp32 template for what they refuse): its peer is OpenVINO's default precision (bf16
where the CPU has it); ONNX Runtime runs the float32 model, and the row gives both bf16
engines' accuracy against it (largest error over the output's scale, top-1 agreement).
``--fp32-template blas`` / ``--int8-template x86_avx2`` / ``--bf16-template`` force one.
Weights are constants, as deployed (`tirbyoc run` does the same).

Each engine runs in its own process, its thread pool sized before it starts (TVM_NUM_THREADS,
ONNX Runtime's intra-op threads, its spinning on as it is by default): timed in one process, whichever pool spun
last steals the other's cores, and the same model reads 1.5x slower by order. tirbyoc's
process and ONNX Runtime's are alive together and take turns, one round each, ``--rounds``
times (`alternate`): on a shared host a slow minute falls on both engines, not on whichever
ran then (two runs timed one engine after the other read ResNet-18 at 0.90x and 1.02x of ONNX
Runtime, every function moving alike). tirbyoc's two variants share a process (the same
pools) and are timed interleaved; TVM's default build, a sanity check minutes slower, runs in
a process of its own after them. Medians are reported, with each peer's per-round ratio range;
after ``--rounds`` rounds more are run (up to ``--max-rounds``) while the middle half of a
peer's per-round ratios spans more than ``--spread`` of their median (`settled`): on this host
one engine's figure moved 1.8x between minutes, and a headline ratio must not be one lucky or
unlucky minute. Every row is checked: the offloaded build against TVM's build of the
same model, and against ONNX Runtime (one output quantization step for a QDQ model, a relative
tolerance for a float one). Every model and precision also gets a per-PrimFunc profile at the
first thread count (each built and timed alone, times its call sites), and the model slowest
against ONNX Runtime a plot of it (``--no-profile``: neither).

    python bench/models.py [--models resnet18,resnet50,mobilenet_v2,bert_base,bert_base_dynamic] [--threads 1,2]
                           [--int8 | --precisions fp32,int8,bf16] [--int8-template NAME] [--fp32-template NAME]
                           [--rounds 5] [--max-rounds 15] [--spread 0.10] [--fast-math] [--size NAME=V]
                           [--no-profile]
                           [--out bench/results/models.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILDERS = {"resnet18": "float_resnet18", "resnet50": "float_resnet50", "mobilenet_v2": "float_mobilenet_v2",
            "bert_base": "float_bert_base", "bert_base_dynamic": "float_bert_base",
            "llama_decode": "decoder.float_llama_layer", "llama_prefill": "decoder.float_llama_layer"}
# Models exported with named dimensions, as a served model is: (the builder's options, the sizes
# run at unless --size says otherwise). Every engine takes the same file as it is - tirbyoc and
# TVM build it once for any size, ONNX Runtime and OpenVINO with their dynamic shapes - and runs
# it on inputs of those sizes; the int8 file is calibrated at the default sizes.
DYNAMIC = {"bert_base_dynamic": ({"batch": 1, "dynamic": "batch,seq"}, {"batch": 1, "seq": 128}),
           # a 1B-class decoder layer with its KV cache (`tirbyoc.testing.decoder`): one token
           # after 128, and a prompt of 128
           "llama_decode": ({"with_past": True}, {"batch": 1, "seq": 1, "past": 128}),
           "llama_prefill": ({"with_past": False}, {"batch": 1, "seq": 128})}
# Models whose int8 file is ONNX Runtime's dynamic quantization (``quantize_dynamic``: int8
# weights, each activation quantized at run time by ``DynamicQuantizeLinear`` into
# ``MatMulInteger``), the int8 a served decoder ships: its activations' ranges vary by prompt, so
# no calibration fixes them.
DYNAMIC_QUANTIZATION = {"llama_decode", "llama_prefill"}


def run_sizes(name: str, given: list[str] | None = None) -> dict | None:
    """The named dimensions' values a dynamic model runs at: its `DYNAMIC` defaults with the
    ``--size NAME=V`` options applied (None for a model of fixed shapes)."""
    if name not in DYNAMIC:
        return None
    sizes = dict(DYNAMIC[name][1])
    for item in given or []:
        key, _, value = item.partition("=")
        if key not in sizes or not value.isdigit():
            raise SystemExit(f"--size {item}: {name} has the sizes {', '.join(sizes)} (NAME=V, V a whole number)")
        sizes[key] = int(value)
    return sizes


def template_for(precision: str, args) -> str:
    """The template a precision runs on here: the one ``args`` forces for it
    (``--int8-template`` / ``--fp32-template``), or the fastest template of that precision this
    CPU runs (the first of `INT8_TEMPLATES` / `FLOAT_TEMPLATES` that runs here, an int8 one
    followed by the fp32 one: the choice `tirbyoc run` makes)."""
    forced = {"int8": args.int8_template, "bf16": args.bf16_template}.get(precision, args.fp32_template)
    if forced:
        return forced
    import tirbyoc  # deferred: imports TVM, after the thread count is set
    from tirbyoc.app.running.run import FALLBACKS, FLOAT_TEMPLATES, default_templates

    if precision == "bf16":
        return ",".join(default_templates(precision="bf16"))
    if precision == "int8":  # then the fp32 core, for the float matmuls an int8 model keeps
        return ",".join(default_templates())
    first = next((t for t in FLOAT_TEMPLATES if tirbyoc.get_template(t).runs_here()), FLOAT_TEMPLATES[-1])
    after = FALLBACKS.get(first)
    return first + (f",{after}" if after and tirbyoc.get_template(after).runs_here() else "")


def builder(name: str):
    """The function of `tirbyoc.testing` that writes model ``name``'s float ONNX file
    (`BUILDERS`: a function of ``qdq``, or ``module.function``)."""
    import importlib

    module, _, function = BUILDERS[name].rpartition(".")
    return getattr(importlib.import_module(f"tirbyoc.testing.{module or 'qdq'}"), function)


def model_file(name: str, precision: str, folder: Path) -> Path:
    from tirbyoc.testing import qdq  # deferred: imports TVM, after the thread count is set

    path = folder / f"{name}.onnx"
    options, sizes = DYNAMIC.get(name, ({}, None))
    if not path.exists():
        builder(name)(path, **options)
    if precision == "int8" and name in DYNAMIC_QUANTIZATION:
        out = folder / f"{name}_int8_dynamic.onnx"
        return out if out.exists() else qdq.ort_quantize_dynamic(path, out)
    if precision == "int8":
        out = folder / f"{name}_qdq.onnx"
        return out if out.exists() else qdq.ort_quantize(path, out, sizes=sizes)
    return path


def _timer(vm, entry, args, dev, repeat):
    timer = vm.time_evaluator(entry, dev, number=repeat, repeat=1)
    return lambda: float(timer(*args).results[0]) * 1e3


def tvm_engines(path: Path, template: str, group: str, repeat: int, fast_math: bool = False,
                precision: str = "fp32", sizes: dict | None = None):
    """(name -> a callable timing one measurement in ms, name -> output, facts): the tirbyoc
    group (compile-time packed weights, and per-call packing) or TVM's default build;
    ``fast_math``: both groups approximate the model's transcendental functions alike;
    ``precision="bf16"``: both run the model's convolutions and matmuls on bfloat16
    (`tirbyoc.relax.bf16`), so that TVM's build checks tirbyoc's like with like. ``sizes``: the
    values of a dynamic model's named dimensions its inputs are drawn at (the build stays
    symbolic, as `tirbyoc run --size` builds it)."""
    import tvm  # deferred: after the thread count is set

    from tirbyoc._tvm import make_target, relax_vm
    from tirbyoc import RunOptions, legalized_model
    from tirbyoc.app.running.run import model_output
    from tirbyoc.app.model_in.sizes import coverage_at
    from tirbyoc.app.run_target import complete_target
    from tirbyoc.offloading.lowering import PIPELINE
    from tirbyoc.relax.bridge import offload_module
    from tirbyoc.relax.prepack import pack_constant_weights
    from tirbyoc.relax.rest import schedule_rest_of

    tgt = make_target(complete_target({"kind": "llvm"}))
    templates = template.split(",")
    bindings = {k: (v,) for k, v in sizes.items()} if sizes else None
    prepared = legalized_model(str(path), templates, RunOptions(fast_math=fast_math, precision=precision,
                                                                sizes=bindings), constant_weights=True)
    mod, entry, arrays, fast, bf16 = prepared.mod, prepared.entry, prepared.arrays, prepared.fast_math, prepared.bf16
    facts, builds = {"fast_math": None if fast is None else dict(fast.replaced)}, {"tvm_default": (mod, 1)}
    if bf16 is not None:
        facts["bf16_converted"] = dict(bf16.converted)
    if group == "tirbyoc":
        offloaded, report = offload_module(mod, templates)
        packed, report.packed = pack_constant_weights(offloaded)
        packed, report.rest = schedule_rest_of(packed, tgt)
        offloaded, _ = schedule_rest_of(offloaded, tgt)
        builds = {"tirbyoc": (packed, repeat), "tirbyoc_per_call_packing": (offloaded, repeat)}
        # a function of symbolic sizes counts no MACs: the share at the sizes the run is timed at
        done, total = coverage_at(mod, report, sizes) if sizes else (report.offloaded_macs, report.total_macs)
        facts |= {"coverage": done / total if total else None, "packed_weights": report.packed.tensors,
                 "packed_bytes_per_run": report.packed_bytes_per_run(),
                 "rest": {k: v for k, v in report.rest.to_json().items() if k != "functions"},
                 "_profile": (packed, tgt)}
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    timers, outs = {}, {}
    for name, (m, n) in builds.items():
        vm = relax_vm(tvm.compile(m, target=tgt, tir_pipeline=PIPELINE), dev)
        outs[name] = model_output(vm[entry](*args))
        timers[name] = _timer(vm, entry, args, dev, n)
        if name == "tirbyoc":
            facts["_vm"] = (vm, entry, args)
    return timers, outs, facts, arrays


def ort_engine(path: Path, inputs: Path, threads: int, repeat: int):
    """ONNX Runtime on the same file and the inputs the TVM engines ran (``inputs``)."""
    import numpy as np  # deferred: after the thread count is set
    import onnxruntime

    from tirbyoc.app.running.reference import ort_session

    with np.load(inputs) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    # its own default, spinning on: a process of its own, stopped while tirbyoc is timed
    session = ort_session(path, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, threads, spinning=True)
    feed = dict(zip([i.name for i in session.get_inputs()], arrays))
    out = np.concatenate([np.asarray(o).ravel() for o in session.run(None, feed)])

    def ms():
        t0 = time.perf_counter()
        for _ in range(repeat):
            session.run(None, feed)
        return (time.perf_counter() - t0) / repeat * 1e3

    return {"onnxruntime": ms}, {"onnxruntime": out}, {}


def openvino_engine(path: Path, inputs: Path, threads: int, repeat: int):
    """OpenVINO on the same file and inputs: its CPU plugin at its default precision (bf16
    for a float model on a CPU with AMX or AVX512_BF16; a QDQ model in int8), latency hint."""
    import numpy as np  # deferred: after the thread count is set
    import openvino as ov

    with np.load(inputs) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    feed = {compiled.inputs[i]: a for i, a in enumerate(arrays)}
    request.infer(feed)
    out = np.concatenate([np.asarray(request.get_output_tensor(i).data).ravel()
                          for i in range(len(compiled.outputs))])

    def ms():
        t0 = time.perf_counter()
        for _ in range(repeat):
            request.infer(feed)
        return (time.perf_counter() - t0) / repeat * 1e3

    facts = {"openvino": {"version": ov.__version__,
                          "inference_precision": str(compiled.get_property("INFERENCE_PRECISION_HINT"))}}
    return {"openvino": ms}, {"openvino": out}, facts


def has_openvino() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def in_model(vm, entry: str, args, rounds: int = 7) -> tuple[float, dict]:
    """(model ms, PrimFunc name -> ms per run inside the model): each call timed where the
    model makes it (the VM's instrument hook, before and after every call), so its inputs and
    weights are as warm or cold as a run leaves them; medians over ``rounds`` runs. A call's
    time includes about a microsecond of the hook itself."""
    import tvm  # deferred: after the thread count is set

    timer = _timer(vm, entry, args, tvm.cpu(), 3)
    model = statistics.median(timer() for _ in range(rounds))  # before the hook slows calls down
    runs, started = [], []

    def instrument(func, symbol, before, _ret, *_args):
        now = time.perf_counter_ns()
        if before:
            started.append(now)
        else:
            runs[-1][symbol] = runs[-1].get(symbol, 0) + now - started.pop()
        return 0

    vm.set_instrument(instrument)
    for _ in range(rounds):
        runs.append({})
        vm[entry](*args)
    names = set().union(*runs)
    return model, {k: statistics.median(r.get(k, 0) for r in runs) / 1e6 for k in names}


def profile(packed, tgt, repeat: int, model=None, sizes: dict | None = None) -> list[dict]:
    """Per PrimFunc of the offloaded model: ms per call built and timed alone, times its call
    sites (``ms``), and, given ``model`` (vm, entry, args), its ms inside a run of the model
    (``in_model_ms``, the row's ``model_ms`` beside it); most time first. ``sizes``: a dynamic
    model's run sizes, each function of symbolic extents timed at them."""
    from tirbyoc._tvm import tirx  # deferred: after the thread count is set
    from tirbyoc.app.running.profiling import at_sizes, time_function
    from tirbyoc.relax.bridge import OFFLOADED_ATTR, call_counts

    calls = call_counts(packed)  # from the module: fusion renames what the report named
    model_ms, inside = in_model(*model) if model is not None else (None, {})
    rows = []
    for gv, func in packed.functions.items():
        if isinstance(func, tirx.PrimFunc):
            ms = time_function(at_sizes(func, sizes).with_attr("global_symbol", gv.name_hint), tgt, repeat)
            n = calls.get(gv.name_hint, 1)
            rows.append({"function": gv.name_hint, "calls": n, "ms_per_call": ms, "ms": ms * n,
                         "in_model_ms": inside.get(gv.name_hint), "model_ms": model_ms,
                         "offloaded": OFFLOADED_ATTR in (func.attrs or {})})
    return sorted(rows, key=lambda r: -r["ms"])


def worker(args) -> None:
    """One engine group, one model, one thread count (this process's pools sized for it):
    its samples and facts as JSON on stdout's last line, its outputs in ``--outputs``."""
    import numpy as np  # deferred: after the thread count is set

    path = model_file(args.models, args.precision, Path(args.cache))
    inputs = Path(args.outputs) / "inputs.npz"
    if args.group == "onnxruntime":
        timers, outs, facts = ort_engine(path, inputs, args.threads, args.repeat)
    elif args.group == "openvino":
        timers, outs, facts = openvino_engine(path, inputs, args.threads, args.repeat)
    else:
        template = template_for(args.precision, args)
        timers, outs, facts, arrays = tvm_engines(path, template, args.group, args.repeat, args.fast_math,
                                                  args.precision, run_sizes(args.models, args.size))
        np.savez(inputs, *arrays)
    samples = {k: [] for k in timers}
    for _ in range(args.rounds):
        for k, timer in timers.items():
            samples[k].append(timer())
    if args.lockstep:  # a round whenever the parent says "run" (see `alternate`)
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            round_ = {k: timer() for k, timer in timers.items()}
            for k, ms in round_.items():
                samples[k].append(ms)
            print(json.dumps(round_), flush=True)
    for k, out in outs.items():
        np.save(Path(args.outputs) / f"{k}.npy", out)
    prof, model = facts.pop("_profile", None), facts.pop("_vm", None)
    if args.profile and prof is not None:
        facts["profile"] = profile(*prof, args.repeat, model, run_sizes(args.models, args.size))
    print(json.dumps({"samples_ms": samples, **facts}, default=str))


def _worker_command(args, threads: str, model: str, precision: str, group: str, outputs: str,
                    rounds: int) -> tuple[list, dict]:
    """(the command, the environment) of a worker process for one engine group."""
    env = {**os.environ, "TVM_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    env.pop("TIRBYOC_BLAS_THREADS", None)  # whole blas matmuls share TVM's pool, sized above
    cmd = [sys.executable, __file__, "--worker", "--worker-threads", threads, "--models", model,
           "--precision", precision, "--group", group, "--rounds", str(rounds),
           "--repeat", str(args.repeat), "--cache", args.cache, "--outputs", outputs]
    cmd += ["--fast-math"] if args.fast_math else []
    cmd += [f"--size={item}" for item in args.size or []]
    cmd += ["--int8-template", args.int8_template] if args.int8_template else []
    cmd += ["--fp32-template", args.fp32_template] if args.fp32_template else []
    cmd += ["--bf16-template", args.bf16_template] if args.bf16_template else []
    return cmd, env


def _spawn(args, threads: str, model: str, precision: str, group: str, outputs: str, profile: bool = False) -> dict:
    """Run one engine group in a process of its own (``profile``: only the per-PrimFunc profile,
    no timing rounds)."""
    cmd, env = _worker_command(args, threads, model, precision, group, outputs, 0 if profile else args.rounds)
    proc = subprocess.run(cmd + (["--profile"] if profile else []), env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"{model} {precision} {group} on {threads} thread(s) failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _line(proc, wanted) -> str | None:
    """The next line of ``proc``'s output that ``wanted`` accepts (None at its end)."""
    for line in proc.stdout:
        if wanted(line.strip()):
            return line
    return None


def alternate(args, threads: str, model: str, precision: str, groups: list, outputs: str) -> dict:
    """Run the engine ``groups`` in processes of their own, alive together, timed in turns: each
    builds (in order: the first writes the inputs the others read) and waits; then, ``--rounds``
    times and more until the ratios are `settled` (``--max-rounds`` at most), each in turn
    times one round while the others are stopped (SIGSTOP: an engine
    waiting on its input still ran threads that took ONNX Runtime's second core from it, 8.1 ->
    15 ms on ResNet-18). Returns their facts, with every round's samples."""
    procs = {}
    try:
        for group in groups:
            cmd, env = _worker_command(args, threads, model, precision, group, outputs, 0)
            procs[group] = subprocess.Popen(cmd + ["--lockstep"], env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True)
            if not _line(procs[group], lambda line: line == "ready"):
                raise SystemExit(f"{model} {precision} {group} on {threads} thread(s) failed to build")
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGSTOP)
        seen, rounds = {}, 0
        while rounds < args.rounds or (rounds < args.max_rounds and not settled(seen, args.spread)):
            rounds += 1
            for group, proc in procs.items():
                os.kill(proc.pid, signal.SIGCONT)
                proc.stdin.write("run\n")
                proc.stdin.flush()
                line = _line(proc, lambda line: line.startswith("{"))  # its samples; it keeps them too
                if not line:
                    raise SystemExit(f"{model} {precision} {group} on {threads} thread(s) stopped mid-run")
                for k, ms in json.loads(line).items():
                    seen.setdefault(k, []).append(ms)
                os.kill(proc.pid, signal.SIGSTOP)
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGCONT)
        facts = {}
        for group, proc in procs.items():
            out, _ = proc.communicate("end\n")
            if proc.returncode:
                raise SystemExit(f"{model} {precision} {group} on {threads} thread(s) failed (exit {proc.returncode})")
            got = json.loads(out.strip().splitlines()[-1])
            facts.setdefault("samples_ms", {}).update(got.pop("samples_ms"))
            facts.update(got)
        return facts
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


def measure(args, threads: str, name: str, precision: str) -> dict:
    """One row: each engine group in its own process, then the outputs compared."""
    import numpy as np

    import tirbyoc
    from tirbyoc.app.running.reference import agrees, output_step, steps_apart
    from tirbyoc.app.running.run import compare

    template = template_for(precision, args)
    row = {"model": name, "precision": precision, "template": template, "threads": int(threads),
           "inferences_per_measurement": args.repeat}
    if name in DYNAMIC:
        row["sizes"] = run_sizes(name, args.size)
    first = tirbyoc.get_template(template.split(",")[0])
    if not first.runs_here():
        return {**row, "not_run": first.unavailable_reason()}
    t0 = time.perf_counter()
    samples = {}
    peers = ["onnxruntime"] + (["openvino"] if has_openvino() else [])
    with tempfile.TemporaryDirectory() as outputs:
        for got in (alternate(args, threads, name, precision, ["tirbyoc", *peers], outputs),
                    _spawn(args, threads, name, precision, "tvm_default", outputs)):
            samples.update(got.pop("samples_ms"))
            row.update(got)
        out = {k: np.load(Path(outputs) / f"{k}.npy") for k in samples}
        fp32 = _float_output(name, Path(args.cache), Path(outputs)) if (
            precision == "int8" and name in DYNAMIC_QUANTIZATION) else None
    median = {k: statistics.median(v) for k, v in samples.items()}
    vs_tvm = compare(out["tirbyoc"].ravel(), out["tvm_default"].ravel(), "bfloat16" if precision == "bf16" else None)
    step = output_step(model_file(name, precision, Path(args.cache)))
    agree, ort_err = agrees(out["tirbyoc"].ravel(), out["onnxruntime"].ravel(), step)
    if precision == "bf16":  # ONNX Runtime runs the float32 model: the accuracy bf16 costs, both bf16 engines
        row["accuracy_vs_fp32"] = {k: _accuracy(out[k], out["onnxruntime"]) for k in ("tirbyoc", "openvino") if k in out}
        agree = row["accuracy_vs_fp32"]["tirbyoc"]["top1_agreement"] in (None, 1.0)
    if fp32 is not None:  # activations quantized at run time: as accurate as ONNX Runtime (`_float_output`)
        row["accuracy_vs_fp32"] = {k: _accuracy(out[k], fp32) for k in ("tirbyoc", "onnxruntime", "openvino") if k in out}
        errors = {k: v["max_rel_err"] for k, v in row["accuracy_vs_fp32"].items()}
        agree = agree or errors["tirbyoc"] <= DYNAMIC_ACCURACY_MARGIN * errors["onnxruntime"]
    row.update(latency_ms=median, samples_ms=samples,
               checks={"verified_vs_tvm": vs_tvm.passed, "max_abs_err_vs_tvm": vs_tvm.abs_err,
                       "same_as_per_call_packing": bool(np.array_equal(out["tirbyoc"], out["tirbyoc_per_call_packing"])),
                       "agrees_with_onnxruntime": agree,
                       "steps_from_onnxruntime": steps_apart(ort_err, step) if step else None,
                       "max_abs_err_vs_onnxruntime": ort_err},
               speedup_vs_onnxruntime=median["onnxruntime"] / median["tirbyoc"],
               speedup_vs_openvino=median["openvino"] / median["tirbyoc"] if "openvino" in median else None,
               ratio_spread=ratio_spread(samples), ratio_iqr=ratio_iqr(samples),
               rounds=len(samples.get("tirbyoc", [])),
               speedup_vs_tvm_default=median["tvm_default"] / median["tirbyoc"],
               packing_gain=median["tirbyoc_per_call_packing"] / median["tirbyoc"],
               seconds=time.perf_counter() - t0)
    if "openvino" in out:
        row["checks"]["agrees_with_openvino"], row["checks"]["max_abs_err_vs_openvino"] = \
            agrees(out["tirbyoc"].ravel(), out["openvino"].ravel(), step)
    print(f"[{threads} thread(s)] {name} {precision}: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in median.items()), file=sys.stderr, flush=True)
    return row


DYNAMIC_ACCURACY_MARGIN = 1.25  # a dynamically quantized output agrees: error vs float <= 1.25x ONNX Runtime's


def _float_output(name: str, cache: Path, outputs: Path):
    """ONNX Runtime's output of model ``name``'s float file on the inputs the engines ran (one
    thread, in this process): the reference a dynamically quantized row is judged by. Its
    activations are rounded to 8 bits at run time with a scale taken from their range, so a
    float difference of an ulp before a quantizer (a mean summed in another order) moves a
    rounding, and the two engines' outputs part by a few activation steps while both are
    right: each is compared with the float model instead, and agrees when it is as accurate
    as ONNX Runtime (`DYNAMIC_ACCURACY_MARGIN`)."""
    import numpy as np
    import onnxruntime

    from tirbyoc.app.running.reference import ort_session

    with np.load(outputs / "inputs.npz") as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    session = ort_session(model_file(name, "fp32", cache), onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, 1)
    feed = dict(zip([i.name for i in session.get_inputs()], arrays))
    return np.concatenate([np.asarray(o).ravel() for o in session.run(None, feed)])


def _accuracy(mine, fp32) -> dict:
    """A bf16 output against the float32 model's (`Bf16Report.measure`): the largest error over
    the output's scale, and, for a classifier (1000 ImageNet classes a row), whether each
    row's top-1 class agrees."""
    from tirbyoc.relax.bf16 import Bf16Report

    report = Bf16Report()
    width = 1000 if mine.size % 1000 == 0 else mine.size
    report.measure(mine.reshape(-1, width), fp32.reshape(-1, width))
    top1 = report.argmax_agreement if width == 1000 else None
    return {"max_rel_err": report.max_rel_err, "top1_agreement": top1, "rows": report.rows if top1 is not None else 0}


def table(rows) -> str:
    from tirbyoc.offloading.table import render  # deferred: imports TVM

    def ms(v):
        return "-" if v is None else f"{v:.1f}"

    out = []
    for r in rows:
        if "not_run" in r:
            out.append((_model_label(r), r["precision"], r["template"], str(r["threads"]), "not run: " + r["not_run"][:60],
                        "", "", "", "", ""))
            continue
        lat, c = r["latency_ms"], r["checks"]
        precision = r["precision"] + (" fast-math" if r.get("fast_math") else "")
        ov = r.get("speedup_vs_openvino")
        spread = r.get("ratio_spread") or {}
        out.append((_model_label(r), precision, r["template"], str(r["threads"]), ms(lat["tirbyoc"]),
                    ms(lat["tvm_default"]), ms(lat["onnxruntime"]), ms(lat.get("openvino")),
                    f"{r['speedup_vs_onnxruntime']:.2f}x {_range(spread.get('onnxruntime'))}",
                    "-" if ov is None else f"{ov:.2f}x {_range(spread.get('openvino'))}",
                    "yes" if c["verified_vs_tvm"] and c["agrees_with_onnxruntime"] else "NO"))
    return render(("model", "precision", "template", "threads", "tirbyoc ms", "TVM default ms", "ORT ms",
                   "OpenVINO ms", "tirbyoc vs ORT (round range)", "vs OpenVINO (round range)", "checked"), out)


def _model_label(row) -> str:
    """A row's model, with the sizes a dynamic one ran at."""
    sizes = row.get("sizes")
    return row["model"] + (" " + " ".join(f"{k}={v}" for k, v in sizes.items()) if sizes else "")


def ratio_iqr(samples: dict) -> dict:
    """Per peer, the interquartile range of its per-round ratios to tirbyoc over their median:
    how far apart the middle half of the rounds put the ratio (unlike the full range, it does
    not grow with more rounds, so it says when more rounds stop moving the median)."""
    out = {}
    for peer in ("onnxruntime", "openvino"):
        ratios = [p / t for p, t in zip(samples.get(peer, []), samples.get("tirbyoc", [])) if t > 0]
        if len(ratios) >= 4:
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            out[peer] = (q3 - q1) / statistics.median(ratios)
    return out


def settled(samples: dict, spread: float) -> bool:
    """Whether every peer's per-round ratio is settled: its `ratio_iqr` at most ``spread``."""
    iqr = ratio_iqr(samples)
    return bool(iqr) and all(v <= spread for v in iqr.values())


def ratio_spread(samples: dict) -> dict:
    """Per peer, the lowest and highest of its per-round ratios to tirbyoc (rounds are timed in
    turns, so round i of each engine saw the same minute of the host)."""
    out = {}
    for peer in ("onnxruntime", "openvino"):
        if peer in samples:
            ratios = [p / t for p, t in zip(samples[peer], samples["tirbyoc"]) if t > 0]
            if ratios:
                out[peer] = [min(ratios), max(ratios)]
    return out


def _range(pair) -> str:
    return "" if not pair else f"[{pair[0]:.2f}-{pair[1]:.2f}]"


def profile_summary(row) -> dict:
    """Where a profiled row's time goes, in ms: its offloaded PrimFuncs and those left to TVM,
    each built and timed alone (warm caches); the same inside a run of the model (the
    profile's own process); what the model's caches add to them (weights and inputs as a run
    leaves them, against warm); and what is between the functions (the VM, allocation,
    whole library calls: the model's time less its PrimFuncs' time inside it)."""
    prof = row["profile"]
    off = sum(p["ms"] for p in prof if p["offloaded"])
    left = sum(p["ms"] for p in prof if not p["offloaded"])
    out = {"model_ms": row["latency_ms"]["tirbyoc"], "offloaded_ms": off, "left_to_tvm_ms": left}
    if prof and prof[0].get("model_ms") is not None:
        inside = sum(p["in_model_ms"] or 0 for p in prof)
        # differences of medians from separate runs: noise can make them negative, where the
        # true figure is about zero - reported as 0, never as a negative time
        out |= {"profiled_model_ms": prof[0]["model_ms"], "in_model_ms": inside,
                "caches_ms": max(0.0, inside - off - left),
                "between_functions_ms": max(0.0, prof[0]["model_ms"] - inside)}
    else:
        out["between_functions_ms"] = max(0.0, row["latency_ms"]["tirbyoc"] - off - left)
    return out


def plot(row, path: Path) -> None:
    import matplotlib  # deferred: optional (the test extra installs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inside = row["profile"] and row["profile"][0].get("model_ms") is not None
    key = "in_model_ms" if inside else "ms"

    def label(name):  # fusion names run to 150 characters; their first operators say what it is
        return name if len(name) <= 44 else name[:42] + "..."

    groups = {}  # functions with one label (twelve layers' FFN1 matmuls) as one bar
    for p in row["profile"]:
        total, n, offloaded = groups.get(label(p["function"]), (0.0, 0, p["offloaded"]))
        groups[label(p["function"])] = (total + (p[key] or 0), n + 1, offloaded)
    top = sorted(groups.items(), key=lambda g: -g[1][0])[:20]
    bars = [(name + (f" ({n} functions)" if n > 1 else ""), total, "tab:blue" if offloaded else "tab:gray")
            for name, (total, n, offloaded) in top]
    # whole library calls (call_dps_packed) are not PrimFuncs: what the profile does not cover
    model = row["profile"][0]["model_ms"] if inside else row["latency_ms"]["tirbyoc"]
    rest = model - sum(p[key] or 0 for p in row["profile"])
    if rest > 0:
        bars.append(("between the functions: the VM, allocation,\nwhole library calls", rest, "tab:orange"))
    bars.sort(key=lambda b: b[1])
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(bars) + 1.6))
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xlabel("ms per run (each PrimFunc's calls timed inside the model)" if inside else
                  "ms per run (each PrimFunc built and timed alone, times its call sites)")
    fast = " fast-math" if row.get("fast_math") else ""
    ax.set_title(f"{row['model']} {row['precision']}{fast} on {row['template']}, {row['threads']} thread(s), "
                 f"{model:.1f} ms in all\nblue offloaded PrimFuncs, grey left to TVM")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50,bert_base")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--int8", action="store_true", help="also the QDQ models")
    parser.add_argument("--int8-template", help="the int8 template timed (default: the fastest this CPU runs)")
    parser.add_argument("--fp32-template", help="the fp32 template timed (default: the fastest this CPU runs; "
                                                "blas for the library GEMM)")
    parser.add_argument("--bf16-template", help="the bf16 template timed (default: the fastest this CPU runs)")
    parser.add_argument("--precisions", help="the precisions measured, comma-separated: fp32, int8, bf16 "
                                             "(default fp32; --int8: fp32,int8)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds timed in turns, at least (default 5)")
    parser.add_argument("--max-rounds", type=int, default=15,
                        help="rounds at most: after --rounds, more are run while a peer's per-round ratio "
                             "to tirbyoc is spread wider than --spread (default 15)")
    parser.add_argument("--spread", type=float, default=0.10,
                        help="the interquartile range of the per-round ratios, over their median, that "
                             "counts as settled (default 0.10)")
    parser.add_argument("--repeat", type=int, default=20,
                        help="inferences per measurement (TVM's default build: 1). The first after another "
                             "engine's turn runs on caches that engine left: at 3, OpenVINO's int8 ResNet-50 "
                             "read 7.6 ms, at 30 5.9 (tirbyoc's 9.5 and 8.9); 20 measures the steady state a "
                             "served model runs in (default 20)")
    parser.add_argument("--cache", help="folder for the ONNX files (default: a temporary one)")
    parser.add_argument("--fast-math", action="store_true",
                        help="tirbyoc and TVM's build approximate erf, exp, tanh, softmax (tirbyoc run "
                             "--fast-math); ONNX Runtime as it is. Default --out: models_fast_math.json")
    parser.add_argument("--size", action="append", metavar="NAME=V",
                        help="a dynamic model's named dimension and the value it runs at (repeatable; "
                             "unless given: " + "; ".join(
                                 f"{name} {', '.join(f'{k}={v}' for k, v in sizes.items())}"
                                 for name, (_, sizes) in DYNAMIC.items()) + ")")
    parser.add_argument("--out", help="the JSON written (default bench/results/models.json)")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the per-PrimFunc profile and its plot (BERT-base's: about 25 minutes)")
    for hidden in ("--worker", "--profile", "--lockstep"):
        parser.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--worker-threads", "--precision", "--group", "--outputs"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.threads = int(args.worker_threads)
        worker(args)
        return
    precisions = (args.precisions or ("fp32,int8" if args.int8 else "fp32")).split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        args.cache = args.cache or tmp
        Path(args.cache).mkdir(parents=True, exist_ok=True)
        for n in args.threads.split(","):
            for name in args.models.split(","):
                for precision in precisions:
                    rows.append(measure(args, n, name, precision))
        measured = [r for r in rows if "latency_ms" in r]
        first = args.threads.split(",")[0]
        profiled = measured if not args.no_profile else []
        for row in profiled:
            if str(row["threads"]) == first:
                with tempfile.TemporaryDirectory() as outputs:
                    row["profile"] = _spawn(args, first, row["model"], row["precision"], "tirbyoc", outputs,
                                            profile=True)["profile"]
        if profiled:
            slowest = min((r for r in profiled if "profile" in r), key=lambda r: r["speedup_vs_onnxruntime"])
    print(table(rows))
    for row in measured:
        if "profile" in row:
            row["profile_summary"] = profile_summary(row)
            print(f"{row['model']} {row['precision']}, {row['threads']} thread(s): "
                  + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in row["profile_summary"].items()))
    out = Path(args.out or HERE / "results" / ("models_fast_math.json" if args.fast_math else "models.json"))
    out.write_text(json.dumps({"benchmark": "models", "cpu": _cpu(), "rows": rows}, indent=1) + "\n")
    if profiled:
        plot(slowest, out.with_name(out.stem + "_layers.png"))
    print(f"\nwritten to {out}")


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
