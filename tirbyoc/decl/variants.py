"""`VectorVariant`: one member of a CPU template family that differs only by vector ISA.

x86_avx2 / x86_avx512bw run the same ``vpmaddwd`` rewrite on ymm and zmm registers; x86_fp32's
two templates the same ``vfmadd231ps`` one. What differs is a handful of facts - the vector's
lanes, the CPU LLVM compiles for, the features the host needs, the instruction's name, the
LLVM intrinsic called - which a template declares once per variant as a frozen record, checked
when it is made (a typo in a lane count or a missing feature is an error at import, with its
reason, not an odd build later), and read by name (``variant.lanes``), not by tuple position::

    VARIANTS = variants(
        VectorVariant("x86_avx2", 8, "haswell", ("avx2",), "vpmaddwd ymm", llvm="llvm.x86.avx2.pmadd.wd"),
        VectorVariant("x86_avx512bw", 16, "skylake-avx512", ("avx512bw",), "vpmaddwd zmm", ...),
    )
    TEMPLATE = VARIANTS["x86_avx2"].template(IntrinsicGroup("dot_u8i8i32", ...), doc="...")
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc.decl.intrinsic import IntrinsicGroup
from tirbyoc.decl.requirements import requires_cpu
from tirbyoc.decl.template import Runtime, Template
from tirbyoc.errors import DeclarationError


@dataclass(frozen=True)
class VectorVariant:
    """One vector width of a CPU template family (see the module's docstring). ``llvm``: the
    LLVM intrinsic its implementation calls, where one does; ``num_cores``: the target's."""

    name: str
    lanes: int
    mcpu: str
    features: tuple
    instruction: str
    llvm: str = ""
    num_cores: int = 2

    def __post_init__(self):
        object.__setattr__(self, "features", tuple(self.features))
        lanes = self.lanes
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 2 or lanes & (lanes - 1):
            raise DeclarationError(f"variant {self.name!r}: lanes {lanes!r} must be a power of two >= 2")
        for field in ("name", "mcpu", "instruction"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise DeclarationError(f"variant {self.name!r}: {field} must be a non-empty string")
        if not self.features or not all(isinstance(f, str) and f for f in self.features):
            raise DeclarationError(f"variant {self.name!r}: features must name the CPU features the host needs "
                                   f"(LLVM's names, e.g. 'avx2'), got {self.features!r}")

    @property
    def target(self) -> dict:
        """The TVM target it compiles for."""
        return {"kind": "llvm", "mcpu": self.mcpu, "num-cores": self.num_cores}

    def requires(self):
        """Its ``Template.requires``: this CPU must have every one of its features."""
        return requires_cpu(*self.features, instruction=self.instruction)

    def template(self, group: IntrinsicGroup, doc: str, **fields) -> Template:
        """Its CPU template: ``group`` compiled by LLVM for its target, its features required,
        channels-last models (one input channel group per step, ``lanes`` output channels per
        store) and epilogues fused into the register block's write-back; ``fields``: any other
        `Template` field."""
        return Template(name=self.name, target=self.target, runtime=Runtime.LLVM, groups=(group,),
                        requires=self.requires(), doc=doc, **{"channels_last": True, "fuses_epilogues": True, **fields})


def variants(*records: VectorVariant) -> dict:
    """name -> record for a family's variants; two of one name are an error."""
    out: dict = {}
    for record in records:
        if record.name in out:
            raise DeclarationError(f"two variants are named {record.name!r}")
        out[record.name] = record
    return out


__all__ = ["VectorVariant", "variants"]
