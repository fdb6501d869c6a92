"""`tirbyoc run`: a model in, its offloadable PrimFuncs offloaded, both builds run and compared.

Import (built-in model), legalize (``LegalizeOps``), offload (`OffloadTIR`), build the
offloaded and the untouched module with TVM's default pipeline, run both on the same seeded
inputs, compare the outputs, time both, and report per PrimFunc what happened.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field

import numpy as np

from tirbyoc._tvm import build, is_host_target, relax_vm, tirx, tvm
from tirbyoc.app.model_in.frontends import is_float_model, size_origin, sizes_to_run
from tirbyoc.app.model_in.legalize import LegalizedModel, importing, legalized_model
from tirbyoc.app.running.model_call import ModelCall
from tirbyoc.app.model_in.model_inputs import model_inputs
from tirbyoc.app.options import RunOptions, options_of
from tirbyoc.app.running.profiling import profile_functions
from tirbyoc.app.running.reference import onnxruntime_reference, output_step
from tirbyoc.app.running.result import RunResult
from tirbyoc.app.model_in.sizes import SizeRun, coverage_at
from tirbyoc.app.model_in.sizes import bindings as size_bindings
from tirbyoc.app.running.targets import (
    BASELINES,
    baseline_module,
    check_target,
    check_templates_on_target,
    model_target,
)
from tirbyoc.app.run_target import complete_target, run_target
from tirbyoc.decl.extern import check_loaded
from tirbyoc.decl.registry import as_template, get_template
from tirbyoc.errors import ModelError, TirbyocError, last_line
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.offloading.verification import compare_arrays
from tirbyoc.offloading.devices import device_of, reference_target
from tirbyoc.relax.bf16 import Bf16Report
from tirbyoc.relax.bridge import offload_module
from tirbyoc.relax.emulated import EmulatedRuns, emulate_offloaded
from tirbyoc.relax.prepack import pack_constant_weights
from tirbyoc.relax.rest import schedule_rest_of
from tirbyoc.relax.quantized import QuantizedReport
from tirbyoc.tuning.apply import tuned_schedules

INT8_TEMPLATES = ("x86_amx", "x86_vnni", "x86_avx512bw", "x86_avx2")  # this CPU's int8 cores, fastest first
# a template whose kernel refuses some blocks (AMX: N not a multiple of 16) and the one tried next
FALLBACKS = {"x86_amx": "x86_vnni", "x86_amx_bf16": "x86_avx512_bf16", "x86_avx2_gemm": "x86_avx2"}
FLOAT_TEMPLATES = ("x86_fp32_avx512", "x86_fp32_avx2", "blas")  # fp32 cores, fastest first
BF16_TEMPLATES = ("x86_amx_bf16", "x86_avx512_bf16")  # --precision bf16: this CPU's bf16 cores, fastest first
PRECISIONS = ("bf16",)  # what --precision converts a float model to (None: as the model gives it)


class Progress:
    """A one-line progress bar on a terminal (plain lines otherwise), on stderr."""

    def __init__(self, enabled: bool = True, stream=None, label: str = "offload"):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.label = label
        self.tty = self.stream.isatty()

    def phase(self, text: str) -> None:
        if self.enabled:
            self._write(f"tirbyoc: {text}", end=True)
        else:
            logging.getLogger("tirbyoc.app.running.run").debug(text)

    def step(self, done: int, total: int, name: str) -> None:
        if not self.enabled or not total:
            return
        width = 24
        fill = width * done // total
        line = f"tirbyoc: {self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {name}"
        if self.tty:
            self.stream.write("\r" + line[:100].ljust(100))
            if done == total:
                self.stream.write("\n")
            self.stream.flush()
        elif done == total or done % max(1, total // 4) == 0:
            self._write(line, end=True)

    def _write(self, text: str, end: bool) -> None:
        self.stream.write(text + ("\n" if end else ""))
        self.stream.flush()


def _first_runnable(order) -> list[str]:
    """The first template of ``order`` this machine runs and, where it has one, the template
    that takes what its kernel refuses (`FALLBACKS`); [] when none runs."""
    for name in order:
        if get_template(name).runs_here():
            after = FALLBACKS.get(name)
            return [name] + ([after] if after and get_template(after).runs_here() else [])
    return []


def default_templates(model: str | None = None, precision: str | None = None) -> list[str]:
    """The template a run uses when none is given: for a model known to be float
    (`is_float_model`), the fastest fp32 template this CPU runs (`FLOAT_TEMPLATES`: the
    AVX-512 fused multiply-add core, else the AVX2 one, else blas); otherwise (an int8 model,
    the default model, a model file not yet read) the fastest int8 template this CPU runs
    (`INT8_TEMPLATES`: AMX where Linux grants it, with VNNI for what its kernel refuses; else
    VNNI, AVX-512 BW, AVX2), followed by the fastest fp32 one for the float matmuls an int8
    model keeps (a dynamically quantized model's attention: ``MatMulInteger`` only for its
    projections; at a decoding step's few rows they keep their own loops,
    `tirbyoc.offloading.few_rows`). With ``precision="bf16"``: the fastest bfloat16
    template (`BF16_TEMPLATES`: AMX, else AVX512_BF16) followed by the fastest fp32 one, which
    takes what the bf16 kernels do not (a matrix-vector product) with its operands widened
    exactly; without a bf16 template, the fp32 one alone."""
    first = BF16_TEMPLATES if precision == "bf16" else () if is_float_model(model) else INT8_TEMPLATES
    order = first + FLOAT_TEMPLATES
    chosen = _first_runnable(first) + _first_runnable(FLOAT_TEMPLATES)
    if chosen:
        return chosen
    raise TirbyocError(f"none of the default templates ({', '.join(order)}) runs on this machine; "
                       "pass --template")


def model_output(value) -> np.ndarray:
    """One array of a model's result (a tuple's leaves flattened and concatenated, in the
    widest of their dtypes)."""
    if hasattr(value, "numpy"):
        return value.numpy()
    leaves = [model_output(v) for v in value]
    if not leaves:
        return np.zeros(0, "float32")
    return np.concatenate([l.ravel() for l in leaves]).astype(np.result_type(*leaves))


def build_and_time(call: ModelCall, repeat: int, simulators=(), *, twice: bool = False, timed: bool = True,
                   builds: dict | None = None):
    """(output, latency in ms or None when not ``timed``, simulator stats of the first run) of
    ``call``. ``twice``: run once more and return None for the output if the two runs disagree
    (a build that reads outside its inputs' domain gives what memory held). ``builds``:
    compiled modules kept by module, so a model run at several sizes is built once."""

    mod, target, entry = call.mod, call.target, call.entry
    key = (id(mod), str(target))
    exe = (builds or {}).get(key)
    if exe is None:
        if is_host_target(target):
            for gv, func in mod.functions.items():
                if isinstance(func, tirx.PrimFunc):
                    check_loaded(func, f"PrimFunc {gv.name_hint}")
        exe = build(mod, target, PIPELINE)
        if builds is not None:
            builds[key] = exe
    dev = device_of(target).runtime_device()
    vm = relax_vm(exe, dev)
    args = [tvm.runtime.tensor(a, dev) for a in call.arrays]
    for sim in simulators:
        sim.configure()  # this template's timing, state cleared: the first run is measured
    out = model_output(vm[entry](*args))
    stats = [sim.stats() for sim in simulators]
    if twice and not np.array_equal(out, model_output(vm[entry](*args)), equal_nan=True):
        out = None
    if not timed:
        return out, None, stats
    timer = vm.time_evaluator(entry, dev, number=max(1, repeat), repeat=3)
    ms = float(np.min(timer(*args).results)) * 1e3
    return out, ms, stats


def build_reference(call: ModelCall, repeat: int, baseline: str, timed: bool = True, builds: dict | None = None):
    """TVM's build of the untouched model of ``call``, run (twice: it must agree with itself)
    and timed (untimed: built as `reference_target` says, its outputs the same). A failure
    here is TVM's own, before any offload: `ModelError`, with its last line."""

    if not timed and is_host_target(call.target):  # only its outputs are used: built quickly
        call = replace(call, target=reference_target(call.target))
    try:
        return build_and_time(call.on(baseline_module(call.mod, call.target, baseline)), repeat,
                              twice=True, timed=timed, builds=builds)
    except TirbyocError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM raises many types; say whose failure it is
        raise ModelError(f"TVM could not build or run the model itself (not the offload): "
                         f"{type(err).__name__}: {last_line(err)}") from err


UNSTABLE = ("TVM's build of the untouched model gives different outputs on the same inputs "
            "(does it read outside its inputs' valid domain?); give inputs with --inputs")


def compare(new_out: np.ndarray, ref_out: np.ndarray, rounding: str | None = None):
    """The outputs compared (`tirbyoc.offloading.verification.Comparison`): relative to the reference's
    scale; ``passed`` None where the reference is degenerate. ``rounding``: the narrowest
    dtype the model rounds its activations to between layers, when narrower than its output
    (bfloat16 under ``--precision bf16``): float32 sums in another order land a value on the
    other side of a bfloat16 rounding now and then, one bfloat16 step apart, so the whole
    model is compared at that dtype's tolerance (each offloaded function alone was verified
    at float32's)."""

    return compare_arrays(ref_out, new_out, rounding)


@dataclass
class OffloadRun:
    """`run_offloaded`'s findings: the per-PrimFunc report; the outputs compared (None when
    not run: ``missing`` says why); latency; simulator statistics per template; the output;
    what the emulator ran, when the offloaded code ran in one."""

    report: object
    comparison: object = None
    ms: float | None = None
    simulation: dict = dataclass_field(default_factory=dict)
    missing: list = dataclass_field(default_factory=list)
    output: np.ndarray | None = None
    emulated: EmulatedRuns | None = None
    module: object = None  # the offloaded module as built (None when it was not)


def run_offloaded(call: ModelCall, tmpls, ref_out, opts: RunOptions = RunOptions(), *, progress=None,
                  tuned=None, builds: dict | None = None, rounding: str | None = None) -> OffloadRun:
    """Offload ``call``'s module (legalized) to ``tmpls`` (``tuned``: schedules to prefer, see
    `offload`), build it for ``call.target`` (the templates' checked target), run once
    (simulators measuring that run), time (``opts.repeat``), compare with ``ref_out``. Code for
    an emulated target (Hexagon) runs PrimFunc by PrimFunc under the emulator, the rest of the
    model here, untimed. ``opts.profile``: also time each offloaded PrimFunc alone
    (`tirbyoc.app.running.profiling`). ``rounding``: as `compare`'s."""
    mod, target = call.mod, call.target
    offloaded, report = offload_module(mod, tmpls, progress=progress, tuned=tuned)
    offloaded, packed = pack_constant_weights(offloaded)
    report.packed = packed
    missing = [f"template {t.name} cannot run here: {t.unavailable_reason()}" for t in tmpls
               if not t.runs_here()]
    if missing or ref_out is None:
        return OffloadRun(report, missing=missing)
    if not any(f.offloaded for f in report.functions):
        return OffloadRun(report, missing=["nothing was offloaded: the offloaded build would be "
                                           "TVM's build again, so it was not built"])
    offloaded, report.rest = schedule_rest_of(offloaded, model_target(target))
    emulated = None
    if device_of(check_target(target)).emulated:
        capacities = {s.name: s.capacity for t in tmpls for s in t.scopes if s.capacity}
        offloaded, emulated = emulate_offloaded(offloaded, [f.name for f in report.functions
                                                            if f.offloaded and not f.extern],
                                                check_target(target), capacities)
    sims = {t.name: t.simulator for t in tmpls if t.simulator is not None}
    timed = emulated is None and not any(t.emulates for t in tmpls)  # else not the hardware's times
    new_out, ms, stats = build_and_time(call.offloaded(offloaded), opts.repeat, list(sims.values()), timed=timed,
                                        builds=builds)
    if opts.profile and timed:
        profile_functions(mod, offloaded, report, target, opts.repeat, progress=progress,
                          sizes=size_bindings(opts.sizes)[0])
    return OffloadRun(report, compare(new_out, ref_out, rounding), ms, dict(zip(sims, stats)), missing,
                      new_out, emulated, offloaded)


def templates_and_target(templates, target, model: str | None = None, precision: str | None = None):
    """The templates (default: `default_templates` for ``model`` at ``precision``) and the
    completed, checked target (default: the first template's) they run on."""
    tmpls = [as_template(t) for t in (list(templates) if templates else default_templates(model, precision))]
    tgt = check_target(run_target(tmpls[0], target))
    check_templates_on_target(tmpls, tgt)
    return tmpls, tgt


def _references(model, mod, untouched: ModelCall, opts: RunOptions, quantized: QuantizedReport,
                builds: dict | None = None, bf16: Bf16Report | None = None):
    """(the output the offloaded model must give, latencies). The baseline is TVM's build of
    the model as given (``untouched``), timed where ``opts.time_baseline`` says
    (``opts.repeat`` runs of ``opts.baseline``'s build). For a QDQ model made integer, the offload is checked against TVM's build of the
    integer model (exact), and the integer model against the float QDQ
    graph, in output quantization steps (``quantized.float_max_abs_diff``, ``.step``):
    integers are exact where the float graph rounds its sums, so a value on a rounding
    boundary can land one step apart. A model converted to bfloat16 (``bf16``) likewise: the
    offload is checked against TVM's build of the bfloat16 model, which is measured against
    the float32 model as given (`Bf16Report.measure`)."""
    out, ms, _ = build_reference(untouched, opts.repeat, opts.baseline, opts.time_baseline, builds)
    latency = {"baseline": ms} if ms is not None else {}
    if quantized.integer and out is not None:
        integer_out, _, _ = build_reference(untouched.on(mod), opts.repeat, opts.baseline, timed=False,
                                            builds=builds)
        if integer_out is not None:
            quantized.float_max_abs_diff = float(np.abs(integer_out.astype(np.float64) - out).max(initial=0.0))
            if quantized.step is None and str(model or "").endswith(".onnx"):
                quantized.step = output_step(model)
        out = integer_out
    if bf16 is not None and bf16.converted and out is not None:
        bf16_out, _, _ = build_reference(untouched.on(mod), opts.repeat, opts.baseline, timed=False,
                                         builds=builds)
        if bf16_out is not None:
            bf16.measure(bf16_out, out)
        out = bf16_out
    return out, latency


def _at_sizes(model, prepared: LegalizedModel, untouched: ModelCall, opts, done, runs, builds,
              first) -> list[SizeRun]:
    """The model at each binding of its sizes (`tirbyoc.app.model_in.sizes`), both builds made once and
    run again with inputs of those sizes (``untouched``: the model as given, called with the
    first binding's inputs; its baseline timed where ``opts.time_baseline`` says, as at the
    first binding); ``first``: the first binding's (comparison, latency). A model converted to
    bfloat16 (``prepared.bf16``) is checked at each size against TVM's build of the bfloat16
    model, as at the first."""
    mod, quantized, bf16 = prepared.mod, prepared.quantized, prepared.bf16
    out = []
    for i, binding in enumerate(runs):
        comparison, latency = first
        if i:
            call = untouched.with_arrays(model_inputs(mod, untouched.entry, opts.seed, opts.inputs, binding))
            ref_out, latency = _references(model, mod, call, opts, quantized, builds,
                                           replace(bf16) if bf16 is not None else None)  # the run's own stays
            comparison = None
            if done.module is not None and ref_out is not None:
                new_out, ms, _ = build_and_time(call.on(done.module), opts.repeat, timed=done.ms is not None,
                                                builds=builds)
                comparison = compare(new_out, ref_out, bf16.rounding if bf16 is not None else None)
                latency.update({"offloaded": ms} if ms is not None else {})
        offloaded, total = coverage_at(mod, done.report, binding)
        out.append(SizeRun(binding, offloaded, total, None if comparison is None else comparison.passed,
                           float("nan") if comparison is None else comparison.abs_err, latency))
    return out


def _check_options(reference: str | None, model: str | None, precision: str | None = None) -> None:
    """Refuse, before any work, a precision tirbyoc has no conversion to, or a reference that
    cannot run on ``model``."""
    if precision not in (None,) + PRECISIONS:
        raise TirbyocError(f"precision {precision!r}: the one conversion is {', '.join(PRECISIONS)} "
                           "(leave it out to run the model in its own precision)")
    if reference not in (None, "onnxruntime"):
        raise TirbyocError(f"reference {reference!r}: the one independent reference is onnxruntime")
    if reference is not None and not str(model or "").endswith(".onnx"):
        raise TirbyocError(f"--reference onnxruntime runs ONNX files; {model or 'the built-in model'} "
                           "is not one")


def run_model(model: str | None = None, templates: list | None = None, options: RunOptions | None = None, *,
              progress: Progress | None = None, **changes) -> RunResult:
    """Offload ``model`` (a file, ``builtin:NAME``, None: the built-in one) to ``templates``
    (names or Template objects, a template factory's variants too), build and run it beside
    TVM's build of the untouched model, and compare: how is `RunOptions` (``options``, or its
    fields as keywords: ``repeat=1``)."""
    opts = options_of(options, changes, "run_model")
    given = opts.sizes
    opts = replace(opts, sizes=sizes_to_run(model, given, opts.input_shapes))
    origin = size_origin(model, given, opts.sizes)
    _check_options(opts.reference, model, opts.precision)
    tuned = tuned_schedules(opts.database) if opts.database is not None else None
    progress = progress or Progress(enabled=False)
    tmpls, tgt = templates_and_target(templates, opts.target, model, opts.precision)
    names, seconds = [t.name for t in tmpls], {}
    t0 = time.perf_counter()
    progress.phase(importing(model))
    runs, builds = size_bindings(opts.sizes), {}
    prepared = legalized_model(model, tmpls, opts, constant_weights=True, as_given=True)
    spec, mod, entry, arrays = prepared.spec, prepared.mod, prepared.entry, prepared.arrays
    quantized, fast, layout, bf16 = prepared.quantized, prepared.fast_math, prepared.layout, prepared.bf16
    seconds["import"] = time.perf_counter() - t0
    untouched = ModelCall(prepared.as_given, model_target(tgt), entry, arrays)
    ref_out, latency = None, {}
    # an emulator's time is not the device's
    opts = replace(opts, time_baseline=opts.time_baseline and not device_of(tgt).emulated)
    if all(t.runs_here() for t in tmpls):
        t0 = time.perf_counter()
        progress.phase("building and running TVM's build of the untouched model")
        ref_out, latency = _references(model, mod, untouched, opts, quantized, builds, bf16)
        seconds["baseline"] = time.perf_counter() - t0
    unstable = "baseline" in seconds and ref_out is None
    t0 = time.perf_counter()
    progress.phase(f"offloading to {', '.join(names)}, building and running")
    done = run_offloaded(ModelCall(mod, tgt, entry, arrays), tmpls, ref_out, opts, progress=progress.step,
                         tuned=tuned, builds=builds, rounding=bf16.rounding if bf16 is not None else None)
    comparison, missing = done.comparison, done.missing + ([UNSTABLE] if unstable else [])
    if done.ms is not None:
        latency["offloaded"] = done.ms
    seconds["offload_build_run"] = time.perf_counter() - t0  # with --profile, its timings too
    ref = None
    if opts.reference == "onnxruntime" and done.output is not None:
        progress.phase("running the model in ONNX Runtime")
        ref = onnxruntime_reference(model, arrays, done.output, opts.repeat)
    sized = None
    if opts.sizes:
        progress.phase(f"running both builds at {len(runs)} sizes")
        sized = _at_sizes(model, prepared, untouched, opts, done, runs, builds, (comparison, dict(latency)))
    target_json = json.loads(str(model_target(tgt)))  # the target both builds really used
    return RunResult(model=spec, templates=names, target=target_json, report=done.report,
                     verified=None if comparison is None else comparison.passed,
                     max_abs_err=float("nan") if comparison is None else comparison.abs_err,
                     latency_ms=latency, seconds=seconds, not_run="; ".join(missing) or None,
                     simulation=done.simulation, comparison=comparison, baseline=opts.baseline,
                     quantized=quantized if quantized.integer or quantized.kept else None, reference=ref,
                     emulated=done.emulated, fast_math=fast, bf16=bf16, tables=prepared.tables,
                     emulates={t.name: t.emulates for t in tmpls if t.emulates},
                     layout=layout if layout.convolutions else None, sizes=sized, size_origin=origin,
                     transposed=prepared.transposed if prepared.transposed and prepared.transposed.rewritten else None)


__all__ = ["BASELINES", "OffloadRun", "Progress", "RunResult", "baseline_module", "check_target", "compare",
           "run_model", "run_offloaded"]
