"""`BlockDMA`: a template's DMA engine moving whole scratchpad tiles, declared as data.

An intrinsic has one fixed shape, but a scratchpad tile's shape is the tile planner's choice
per workload. A template whose DMA engine moves a block of rows at a stride (VTA's load and
store instructions) declares it here, by the packed functions that perform it; the rewrite
then copies each scratchpad tile with one call of them wherever the copy is a plain window
(the tile's layout in the scratchpad is the window's, reshaped), and falls back to the
template's per-intrinsic-tile DMA intrinsics elsewhere.

The functions take ``(destination view, source view, *scope_args[scope])``: two strided
DLTensor views with as many elements, copied in the row-major order of each (a store may
narrow, keeping the low bits as a cast does).

``double_buffer`` names the scopes whose tiles get two versions, so that the load of the next
tile overlaps the compute on this one (`tirbyoc.rewrite.functions.double_buffer`): the tile planner
gives such a scope half its capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tirbyoc.errors import TemplateError


@dataclass(frozen=True)
class BlockDMA:
    """``load``/``store``: packed function names (DRAM -> scratchpad, scratchpad -> DRAM);
    ``scope_args``: per scratchpad scope, the arguments that follow the two views."""

    load: str
    store: str
    scope_args: Mapping = field(default_factory=dict)
    doc: str = ""
    double_buffer: tuple = ()

    def __post_init__(self):
        for name in ("load", "store"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TemplateError(f"BlockDMA.{name} must name a packed function, got {value!r}")
        object.__setattr__(self, "scope_args",
                           MappingProxyType({str(k): tuple(v) for k, v in dict(self.scope_args).items()}))
        if isinstance(self.double_buffer, str):
            raise TemplateError("BlockDMA.double_buffer is a tuple of scope names, got the string "
                                f"{self.double_buffer!r}")
        object.__setattr__(self, "double_buffer", tuple(str(s) for s in self.double_buffer))

    def symbol(self, direction: str) -> str:
        return self.load if direction == "load" else self.store


__all__ = ["BlockDMA"]
