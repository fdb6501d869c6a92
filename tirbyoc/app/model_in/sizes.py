"""A model whose shapes are named (a sequence length ``n``, a batch) run at several sizes.

`tirbyoc run --size n=1,17,128` offloads and builds the model once, with its sizes symbolic
(each offloaded function checked at `SYMBOLIC_SIZES` on the way), then runs both builds at
each size given and reports each: the MACs at that size and the share offloaded, both
latencies, the comparison. `bindings` turns the flag's values into one ``{name: size}`` per
run; `coverage_at` counts a report's MACs with the sizes bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirbyoc.errors import TirbyocError
from tirbyoc.ir.pattern import block_macs
from tirbyoc.offloading.verification import specialize_symbolic, symbolic_names


def named_integers(specs, flag: str, form: str, example: str) -> dict | None:
    """A repeatable ``NAME=I1,I2,...`` flag (``--size``, ``--input-shape``) -> {NAME: (I1, ...)}
    of positive integers, or a usage error naming ``flag``, its ``form`` and an ``example``."""
    if not specs:
        return None
    out = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        try:
            parsed = tuple(int(v) for v in values.split(",")) if sep and values.strip() else None
        except ValueError:
            parsed = None
        if not name.strip() or not parsed or any(v <= 0 for v in parsed):
            raise TirbyocError(f"{flag} {spec!r}: write {form} with positive integers, e.g. {example}")
        out[name.strip()] = parsed
    return out


def parse_sizes(specs) -> dict | None:
    """--size NAME=V1,V2,... (repeatable) -> {NAME: (V1, V2, ...)}."""
    return named_integers(specs, "--size", "NAME=V1,V2,...", "n=1,17,128")


def bindings(sizes: dict | None) -> list[dict | None]:
    """One ``{name: size}`` per run: the names' values taken together, position by position (a
    name given one value keeps it in every run); ``[None]`` without sizes."""
    if not sizes:
        return [None]
    runs = max(len(v) for v in sizes.values())
    uneven = {k: len(v) for k, v in sizes.items() if len(v) not in (1, runs)}
    if uneven:
        raise TirbyocError(f"--size gives {runs} values for one name and {uneven} for others; "
                           "give each name one value or as many as the others")
    return [{k: v[i] if len(v) > 1 else v[0] for k, v in sizes.items()} for i in range(runs)]


def coverage_at(mod, report, binding: dict) -> tuple[int, int]:
    """(offloaded MACs, all MACs) of one model run with ``binding``'s sizes: each PrimFunc of
    ``mod`` (the legalized model before offloading) counted with its size variables bound, its
    offloaded blocks' share as the report says, times its call sites."""
    done = total = 0
    for f in report.functions:
        if f.name not in {gv.name_hint for gv in mod.get_global_vars()}:
            continue
        func = mod[f.name]
        names = symbolic_names([func])
        missing = sorted(set(names) - set(binding))
        if missing:
            raise TirbyocError(f"PrimFunc {f.name} has size variable(s) {missing}; give them with "
                               f"--size {missing[0]}=V1,V2,...")
        macs = block_macs(specialize_symbolic([func], binding)[0] if names else func)
        total += sum(macs.values()) * f.calls
        done += sum(macs.get(b, 0) for b in f.offloaded_blocks) * f.calls
    return done, total


@dataclass
class SizeRun:
    """The model run at one binding of its sizes."""

    sizes: dict
    offloaded_macs: int
    total_macs: int
    verified: bool | None
    max_abs_err: float
    latency_ms: dict = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        return self.offloaded_macs / self.total_macs if self.total_macs else 0.0

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "coverage": self.coverage, "offloaded_macs": self.offloaded_macs,
                "total_macs": self.total_macs, "verified": self.verified,
                "max_abs_err": None if self.max_abs_err != self.max_abs_err else self.max_abs_err,
                "latency_ms": self.latency_ms}


def table(runs: list[SizeRun]) -> str:
    """One row per size: MACs, coverage, verdict, latencies."""
    rows = [("sizes", "MACs", "offloaded", "outputs", "offloaded ms", "TVM ms")]
    for r in runs:
        verdict = {True: "match", False: "DIFFER", None: "not compared"}[r.verified]
        ms = [f"{r.latency_ms[k]:.3f}" if k in r.latency_ms else "-" for k in ("offloaded", "baseline")]
        rows.append((", ".join(f"{k}={v}" for k, v in r.sizes.items()), f"{r.total_macs:,}",
                     f"{r.coverage:.1%}", verdict, *ms))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


__all__ = ["SizeRun", "bindings", "coverage_at", "named_integers", "parse_sizes", "table"]
