"""The Relax bridge: offload the PrimFuncs a Relax module calls through ``R.call_tir``.

`OffloadTIR` is an IRModule => IRModule pass. Run it after ``LegalizeOps`` (and, if you
like, ``FuseOps`` / ``FuseTIR``): each PrimFunc is matched against the templates in order and
rewritten with `tirbyoc.offload` (so every rewrite is verified where the template runs);
the rewritten PrimFunc replaces the original under the same name, the ``call_tir`` stays.
Where it goes in TVM's CPU pipeline::

    LegalizeOps -> [AnnotateTIROpPattern -> FuseOps -> FuseTIR] -> OffloadTIR -> tvm.compile

For a template that runs epilogues on its accumulator tiles (a `BlockALU`: vta), fuse first:
only then does a core's PrimFunc carry the bias, requantization and ReLU that follow it
(`fuse`, which `tirbyoc run` applies for such a template).

Offloaded PrimFuncs are marked opaque (``op_pattern`` = kOpaque) so a later FuseOps does
not merge them into their neighbours; running the pass again (another template) only
looks at blocks still left.

A PrimFunc that is nothing but one library kernel (a group with a `PackedFunction`, e.g.
blas's whole matmul; see `tirbyoc.offloading.whole_function`) is not tensorized: its ``call_tir`` calls
become ``R.call_dps_packed("<symbol>", inputs, out)``, the PrimFunc is dropped, and the
kernel's library (a TVM runtime module) is appended to the module's ``external_mods``
attribute, which ``tvm.compile`` links so the Relax VM finds the symbol. Such a module runs
in this process; ``export_library`` cannot serialize a loaded shared library.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Sequence

from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from tirbyoc._tvm import const_value, is_buffer, tirx, tvm, with_external_mods
from tirbyoc.decl.registry import as_template
from tirbyoc.ir.pattern import block_macs
from tirbyoc.matching.matcher import match
from tirbyoc.offloading.offloader import offload
from tirbyoc.offloading.whole_function import find_whole_call, verify_whole_call
from tirbyoc.rewrite.cpu.weight_layout import LAYOUT_FREE_ATTR
from tirbyoc.relax.lookups import elementwise_lookups
from tirbyoc.relax.call_sites import call_counts, constant_argument_values, constant_arguments
from tirbyoc.relax.mutation import mutate_functions
from tirbyoc.rewrite.foundation.steps import StepKind

OPAQUE = 8  # relay/relax OpPatternKind::kOpaque
OFFLOADED_ATTR = "tirbyoc.template"  # set on every PrimFunc OffloadTIR rewrote: its template
log = logging.getLogger("tirbyoc.offload")


@dataclass
class FunctionReport:
    """What became of one PrimFunc: its compute blocks, MACs, and the rewrite or reason."""

    name: str
    macs: int  # multiply-accumulates of one call (0 for elementwise work, sums, means)
    offloaded_macs: int
    template: str | None
    intrinsics: tuple[str, ...]
    reason: str | None  # why (some of) it stayed, for functions with MACs
    verified: bool | None
    extern: str | None = None  # the packed function it became (R.call_dps_packed), if any
    calls: int = 1  # call sites in the model (coverage weighs each function by them)
    tuned: bool = False  # its schedule came from a tuning database
    check_note: str | None = None  # why verified is None (not run here, not meaningfully checked)
    ms: dict | None = None  # `tirbyoc run --profile`: ms per call, {"tvm": .., "offloaded": ..}
    epilogue: tuple = ()  # the steps saying where the elementwise work after its cores runs
    offloaded_blocks: tuple[str, ...] = ()  # its multiply-accumulate blocks that were offloaded

    def to_json(self) -> dict:
        return {"name": self.name, "calls": self.calls, "macs": self.macs,
                "offloaded_macs": self.offloaded_macs, "template": self.template,
                "intrinsics": list(self.intrinsics), "extern": self.extern, "reason": self.reason,
                "verified": self.verified, "ms_per_call": self.ms,
                "epilogue": "; ".join(self.epilogue) or None}

    @property
    def offloaded(self) -> bool:
        return bool(self.intrinsics)

    @property
    def total_macs(self) -> int:
        """MACs over all call sites."""
        return self.macs * self.calls

    def kernel(self) -> str:
        """The intrinsics or library kernel it now calls, for a report ("-" if none)."""
        if self.extern:
            return f"{self.extern} (call_dps_packed)"
        names = (name for per_block in self.intrinsics for name in per_block.split(", "))
        return ", ".join(dict.fromkeys(names)) if self.offloaded else "-"

    def note(self) -> str:
        """Why (part of) it stayed, else whether the rewrite was verified."""
        unchecked = self.check_note or "not run here"
        note = self.reason or ("verified" if self.verified else unchecked if self.offloaded else "")
        if self.epilogue:
            where = "; ".join(dict.fromkeys(
                "epilogue on the accumulator tile" if st.kind is StepKind.EPILOGUE else str(st)
                for st in self.epilogue))
            note = f"{note}; {where}" if note else where
        return f"tuned, {note}" if self.tuned and note else note


@dataclass
class OffloadReport:
    """Per-function outcomes of one or more OffloadTIR runs over a module."""

    functions: list[FunctionReport] = field(default_factory=list)
    packed: object = None  # tirbyoc.relax.prepack.PackedWeights, once weights were packed
    rest: object = None  # tirbyoc.relax.rest.RestSchedule, once the functions left were scheduled

    def packed_bytes_per_run(self) -> int:
        """Bytes of weight copies a run of the model no longer makes (each packed function's
        copies once per call site)."""
        if self.packed is None:
            return 0
        calls = {f.name: f.calls for f in self.functions}
        return sum(b * calls.get(name, 1) for name, b in self.packed.bytes_per_call.items())

    def shown(self) -> list[FunctionReport]:
        """The functions a report lists - with MACs (a count, or a reason they stayed: a
        function of symbolic sizes counts none) or offloaded - most MACs first."""
        return sorted((f for f in self.functions if f.macs or f.offloaded or f.reason),
                      key=lambda f: (-f.total_macs, f.name))

    @property
    def others(self) -> int:
        """Functions without multiply-accumulates, left to TVM."""
        return len(self.functions) - len(self.shown())

    @property
    def total_macs(self) -> int:
        return sum(f.total_macs for f in self.functions)

    @property
    def offloaded_macs(self) -> int:
        return sum(f.offloaded_macs * f.calls for f in self.functions)

    @property
    def coverage(self) -> float:
        return self.offloaded_macs / self.total_macs if self.total_macs else 0.0


# the one definition of MACs, shared with the matcher (kept under the name callers know)
mac_blocks = block_macs


def fuse(mod):
    """TVM's operator fusion of a legalized module (``AnnotateTIROpPattern``, ``FuseOps``,
    ``FuseTIR``), as its default pipeline does before building. A byte table's lookup
    (`tirbyoc.relax.byte_tables`) counts as elementwise, so that it joins its producer."""
    mod = elementwise_lookups(relax.transform.AnnotateTIROpPattern()(mod))
    mod = relax.transform.FuseOps()(mod)
    return relax.transform.FuseTIR()(mod)


def with_layout_free(func, constant: set[int]):
    """``func`` marked with the parameters every call site passes as a Relax constant
    (TVM's ``layout_free_buffers``, as ``relax.transform.AttachAttrLayoutFreeBuffers`` sets it,
    without that pass's copy of each function under a new name): the CPU schedule may stage
    such a weight into the layout its core reads best, a copy `PackConstantWeights` then runs
    once (`tirbyoc.rewrite.cpu.weight_layout.tiles_outermost`)."""
    if not constant or (func.attrs is not None and LAYOUT_FREE_ATTR in func.attrs):
        return func
    return func.with_attr(LAYOUT_FREE_ATTR, [tirx.IntImm("int32", i) for i in sorted(constant)])


def _keep_identity(original, rewritten, template: str):
    """The rewritten PrimFunc with the original's attributes (global symbol, op pattern...),
    marked opaque so fusion leaves the offloaded code alone, and marked with the template
    (`OFFLOADED_ATTR`: later passes, `PackConstantWeights`, find offloaded code by it)."""
    func = rewritten
    for key, value in (original.attrs or {}).items():
        if key != "op_pattern":
            func = func.with_attr(key, value)
    # scheduled: a GPU build's default pipeline (dlight) must not schedule it again
    return (func.with_attr("op_pattern", OPAQUE).with_attr(OFFLOADED_ATTR, template)
            .with_attr("tirx.is_scheduled", True))


def _whole_call(func, templates, verify: bool):
    """(WholeCall, template, verified) for the first template whose library kernel computes
    ``func`` whole (and, where it runs here, agrees with TVM's build), else None."""

    for tmpl in templates:
        if not any(g.packed is not None for g in tmpl.groups):
            continue
        try:
            call, _ = find_whole_call(func, match(func, [tmpl]))
        except Exception:  # noqa: BLE001 - not matchable here: the tensorize path reports why
            continue
        if call is None:
            continue
        verified = None
        if verify and tmpl.runs_here():
            tmpl.activate()
            verified = verify_whole_call(func, call).passed
            if not verified:
                continue  # a kernel that disagrees is not used; tensorizing may still work
        return call, tmpl, verified
    return None


def replace_call_tir(mod, gvs, rewrite):
    """``mod`` with every ``R.call_tir(gv, ...)`` of a ``gv`` in ``gvs`` replaced by
    ``rewrite(call)`` (None keeps the call), and the PrimFuncs of ``gvs`` that no Relax
    function calls any more dropped."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @mutator
    class _Rewriter(PyExprMutator):
        def visit_call_(self, op):
            op = super().visit_call_(op)
            if op.op.same_as(call_tir) and op.args[0] in gvs:
                new = rewrite(op)
                if new is not None:
                    return new
            return op

    new = mutate_functions(mod, _Rewriter(mod))
    called = [v for f in new.functions.values() if isinstance(f, relax.Function)
              for v in relax.analysis.all_global_vars(f)]
    dropped = [gv for gv in gvs if not any(v.same_as(gv) for v in called)]
    return tvm.IRModule({g: f for g, f in new.functions.items() if not any(g.same_as(d) for d in dropped)},
                        attrs=new.attrs)


def _call_packed_instead(mod, calls: dict):
    """Every ``R.call_tir(gv, args, out)`` with ``gv`` in ``calls`` rewritten to
    ``R.call_dps_packed(symbol, kernel inputs, out)``; the PrimFuncs dropped, the kernels'
    libraries appended to ``external_mods``."""

    def to_packed(op):
        wc = calls[op.args[0]]
        args = list(op.args[1].fields) if len(op.args) == 2 else []
        if len(op.args) != 2 or len(op.ty_args) != 1 or wc.output != len(args):
            return None
        return relax.call_dps_packed(relax.ExternFunc(wc.symbol), relax.Tuple([args[i] for i in wc.inputs]),
                                     op.ty_args[0])

    new = replace_call_tir(mod, calls, to_packed)
    return with_external_mods(new, [lib.runtime_module() for lib in
                                    dict.fromkeys(wc.packed.library for wc in calls.values())])


def _check_inputs(func, constants: dict) -> dict | None:
    """The call site's constants (`constant_argument_values`) by the buffer name of the
    parameter each is passed to: what the function's check runs on in place of drawn data."""
    names = [str(p.name) if is_buffer(p) else None for p in func.params]
    return {names[i]: const_value(c) for i, c in constants.items() if i < len(names) and names[i]} or None


def _offload_function(name: str, func, templates, policy, verify: tuple, tuned):
    """(the function offloaded block by block, template after template; its report).
    ``verify``: (whether to check each offload, the inputs it runs on where given)."""
    verify, inputs = verify
    current, intrinsics, used, reasons, verified, was_tuned = func, [], None, [], None, False
    check_note, epilogue, blocks_done = None, [], []
    reductions = mac_blocks(func)
    total, done = sum(reductions.values()), 0
    for tmpl in templates:
        try:
            out = offload(current, tmpl, policy, verify=verify, tuned=tuned, inputs=inputs)
        except Exception as err:  # noqa: BLE001 - one function must not stop the model
            reasons.append(f"{tmpl.name}: {type(err).__name__}: {err}")
            continue
        if out.offloaded:
            current, used = out.func, tmpl.name
            intrinsics += [b.intrinsic for b in out.offloaded]
            done += sum(reductions.get(b.block, 0) for b in out.offloaded)
            blocks_done += [b.block for b in out.offloaded if b.block in reductions]
            v = out.verification
            verified = None if v is None else v.passed
            check_note = v.describe() if v is not None and v.passed is None else None
            was_tuned = was_tuned or any(b.steps and b.steps[0].kind is StepKind.TUNED for b in out.offloaded)
            epilogue += [st for b in out.offloaded if b.block in reductions for st in b.steps
                         if getattr(st, "kind", None) in (StepKind.EPILOGUE, StepKind.EPILOGUE_LEFT, StepKind.WINOGRAD)]
        reasons += [f"{b.block}: {b.reason}" for b in out.blocks
                    if not b.offloaded and b.block in reductions]
    log.debug("%s: %s", name, f"offloaded to {used} ({', '.join(dict.fromkeys(intrinsics))}), "
              f"{done:,} of {total:,} MACs" if intrinsics else
              f"kept ({'; '.join(dict.fromkeys(reasons)) or 'no multiply-accumulates'})")
    return current, FunctionReport(
        name, total, done, used, tuple(intrinsics),
        None if set(blocks_done) >= set(reductions) else "; ".join(dict.fromkeys(reasons)) or None,
        verified, tuned=was_tuned, check_note=check_note,
        epilogue=tuple(dict.fromkeys(epilogue)), offloaded_blocks=tuple(dict.fromkeys(blocks_done)))


def offload_module(mod, templates: Sequence, *, policy="first", verify: bool = True,
                   report: OffloadReport | None = None, progress=None, whole_calls: bool = True,
                   tuned=None):
    """``mod`` with every PrimFunc offloaded where a template can; returns (mod, report).

    ``templates``: Template objects or names, tried in order for the blocks still left.
    ``progress``: optional callable ``(done, total, name)`` called per PrimFunc.
    ``whole_calls``: call a library kernel through ``R.call_dps_packed`` where a PrimFunc is
    nothing but that kernel (False: always tensorize inside the PrimFunc).
    ``tuned``: tuned schedules to prefer (`tirbyoc.tuning.tuned_schedules`; see `offload`).
    """

    templates = [as_template(t) for t in templates]
    report = report if report is not None else OffloadReport()
    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    counts, values = call_counts(mod), constant_argument_values(mod)  # values: at constant_arguments' positions
    updates, whole = {}, {}
    for n, (gv, func) in enumerate(sorted(funcs, key=lambda p: p[0].name_hint)):
        name = gv.name_hint
        if progress is not None:
            progress(n, len(funcs), name)
        packed = _whole_call(func, templates, verify) if whole_calls else None
        if packed is not None:
            wc, tmpl, verified = packed
            macs = sum(mac_blocks(func).values())
            whole[gv] = wc
            log.debug("%s: the library kernel %s, called whole (call_dps_packed)", name, wc.symbol)
            report.functions.append(FunctionReport(name, macs, macs, tmpl.name, (wc.symbol,),
                                                   None, verified, extern=wc.symbol,
                                                   calls=counts.get(name, 1),
                                                   offloaded_blocks=tuple(mac_blocks(func))))
            continue
        # a tuning database holds the functions as they were tuned, without the mark
        marked = with_layout_free(func, set(values.get(name, {}))) if tuned is None else func
        inputs = _check_inputs(func, values.get(name, {})) if verify else None
        current, function_report = _offload_function(name, marked, templates, policy, (verify, inputs), tuned)
        function_report = replace(function_report, calls=counts.get(name, 1))
        if function_report.intrinsics:
            updates[gv] = _keep_identity(func, current, function_report.template)
        report.functions.append(function_report)
    if progress is not None:
        progress(len(funcs), len(funcs), "")
    if updates:
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in updates.items():
            mod[gv] = func
    if whole:
        mod = _call_packed_instead(mod, whole)
    return mod, report


def OffloadTIR(templates: Sequence, *, policy="first", verify: bool = True,
               report: OffloadReport | None = None, whole_calls: bool = True, tuned=None):
    """The pass form of `offload_module`: ``OffloadTIR(["x86_vnni"])(mod)``. Pass a
    `OffloadReport` to collect what happened to each PrimFunc."""

    report = report if report is not None else OffloadReport()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.OffloadTIR")
    def _pass(mod, _ctx):
        new, _ = offload_module(mod, templates, policy=policy, verify=verify, report=report,
                                whole_calls=whole_calls, tuned=tuned)
        return new

    _pass.report = report
    return _pass


__all__ = ["OFFLOADED_ATTR", "FunctionReport", "OffloadReport", "OffloadTIR", "call_counts", "constant_arguments", "fuse",
           "offload_module", "with_layout_free",
           "replace_call_tir"]
