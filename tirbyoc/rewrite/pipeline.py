"""The rewrite as a flat, ordered list of named stages.

A stage is a function ``(RewriteState) -> RewriteState | None``: it returns the state it
changed, or None when it does not apply (nothing to stage, no scratchpad, not a CUDA target).
Stages register with `stage`, by name, at a place in the order and, for target-specific ones,
for the target kinds they serve::

    @stage("double buffer", after="scratchpad")
    def double_buffer(state): ...

    @stage("fragments", after="tile", target_kinds=("cuda",))
    def stage_fragments(state): ...

`run` carries the stages out in order. With ``TIRBYOC_DUMP=DIR`` in the environment, the TIR
after each stage that applied is written to ``DIR/<R>.<function>.<block>.<NN>-<stage>.py``
(R numbers the rewrites of this process, NN the stages) — what to read when a rewrite goes
wrong at stage N.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tirbyoc.rewrite.state import RewriteState

StageFn = Callable[[RewriteState], "RewriteState | None"]


@dataclass(frozen=True)
class Stage:
    name: str
    fn: StageFn
    target_kinds: tuple[str, ...] | None = None  # None: every target

    def serves(self, state: RewriteState) -> bool:
        if self.target_kinds is None:
            return True
        kind = str(state.target.kind.name) if state.target is not None else None
        return kind in self.target_kinds


_STAGES: list[Stage] = []
_REWRITES = itertools.count()  # numbers the dumps of successive rewrites


def stage(name: str, *, after: str | None = None, target_kinds: tuple[str, ...] | None = None):
    """Register a stage (a decorator). ``after``: the stage it runs after (default: last)."""

    def register(fn: StageFn) -> StageFn:
        if any(s.name == name for s in _STAGES):
            raise ValueError(f"a rewrite stage named {name!r} is already registered")
        new = Stage(name, fn, tuple(target_kinds) if target_kinds else None)
        if after is None:
            _STAGES.append(new)
        else:
            index = next((i for i, s in enumerate(_STAGES) if s.name == after), None)
            if index is None:
                raise ValueError(f"no rewrite stage {after!r} to run {name!r} after "
                                 f"(stages: {', '.join(stage_names())})")
            _STAGES.insert(index + 1, new)
        return fn

    return register


def stage_names() -> list[str]:
    return [s.name for s in _STAGES]


def run(state: RewriteState) -> RewriteState:
    """Every registered stage that serves the state's target, in order."""
    dump = os.environ.get("TIRBYOC_DUMP")
    rewrite = next(_REWRITES) if dump else 0
    for index, st in enumerate(_STAGES):
        if not st.serves(state):
            continue
        out = st.fn(state)
        if out is None:
            continue
        state = out
        if dump:
            _dump(Path(dump), rewrite, index, st.name, state)
    return state


def _dump(folder: Path, rewrite: int, index: int, name: str, state: RewriteState) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    m = state.match
    safe = re.sub(r"[^\w.-]+", "_", f"{rewrite:03d}.{m.function}.{m.block}.{index:02d}-{name}")
    func = state.func if state.func is not None else state.sch.mod["main"]
    (folder / f"{safe}.py").write_text(f"# after stage {name!r}\n{func.script()}\n")


__all__ = ["Stage", "run", "stage", "stage_names"]
