"""What `tirbyoc run` found: `RunResult`, as the table a person reads and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from tirbyoc.app.running.reference import Reference
from tirbyoc.app.model_in.sizes import table as size_table
from tirbyoc.app.running.targets import BASELINES
from tirbyoc.offloading.table import group_repeats, render
from tirbyoc.relax.bridge import OffloadReport
from tirbyoc.relax.emulated import EmulatedRuns
from tirbyoc.relax.bf16 import Bf16Report
from tirbyoc.relax.byte_tables import ByteTableReport
from tirbyoc.relax.fast_math import FastMathReport
from tirbyoc.relax.layout import LayoutReport
from tirbyoc.relax.transposed_operands import TransposedReport
from tirbyoc.relax.quantized import QuantizedReport


@dataclass
class RunResult:
    model: str
    templates: list[str]
    target: dict
    report: OffloadReport
    verified: bool | None  # None: not compared, or not meaningfully (see ``check_note``)
    max_abs_err: float
    latency_ms: dict = field(default_factory=dict)  # offloaded / baseline
    seconds: dict = field(default_factory=dict)  # wall time per phase
    not_run: str | None = None  # why the builds were not run and compared
    simulation: dict = field(default_factory=dict)  # template -> tirbyoc.sim.SimStats of one run
    comparison: object = None  # tirbyoc.offloading.verification.Comparison of the outputs, when compared
    baseline: str = "default"  # how TVM built the untouched model (BASELINES)
    quantized: QuantizedReport | None = None  # a QDQ model's chains made integer
    reference: Reference | None = None  # ONNX Runtime on the same model and inputs
    emulated: EmulatedRuns | None = None  # the offloaded PrimFuncs ran in an emulator
    fast_math: FastMathReport | None = None  # --fast-math: what was approximated, in both builds
    emulates: dict = field(default_factory=dict)  # template -> the instruction it emulates (untimed)
    layout: LayoutReport | None = None  # the model converted to NHWC once (a channels-last template)
    sizes: list | None = None  # --size: the model at each binding of its named dimensions (SizeRun)
    size_origin: str | None = None  # where the sizes came from, when --size did not give them
    bf16: Bf16Report | None = None  # --precision bf16: what was converted, its accuracy against fp32
    tables: ByteTableReport | None = None  # a QDQ model's 8-bit elementwise chains as 256-entry tables
    transposed: TransposedReport | None = None  # matmuls reading a run-time operand in place of its transpose

    def to_json(self) -> dict:
        r = self.report
        return {
            "model": self.model, "template": ",".join(self.templates), "templates": self.templates,
            "target": self.target, "baseline": {"name": self.baseline,
                                                "what": BASELINES.get(self.baseline)},
            "coverage": r.coverage, "offloaded_macs": r.offloaded_macs,
            "total_macs": r.total_macs, "verified": self.verified, "max_abs_err": self.max_abs_err,
            "comparison": None if self.comparison is None else {
                "max_abs_err": self.comparison.abs_err, "max_rel_err": self.comparison.rel_err,
                "tolerance": self.comparison.tolerance, "output_scale": self.comparison.scale,
                "note": self.comparison.note},
            "latency_ms": self.latency_ms, "seconds": self.seconds, "not_run": self.not_run,
            "simulation": {t: st.to_json() for t, st in self.simulation.items()},
            "functions": [f.to_json() for f in r.functions],
            "packed_weights": None if r.packed is None else {
                **r.packed.to_json(), "tensors": r.packed.tensors, "bytes_per_run": r.packed_bytes_per_run()},
            "rest": None if r.rest is None else r.rest.to_json(),
            "quantized": self.quantized.to_json() if self.quantized is not None else None,
            "reference": self.reference.to_json() if self.reference is not None else None,
            "emulated": self.emulated.to_json() if self.emulated is not None else None,
            "fast_math": self.fast_math.to_json() if self.fast_math is not None else None,
            "emulates": self.emulates,
            "layout": self.layout.to_json() if self.layout is not None else None,
            "sizes": None if self.sizes is None else [s.to_json() for s in self.sizes],
            "size_origin": self.size_origin,
            "precision": "bf16" if self.bf16 is not None else None,
            "bf16": self.bf16.to_json() if self.bf16 is not None else None,
            "byte_tables": self.tables.to_json() if self.tables is not None else None,
            "operands_read_in_place": self.transposed.rewritten if self.transposed is not None else 0,
        }

    def outcome(self) -> str:
        """The output comparison in words, with the errors and the tolerance used."""
        c = self.comparison
        if c is None:
            return "not compared"
        word = {True: "match", False: "DIFFER", None: "not meaningfully checked"}[self.verified]
        text = (f"{word} (max abs error {c.abs_err:.3g}, relative {c.rel_err:.3g} of the output "
                f"scale {c.scale:.3g}; tolerance {c.tolerance:.3g})")
        return f"{text}: {c.note}" if c.note else text

    def table(self) -> str:

        r = self.report
        timed = any(f.ms for f in r.shown())
        rows = [(f.name, str(f.calls), f"{f.total_macs:,}", f.kernel())
                + ((_per_call(f.ms),) if timed else ()) + (f.note(),) for f in r.shown()]
        rows, notes = group_repeats(rows, len(rows[0]) - 1 if rows else 0)
        head = ("PrimFunc", "calls", "MACs", "intrinsic or library kernel")
        head += (("ms/call TVM -> offloaded",) if timed else ()) + ("note",)
        text = render(head, rows)
        if notes:
            text += "\n\n" + "\n".join(notes)
        text += (f"\n\n{len(r.functions)} PrimFuncs ({r.others} without multiply-accumulates, "
                 "left to TVM)"
                 f"\nMAC coverage: {self._coverage()}"
                 f"\n{self._where()}"
                 f"\noutputs: {self.outcome()}")
        if r.packed is not None and r.packed.tensors:
            text += (f"\nweights: {r.packed.tensors} packed once at compile time, not on every call "
                     f"({_bytes(r.packed_bytes_per_run())} of copies less per run)")
        if r.rest is not None and r.rest.left:
            text += f"\nthe rest: {r.rest.summary()}"
        if self.layout is not None:
            text += f"\nlayout: {self.layout.describe()}"
        if self.transposed is not None:
            text += f"\nlayout: {self.transposed.describe()}"
        if self.quantized is not None:
            text += f"\nquantized model: {self.quantized.describe()}"
        if self.tables is not None:
            text += f"\n{self.tables.describe()}"
        if self.fast_math is not None:
            text += f"\n{self.fast_math.describe()}"
        if self.bf16 is not None:
            text += f"\n{self.bf16.describe()}"
        if self.reference is not None:
            text += f"\nreference: {self.reference.describe()}"
        for name, st in self.simulation.items():
            u = st.utilization
            text += (f"\nsimulated on {name}: {st.cycles:,} cycles ({st.seconds * 1e3:.3f} ms at "
                     f"{st.config.clock_mhz} MHz), busy load {u['load']:.0%} / compute "
                     f"{u['compute']:.0%} / store {u['store']:.0%}, DMA in "
                     f"{sum(st.load_bytes.values()):,} B, out {st.store_bytes:,} B, "
                     f"{st.tile_ops:,} tile operations, scratchpad high-water "
                     + " / ".join(f"{k} {v:,} B" for k, v in st.high_water.items()))
        if self.size_origin:
            text += f"\n{self.size_origin}"
        if self.sizes:
            text += ("\n\nat each size (one build of each; the rows above: the first size; a function "
                     "of symbolic sizes shows 0 MACs there)\n" + size_table(self.sizes))
        if self.not_run:
            text += f"\nnot run: {self.not_run}"
        return text


    def _coverage(self) -> str:
        """The share of the MACs offloaded (with --size: at the first size; each size below)."""
        r = self.report
        if not self.sizes:
            return f"{r.coverage:.1%} ({r.offloaded_macs:,} of {r.total_macs:,})"
        s = self.sizes[0]
        at = ", ".join(f"{k}={v}" for k, v in s.sizes.items())
        return f"{s.coverage:.1%} at {at} ({s.offloaded_macs:,} of {s.total_macs:,}); each size below"

    def _where(self) -> str:
        """Latency and what each build ran on."""
        lat, e = self.latency_ms, self.emulated
        baseline = BASELINES.get(self.baseline, self.baseline)
        if e is None:
            offloaded = _ms(lat.get("offloaded"))
            if self.emulates:
                what = "; ".join(f"{t} emulates {i}" for t, i in self.emulates.items())
                offloaded = (f"not measured ({what} in portable code: the values are the "
                             "instruction's, the times are not)")
            return (f"latency: offloaded {offloaded}, TVM baseline "
                    f"{_ms(lat.get('baseline'))}\n  both built for {_target_words(self.target)}; "
                    f"baseline: {baseline}")
        calls = sum(e.calls.values())
        return (f"latency: not measured (emulated)\n  offloaded PrimFuncs built for "
                f"{_target_words(e.target)}, ran under {e.emulator}: {calls} call(s), "
                f"{e.seconds:.2f} s in QEMU, VTCM high-water {e.vtcm_high_water:,} B\n  the rest "
                f"of the model and the baseline built for {_target_words(self.target)}; "
                f"baseline: {baseline}")


def _per_call(ms: dict | None) -> str:
    if not ms:
        return "-"
    if "error" in ms:
        return "not timed"
    return f"{ms['tvm']:.3f} -> {ms['offloaded']:.3f}"


def _bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n:,} B"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def _target_words(target: dict) -> str:
    keys = ("kind", "mtriple", "mcpu", "mattr", "num-cores")
    return " ".join(f"{k}={target[k]}" for k in keys if target.get(k) not in (None, "", []))


__all__ = ["RunResult"]
