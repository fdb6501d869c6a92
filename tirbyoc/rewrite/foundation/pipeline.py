"""The rewrite as a flat, ordered list of named stages: `ORDER`, written here once.

A stage is a function ``(RewriteState) -> RewriteState | None``: it returns the state it
changed, or None when it does not apply (nothing to stage, no scratchpad, not a CUDA target).
`ORDER` names every stage, in the order they run, and the module that defines it; a module
registers its stage functions with `stage`, by a name from `ORDER` and, for target-specific
ones, the target kinds they serve::

    @stage("fragments", target_kinds=("cuda",))
    def stage_fragments(state): ...

A new stage is a row in `ORDER` and a decorated function in the module that row names.
`run` imports those modules (no stage depends on import order or on another module's import
side effects), checks that every row has its function, and carries the stages out in order.
With ``TIRBYOC_DUMP=DIR`` in the environment, the TIR after each stage that applied is
written to ``DIR/<R>.<function>.<block>.<NN>-<stage>.py`` (R numbers the rewrites of this
process, NN the stages) - what to read when a rewrite goes wrong at stage N.
"""

from __future__ import annotations

import importlib
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tirbyoc.rewrite.foundation.state import RewriteState

StageFn = Callable[[RewriteState], "RewriteState | None"]

# (stage, the module of tirbyoc.rewrite that defines it, what it does), in the order they run
ORDER = (
    ("cast", "block.cast_staging", "operands the block casts copied ahead in the dtype the intrinsic reads"),
    ("commute", "block.stages", "the multiply-add's operands in the intrinsic's order"),
    ("canonicalize", "block.stages", "transform_block_layout to (outer loops, intrinsic axes)"),
    ("stage", "block.staging", "a copy of every operand that cannot be read in place"),
    ("pad", "block.staging", "pad_einsum to the intrinsic's widths; pack the reindexed copies"),
    ("tile", "block.stages", "split each intrinsic axis into tiles"),
    ("scratchpad", "block.dma", "tiles staged per tile into bounded scratchpads"),
    ("epilogue", "block.epilogue", "the chain after the core on its accumulator tile (an accelerator's ALU)"),
    ("fragments", "block.cuda", "the group's tensor-core kernel, or warp tiles and their fragment copies"),
    ("schedule", "block.stages", "the target's default schedule (register blocks, parallel loops) or the caller's"),
    ("dma copies", "block.dma", "tile copies tensorized with the template's DMA intrinsics"),
    ("fragment copies", "block.cuda", "fragment copies tensorized in 16x16 tiles"),
    ("cpu epilogue", "cpu.cpu_epilogue", "the chain after the core fused into the register block's write-back"),
    ("decompose", "block.stages", "the reduction's init split off"),
    ("tensorize", "block.stages", "the compute tensorized with the intrinsic"),
    ("init", "block.stages", "the init tensorized with its intrinsic, where the template has one"),
    ("link", "block.stages", "the result function, with the libraries it calls"),
)


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


_REGISTERED: dict[str, Stage] = {}
_REWRITES = itertools.count()  # numbers the dumps of successive rewrites


def stage(name: str, *, target_kinds: tuple[str, ...] | None = None):
    """Register the function of the stage ``name`` of `ORDER` (a decorator); ``target_kinds``:
    the targets it serves (default: every one)."""

    def register(fn: StageFn) -> StageFn:
        if name not in stage_names():
            raise ValueError(f"no rewrite stage {name!r} in the stage order (stages: {', '.join(stage_names())}); "
                             "a new stage is a row in tirbyoc.rewrite.foundation.pipeline.ORDER")
        if name in _REGISTERED:
            raise ValueError(f"the rewrite stage {name!r} is already registered")
        _REGISTERED[name] = Stage(name, fn, tuple(target_kinds) if target_kinds else None)
        return fn

    return register


def stage_names() -> list[str]:
    return [name for name, _, _ in ORDER]


def stages() -> list[Stage]:
    """Every stage of `ORDER` with its function, its module imported first."""
    for name, module, _ in ORDER:
        if name not in _REGISTERED:
            importlib.import_module(f"tirbyoc.rewrite.{module}")  # deferred: its @stage registers it
        if name not in _REGISTERED:
            raise RuntimeError(f"rewrite stage {name!r}: tirbyoc.rewrite.{module} defines no @stage({name!r})")
    return [_REGISTERED[name] for name in stage_names()]


def run(state: RewriteState) -> RewriteState:
    """Every stage of `ORDER` that serves the state's target, in order."""
    dump = os.environ.get("TIRBYOC_DUMP")
    rewrite = next(_REWRITES) if dump else 0
    for index, st in enumerate(stages()):
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


__all__ = ["ORDER", "Stage", "run", "stage", "stage_names", "stages"]
