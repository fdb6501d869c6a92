"""What a block is matched against: each intrinsic of the templates, groups or intrinsics a
caller names, with the group and template it came from, and each intrinsic's description read
once as a `BlockPattern`."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from tirbyoc.decl.intrinsic import Intrinsic, IntrinsicGroup
from tirbyoc.decl.intrinsic_check import leaf_block
from tirbyoc.decl.registry import get_template
from tirbyoc.decl.template import Template
from tirbyoc.ir.pattern import BlockPattern, read_block


@dataclass(frozen=True)
class Candidate:
    intrinsic: Intrinsic
    group: IntrinsicGroup | None = None
    template: object = None  # tirbyoc.Template


def candidates(targets) -> list[Candidate]:
    """Normalise what to match against: Templates, template names, groups, intrinsics."""

    if isinstance(targets, (str, Template, IntrinsicGroup, Intrinsic)):
        targets = [targets]
    out: list[Candidate] = []
    seen = set()

    def add(c: Candidate):
        if c.intrinsic.name not in seen:
            seen.add(c.intrinsic.name)
            out.append(c)

    for t in targets:
        if isinstance(t, str):
            t = get_template(t)
        if isinstance(t, Template):
            for g in t.groups:
                for member in g.members():
                    add(Candidate(member, g, t))
            for i in t.extra:
                add(Candidate(i, None, t))
        elif isinstance(t, IntrinsicGroup):
            for member in t.members():
                add(Candidate(member, t, None))
        elif isinstance(t, Intrinsic):
            add(Candidate(t, None, None))
        else:
            raise TypeError(
                f"cannot match against {t!r}: pass Templates, template names, IntrinsicGroups "
                "or Intrinsics"
            )
    return out


_PATTERNS: "weakref.WeakKeyDictionary[Intrinsic, BlockPattern]" = weakref.WeakKeyDictionary()


def intrinsic_pattern(intrin: Intrinsic) -> BlockPattern:
    """The description's leaf block as a pattern (read once per intrinsic)."""
    pat = _PATTERNS.get(intrin)
    if pat is None:
        pat = read_block(leaf_block(intrin.name, intrin.desc))
        _PATTERNS[intrin] = pat
    return pat


__all__ = ["Candidate", "candidates", "intrinsic_pattern"]
