"""`QuantizedReport`: what `QuantizedToInteger` made of each quantized chain of a model, as
`tirbyoc run` prints it and writes it in ``--json``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class QuantizedReport:
    """What the pass made of each quantized chain: integer, or float with the reason."""

    integer: list[str] = field(default_factory=list)  # "conv2d 8x3x3x3", ...
    kept: list[tuple[str, str]] = field(default_factory=list)  # (chain, why it stayed float)
    shifted: list[str] = field(default_factory=list)  # chains requantized by a shift (requantize="shift")
    unshifted: list[tuple[str, str]] = field(default_factory=list)  # (chain, why it is requantized in float)
    pools: list[str] = field(default_factory=list)  # max pools run on the quantized values
    boundaries: list[str] = field(default_factory=list)  # fused outputs stored in 8 bits (`narrow_boundary`)
    byte_layouts: list[str] = field(default_factory=list)  # reshapes / transposes moved to the 8-bit values (`byte_layouts`)
    seen: list = field(default_factory=list, repr=False)  # the calls kept float, reported once
    done: list = field(default_factory=list, repr=False)  # the cores made integer, reported once
    # set by a run: the integer model's output against the float QDQ graph's, and the
    # output's quantization step
    float_max_abs_diff: float | None = None
    step: float | None = None

    def describe(self) -> str:
        text = f"{len(self.integer)} of {len(self.integer) + len(self.kept)} quantized conv/matmul chains made integer"
        reasons = sorted({why for _, why in self.kept})
        text += f" (kept float: {'; '.join(reasons)})" if reasons else ""
        if self.shifted or self.unshifted:
            why = sorted({w for _, w in self.unshifted})
            text += (f"; {len(self.shifted)} requantized by a shift" +
                     (f", {len(self.unshifted)} in float ({'; '.join(why)})" if why else ""))
        if self.pools:
            text += f"; {len(self.pools)} max pool{'' if len(self.pools) == 1 else 's'} on the quantized values"
        if self.boundaries:
            n = len(self.boundaries)
            text += f"; {n} dequantized output{'' if n == 1 else 's'} stored in 8 bits, dequantized by the reader"
        if self.byte_layouts:
            n = len(self.byte_layouts)
            text += f"; {n} reshape or transpose step{'' if n == 1 else 's'} on the 8-bit values (quantize round trips dropped)"
        if self.float_max_abs_diff is not None:
            n = round(self.float_max_abs_diff / self.step) if self.step else None
            steps = f" = {n} output step{'' if n == 1 else 's'}" if n is not None else ""
            text += (f"; the integer model against the float QDQ graph: max abs diff "
                     f"{self.float_max_abs_diff:.3g}{steps}")
        return text

    def to_json(self) -> dict:
        return {"integer": list(self.integer), "kept": [{"chain": c, "reason": r} for c, r in self.kept],
                "shifted": list(self.shifted), "requantized_in_float": [{"chain": c, "reason": r} for c, r in self.unshifted],
                "max_pools": list(self.pools), "boundaries_in_8_bits": list(self.boundaries),
                "byte_layouts": list(self.byte_layouts),
                "float_max_abs_diff": self.float_max_abs_diff, "step": self.step}


__all__ = ["QuantizedReport"]
