"""`tirbyoc build`: an offloaded model as one shared library that a process with TVM alone
loads (``tvm.runtime.load_module``) and runs (``relax.VirtualMachine``).

What `tirbyoc run` keeps in its own process has to travel inside the artifact:

* weights are bound as constants, so the library's entry function takes only the model's
  inputs (``num_input`` of a ``relax.frontend.nn`` export; an ONNX or PyTorch import has its
  weights bound already);
* the C code of every extern library the offloaded functions call is compiled to objects and
  linked in: shims called through ``T.call_extern`` resolve at link time, and the packed
  functions of TVM FFI libraries (``R.call_dps_packed`` kernels, the accelerator simulator)
  register under their global names when the library loads (a generated constructor), which is
  where the Relax VM looks them up;
* a simulated template's simulator is compiled with that template's configuration;
* shared libraries those objects link (OpenBLAS) are copied beside the artifact, which finds
  them through ``$ORIGIN``.

A manifest (``PATH.json``) says what the library takes and gives and how it was made;
`tirbyoc.app.building.runner` reads it. For a Hexagon target the library is Hexagon code for TVM's
Hexagon runtime, linked or as objects with its link command (`tirbyoc.app.building.deploy_hexagon`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from typing import Callable
from pathlib import Path

import numpy as np

from tirbyoc._tvm import PrimCall, StringImm, make_target, relax, tirx, tvm, tvm_ffi
from tirbyoc.app.building.deploy_hexagon import FORMATS as HEXAGON_FORMATS
from tirbyoc.app.building.deploy_hexagon import HexagonArtifact, check_deployable, export_hexagon
from tirbyoc.app.model_in.frontends import sizes_to_run
from tirbyoc.app.jsonout import dumps
from tirbyoc.app.model_in.legalize import importing, legalized_model
from tirbyoc.app.running.model_call import ModelCall
from tirbyoc.app.options import RunOptions, options_of
from tirbyoc.app.model_in.sizes import SizeRun, coverage_at
from tirbyoc.app.model_in.sizes import bindings as size_bindings
from tirbyoc.app.running.run import Progress, build_and_time, templates_and_target
from tirbyoc.decl.extern import ExternLibrary, c_compiler
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.devices import CPU, device_of
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.relax.bridge import offload_module
from tirbyoc.relax.bf16 import Bf16Report
from tirbyoc.relax.fast_math import FastMathReport
from tirbyoc.relax.prepack import pack_constant_weights
from tirbyoc.relax.rest import schedule_rest_of
from tirbyoc.sim import LIBRARY as SIM_LIBRARY
from tirbyoc.tuning.apply import tuned_schedules


@dataclass
class Built:
    """A deployed library and what it was made from."""

    path: Path
    shipped: list[Path]  # shared libraries copied beside it
    model: str
    templates: list[str]
    target: dict
    entry: str
    inputs: list[dict]  # name, shape, dtype of each parameter of the entry function
    report: object  # OffloadReport
    linked: list[str]  # extern libraries linked in
    output: np.ndarray | None = field(default=None, repr=False)  # on the seeded inputs, if run
    sample_inputs: list = field(default_factory=list, repr=False)
    cross: HexagonArtifact | None = None  # for a Hexagon target: what was written, how to link
    fast_math: FastMathReport | None = None  # --fast-math: what the library approximates
    bf16: Bf16Report | None = None  # --precision bf16: the layers that read bfloat16
    emulates: dict = field(default_factory=dict)  # template -> the instruction its code emulates
    sized: object = None  # a model of named sizes: its MACs at the sample inputs' sizes (SizeRun)

    @property
    def kind(self) -> str:
        return self.cross.kind if self.cross is not None else "shared library for this CPU"

    def to_json(self) -> dict:
        cross = self.cross
        return {"path": str(self.path), "kind": self.kind, "runs_here": cross is None,
                "link": cross.link if cross else None, "undefined": cross.undefined if cross else None,
                "shipped": [str(p) for p in self.shipped], "model": self.model,
                "templates": self.templates, "target": self.target, "entry": self.entry,
                "inputs": self.inputs, "linked": self.linked,
                "offloaded_macs": self.report.offloaded_macs, "macs": self.report.total_macs,
                "functions": [f.to_json() for f in self.report.functions],
                "fast_math": self.fast_math.to_json() if self.fast_math is not None else None,
                "precision": "bf16" if self.bf16 is not None else None,
                "bf16": self.bf16.to_json() if self.bf16 is not None else None,
                "emulates": self.emulates, "sized": self.sized.to_json() if self.sized is not None else None}


def _templates_libraries(tmpls) -> tuple[dict, dict]:
    """(packed symbol -> its FFI library, built shared-object path -> plain C library) of the
    templates' extern code."""
    packed, plain = {}, {}
    for t in tmpls:
        for lib in t.libraries:
            plain[str(lib.path)] = lib
        for g in t.groups:
            if g.packed is not None:
                packed[g.packed.symbol] = g.packed.library
    return packed, plain


