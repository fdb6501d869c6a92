"""One point of a sweep: a template variant's figures on the model (a row of the table, a
line of the results file)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# what a row is, whatever ran it: every field of its JSON but the wall time
TIMING = ("seconds",)


@dataclass
class SweepPoint:
    params: dict
    coverage: float | None = None
    verified: bool | None = None
    max_abs_err: float | None = None
    cycles: int | None = None
    utilization: dict = field(default_factory=dict)
    dma_bytes: int | None = None
    scratchpad_kib: float | None = None  # the on-chip memory the variant declares
    error: str | None = None  # why this point has no figures
    seconds: float = 0.0

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())

    def to_json(self) -> dict:
        return {"params": self.params, "coverage": self.coverage, "verified": self.verified,
                "max_abs_err": self.max_abs_err, "cycles": self.cycles,
                "utilization": self.utilization, "dma_bytes": self.dma_bytes,
                "scratchpad_kib": self.scratchpad_kib, "error": self.error,
                "seconds": round(self.seconds, 2)}

    @classmethod
    def from_json(cls, row: dict) -> "SweepPoint":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})

    def row(self) -> dict:
        """The point's JSON without its wall time: equal for equal points, however run."""
        return {k: v for k, v in self.to_json().items() if k not in TIMING}


__all__ = ["SweepPoint", "TIMING"]
