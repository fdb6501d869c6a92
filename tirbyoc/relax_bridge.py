"""The Relax bridge: offload the PrimFuncs a Relax module calls through ``R.call_tir``.

`OffloadTIR` is an IRModule => IRModule pass. Run it after ``LegalizeOps`` (and, if you
like, ``FuseOps`` / ``FuseTIR``): each PrimFunc is matched against the templates in order and
rewritten with `tirbyoc.offload` (so every rewrite is verified where the template runs);
the rewritten PrimFunc replaces the original under the same name, the ``call_tir`` stays.
Where it goes in TVM's CPU pipeline::

    LegalizeOps -> [AnnotateTIROpPattern -> FuseOps -> FuseTIR] -> OffloadTIR -> tvm.compile

Offloaded PrimFuncs are marked opaque (``op_pattern`` = kOpaque) so a later FuseOps does
not merge them into their neighbours; running the pass again (another template) only
looks at blocks still left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .offloading import Offloaded, offload

OPAQUE = 8  # relay/relax OpPatternKind::kOpaque


@dataclass
class FunctionReport:
    """What became of one PrimFunc: its compute blocks, MACs, and the rewrite or reason."""

    name: str
    macs: int  # multiply-accumulates of its reduction blocks (0 for elementwise work)
    offloaded_macs: int
    template: str | None
    intrinsics: tuple[str, ...]
    reason: str | None  # why (some of) it stayed, for functions with MACs
    verified: bool | None

    @property
    def offloaded(self) -> bool:
        return bool(self.intrinsics)


@dataclass
class OffloadReport:
    """Per-function outcomes of one or more OffloadTIR runs over a module."""

    functions: list[FunctionReport] = field(default_factory=list)

    @property
    def total_macs(self) -> int:
        return sum(f.macs for f in self.functions)

    @property
    def offloaded_macs(self) -> int:
        return sum(f.offloaded_macs for f in self.functions)

    @property
    def coverage(self) -> float:
        return self.offloaded_macs / self.total_macs if self.total_macs else 0.0


def _reduction_blocks(func) -> set[str]:
    from .pattern import function_blocks

    return {p.name for p in function_blocks(func) if p.is_reduction}


def _macs(out: Offloaded, reductions: set[str]) -> tuple[int, int]:
    """(MACs of the function's reduction blocks, of those offloaded)."""
    compute = [b for b in out.blocks if b.block in reductions]
    return sum(b.macs or 0 for b in compute), sum(b.macs or 0 for b in compute if b.offloaded)


def _keep_identity(original, rewritten):
    """The rewritten PrimFunc with the original's attributes (global symbol, op pattern...),
    marked opaque so fusion leaves the offloaded code alone."""
    func = rewritten
    for key, value in (original.attrs or {}).items():
        if key != "op_pattern":
            func = func.with_attr(key, value)
    return func.with_attr("op_pattern", OPAQUE)


def offload_module(mod, templates: Sequence, *, policy="first", verify: bool = True,
                   report: OffloadReport | None = None, progress=None):
    """``mod`` with every PrimFunc offloaded where a template can; returns (mod, report).

    ``templates``: Template objects or names, tried in order for the blocks still left.
    ``progress``: optional callable ``(done, total, name)`` called per PrimFunc.
    """
    from ._tvm import tirx, tvm
    from .registry import get_template

    templates = [get_template(t) if isinstance(t, str) else t for t in templates]
    report = report if report is not None else OffloadReport()
    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    updates = {}
    for n, (gv, func) in enumerate(sorted(funcs, key=lambda p: p[0].name_hint)):
        name = gv.name_hint
        if progress is not None:
            progress(n, len(funcs), name)
        current, intrinsics, used, reasons, verified = func, [], None, [], None
        total = done = 0
        reductions = _reduction_blocks(func)
        for tmpl in templates:
            try:
                out = offload(current, tmpl, policy, verify=verify)
            except Exception as err:  # noqa: BLE001 - one function must not stop the model
                reasons.append(f"{tmpl.name}: {type(err).__name__}: {err}")
                continue
            t, d = _macs(out, reductions)
            total = max(total, t)
            if out.offloaded:
                current, used = out.func, tmpl.name
                intrinsics += [b.intrinsic for b in out.offloaded]
                done += d
                v = out.verification
                verified = None if v is None else v.passed
            reasons += [f"{b.block}: {b.reason}" for b in out.blocks
                        if not b.offloaded and b.block in reductions]
        if intrinsics:
            updates[gv] = _keep_identity(func, current)
        report.functions.append(FunctionReport(
            name, total, done, used, tuple(intrinsics),
            None if not total or done == total else "; ".join(dict.fromkeys(reasons)) or None,
            verified))
    if progress is not None:
        progress(len(funcs), len(funcs), "")
    if updates:
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in updates.items():
            mod[gv] = func
    return mod, report


def OffloadTIR(templates: Sequence, *, policy="first", verify: bool = True,
               report: OffloadReport | None = None):
    """The pass form of `offload_module`: ``OffloadTIR(["x86_vnni"])(mod)``. Pass a
    `OffloadReport` to collect what happened to each PrimFunc."""
    from ._tvm import tvm

    report = report if report is not None else OffloadReport()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.OffloadTIR")
    def _pass(mod, _ctx):
        new, _ = offload_module(mod, templates, policy=policy, verify=verify, report=report)
        return new

    _pass.report = report
    return _pass


__all__ = ["FunctionReport", "OffloadReport", "OffloadTIR", "offload_module"]