def called_symbols(mod) -> set[str]:
    """The packed functions ``mod`` calls by name: ``call_packed`` in its PrimFuncs and
    ``call_dps_packed`` of an extern function in its Relax functions (read from the IR, not
    from its printed text, where a name in a string or comment would count)."""
    names: set[str] = set()

    def tir_call(call):
        if str(getattr(call.op, "name", "")) in ("tirx.tvm_call_packed", "tirx.tvm_call_packed_lowered") \
                and call.args and isinstance(call.args[0], StringImm):
            names.add(str(call.args[0].value))

    def extern(func):
        names.add(str(func.global_symbol))

    tvm_ffi.structural_walk(mod, [(PrimCall, tir_call), (relax.ExternFunc, extern)], order="pre")
    return names


def needed_libraries(mod, tmpls) -> list[tuple[ExternLibrary, list[str]]]:
    """(library, extra -D flags) for every extern library the offloaded ``mod`` calls."""
    packed, plain = _templates_libraries(tmpls)
    out: dict[str, tuple] = {}
    called = called_symbols(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and "tirbyoc.libraries" in func.attrs:
            for path in func.attrs["tirbyoc.libraries"]:
                lib = plain.get(str(path))
                if lib is None:
                    raise TirbyocError(f"PrimFunc {gv.name_hint} calls {path}, which none of the "
                                       "templates declares; it cannot be linked into the library")
                out.setdefault(lib.name, (lib, []))
    for symbol, lib in packed.items():
        if symbol in called:
            out.setdefault(lib.name, (lib, []))
    for t in tmpls:
        sim = t.simulator
        if sim is not None and any(name.startswith("tirbyoc.sim.") for name in called):
            out[SIM_LIBRARY.name] = (SIM_LIBRARY, sim.deploy_defines())
    return list(out.values())


def _registration_source(libs: list[ExternLibrary]) -> str:
    """C code whose constructor registers every packed function of ``libs`` under its global
    name when the library loads (where the Relax VM and ``call_packed`` look them up)."""
    pairs = [(name, symbol) for lib in libs for name, symbol in lib.global_names().items()]
    decls = "".join(f"int __tvm_ffi_{s}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);\n"
                    for s in dict.fromkeys(s for _, s in pairs))
    body = "".join(
        f'  {{ TVMFFIByteArray n = {{"{name}", {len(name)}}};\n'
        f"    if (TVMFFIFunctionCreate(NULL, __tvm_ffi_{symbol}, NULL, &f) == 0) {{\n"
        f"      TVMFFIFunctionSetGlobal(&n, f, 1); TVMFFIObjectDecRef(f); }} }}\n"
        for name, symbol in pairs)
    return ("#include <tvm/ffi/c_api.h>\n" + decls +
            "__attribute__((constructor)) static void tirbyoc_register_packed(void) {\n"
            "  TVMFFIObjectHandle f;\n" + body + "}\n")


def link_inputs(libs, workdir: Path, out_dir: Path) -> tuple[list[str], list[str], list[Path]]:
    """(objects, linker options, shared libraries copied into ``out_dir``) that put ``libs``
    inside a deployed library."""
    objects, options, shipped = [], [], []
    ffi_libs = [lib for lib, _ in libs if lib.ffi]
    # (source, defines): a C file two libraries share (blas's shim, in its GEMM library and in
    # its whole-call kernels) is linked once, not twice with the same symbols
    compiled = set()
    for lib, defines in libs:
        keys = {s: (Path(s).resolve(), tuple(defines)) for s in lib.sources}
        fresh = [s for s in lib.sources if keys[s] not in compiled]
        compiled |= {keys[s] for s in fresh}
        objects += [str(o) for o in lib.objects(workdir, defines, fresh)]
        for dep in lib.dependencies():
            target = out_dir / dep.name
            if not target.exists() or target.stat().st_size != dep.stat().st_size:
                shutil.copy2(dep, target)
            if target not in shipped:
                shipped.append(target)
            options += [f"-L{out_dir}", f"-l:{dep.name}"]
    if ffi_libs:
        reg = workdir / "tirbyoc_register.c"
        reg.write_text(_registration_source(ffi_libs))
        obj = workdir / "tirbyoc_register.o"
        flags = ffi_libs[0].compile_options()
        run = subprocess.run([c_compiler(), "-c", str(reg), "-o", str(obj), *flags],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise TirbyocError(f"compiling the packed-function registration failed: {run.stderr.strip()}")
        objects.append(str(obj))
    if shipped:
        options = ["-Wl,--no-as-needed", *dict.fromkeys(options), "-Wl,-rpath,$ORIGIN"]
    return objects, options, shipped


def _without_tirbyoc_modules(mod, libs):
    """``mod`` without the loaded FFI libraries tirbyoc attached as ``external_mods`` (they are
    linked in instead); any other loaded library is an error that says what to do."""
    attached = list((mod.attrs or {}).get("external_mods", []))
    if not attached:
        return mod
    foreign = [m for m in attached if not any(m.implements_function(s) for lib, _ in libs if lib.ffi
                                               for s in lib.symbols)]
    if foreign:
        raise TirbyocError(
            f"the module carries {len(foreign)} external module(s) that are loaded shared libraries "
            "tirbyoc did not make; TVM cannot save a loaded library into another. Link its C code "
            "into the export instead (declare it as a tirbyoc ExternLibrary, or pass the object files "
            "to export_library(addons=[...]))")
    return mod.without_attr("external_mods")


def export_module(mod, templates, output, target=None) -> tuple[list[Path], list[str]]:
    """Compile ``mod`` (a Relax module `OffloadTIR` or `offload_module` offloaded to
    ``templates``) for ``target`` (default: the first template's) and export it as the shared
    library ``output``, its extern code linked in (``exe.export_library`` of such a module
    fails: it cannot save the libraries loaded into this process). Returns (the shared
    libraries copied beside it, the extern libraries linked in)."""
    tmpls, tgt = templates_and_target(templates, target)
    _cpu_only(tgt)
    output = Path(output)
    libs = needed_libraries(mod, tmpls)
    exe = tvm.compile(_without_tirbyoc_modules(mod, libs), target=tgt, tir_pipeline=PIPELINE)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tirbyoc-build-") as work:
        objects, options, shipped = link_inputs(libs, Path(work), output.parent.resolve())
        exe.export_library(str(output), addons=objects, options=options)
    return shipped, [lib.name for lib, _ in libs]


def _cpu_only(target) -> None:
    """Refuse, before any work, a target whose code this machine's linker cannot link into a
    library it loads: another kind, or an ``llvm`` target for another architecture (Hexagon,
    which `build_library` writes with `tirbyoc.app.building.deploy_hexagon` instead)."""
    if device_of(target) is not CPU:
        kind = str(target.kind.name)
        what = f"{kind} with mtriple={target.attrs.get('mtriple')}" if kind == "llvm" else kind
        raise TirbyocError(f"target {what}: export_module links libraries for this CPU (kind llvm, "
                           "no foreign mtriple); tirbyoc build writes Hexagon libraries (PATH.so or "
                           "PATH.tar), and not yet CUDA ones")


@dataclass(frozen=True)
class Exporter:
    """How `build_library` writes one device's library: the file suffixes it takes (suffix ->
    what the file is) and ``export(offloaded, templates, target, output)`` -> (a cross-built
    artifact or None, the shared libraries shipped beside it, the extern libraries linked in)."""

    suffixes: dict
    export: Callable


def _export_cpu(offloaded, tmpls, tgt, output):
    shipped, libs = export_module(offloaded, tmpls, output, tgt)
    return None, shipped, libs


def _export_hexagon(offloaded, tmpls, tgt, output):
    check_deployable(offloaded, [lib.name for lib, _ in needed_libraries(offloaded, tmpls)])
    return export_hexagon(offloaded, tgt, output), [], []


# device name (`tirbyoc.offloading.devices`) -> how tirbyoc build writes its library; a device
# without a row has none written yet (CUDA)
EXPORTERS = {"cpu": Exporter({".so": "shared object"}, _export_cpu),
             "hexagon": Exporter(HEXAGON_FORMATS, _export_hexagon)}


def _exporter(target) -> Exporter:
    """The exporter of ``target``'s device, or (before any work) a usage error."""
    exporter = EXPORTERS.get(device_of(target).name)
    if exporter is None:
        _cpu_only(target)  # says what is written
    return exporter


def _sized(mod, report, binding):
    """The MACs of a model of named sizes at ``binding`` (None without sizes)."""
    if not binding:
        return None
    done, total = coverage_at(mod, report, binding)
    return SizeRun(binding, done, total, None, float("nan"))


def _dim(extent):
    """A manifest's dimension: its size, or the name of a size given at run time ("n")."""
    return str(extent.name) if isinstance(extent, tirx.Var) else int(extent)


def build_library(model: str | None, templates=None, options: RunOptions | None = None, *, output,
                  progress: Progress | None = None, run_check: bool = True, whole_calls: bool = True,
                  **changes) -> Built:
    """Legalize ``model``, bind its weights, offload it (each function verified), compile it
    for the target and export one shared library (see the module's docstring), with its
    manifest beside it; loaded, targeted and tuned as `RunOptions` says (``options``, or its
    fields as keywords; ``fast_math``: as ``tirbyoc run --fast-math`` verifies it).
    ``run_check``: also run the model offloaded the same way in this process, on the seeded
    inputs (``Built.sample_inputs``), and keep its output - what a process that loads the
    artifact must reproduce. ``whole_calls``: as `offload_module`'s (False: library kernels
    are called from inside PrimFuncs, never whole)."""
    opts = options_of(options, changes, "build_library")
    opts = replace(opts, sizes=sizes_to_run(model, opts.sizes, opts.input_shapes))
    progress = progress or Progress(enabled=False)
    output = Path(output)
    if opts.target is not None:
        _exporter(make_target(opts.target))
    tmpls, tgt = templates_and_target(templates, opts.target, model, opts.precision)
    exporter = _exporter(tgt)
    if output.suffix not in exporter.suffixes:
        raise TirbyocError(f"{output}: the library is a shared object; name it "
                           + " or ".join(f"PATH{s}" for s in exporter.suffixes))
    progress.phase(importing(model))
    prepared = legalized_model(model, tmpls, opts, constant_weights=True)
    spec, mod, entry, arrays = prepared.spec, prepared.mod, prepared.entry, prepared.arrays
    fast, bf16 = prepared.fast_math, prepared.bf16
    progress.phase(f"offloading to {', '.join(t.name for t in tmpls)}")
    tuned = tuned_schedules(opts.database) if opts.database is not None else None
    offloaded, report = offload_module(mod, tmpls, progress=progress.step, tuned=tuned,
                                       whole_calls=whole_calls)
    offloaded, _ = pack_constant_weights(offloaded)
    offloaded, _ = schedule_rest_of(offloaded, tgt)
    progress.phase("compiling and linking")
    cross, shipped, libs = exporter.export(offloaded, tmpls, tgt, output)
    params = offloaded[entry].params
    built = Built(path=output, shipped=shipped, model=spec, templates=[t.name for t in tmpls],
                  target=json.loads(str(tgt)), entry=entry,
                  inputs=[{"name": p.name, "shape": [_dim(d) for d in p.ty.shape.values], "dtype": str(p.ty.dtype)}
                          for p in params],
                  report=report, linked=libs, sample_inputs=arrays, cross=cross, fast_math=fast, bf16=bf16,
                  sized=_sized(mod, report, size_bindings(opts.sizes)[0]),
                  emulates={t.name: t.emulates for t in tmpls if t.emulates})
    if run_check and cross is None and all(t.runs_here() for t in tmpls):
        sims = [t.simulator for t in tmpls if t.simulator is not None]
        built.output = build_and_time(ModelCall(offloaded, tgt, entry, arrays), 1, sims, timed=False)[0]
    output.with_suffix(".json").write_text(dumps(built.to_json()) + "\n")
    return built


__all__ = ["Built", "build_library", "called_symbols", "export_module", "link_inputs",
           "needed_libraries"]
