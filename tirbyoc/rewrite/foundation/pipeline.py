"""Ordered pipelines, written one way: a tuple of `Stage` rows - a name, the function itself,
what it does, the target kinds it serves - run in order by `run_in_order`.

Three pipelines are written so, each in the module that owns it:

* the rewrite of one block (`tirbyoc.rewrite.block.order.STAGES`): each stage a function
  ``(RewriteState) -> RewriteState | None`` (None: it does not apply);
* the steps on a whole offloaded function (`tirbyoc.offloading.function_steps.FUNCTION_STEPS`);
* tirbyoc's lowering passes, before and after TVM's (`tirbyoc.offloading.lowering`).

A reader (and an IDE) follows a row to its function; a new stage is a row in its pipeline's
tuple. With ``TIRBYOC_DUMP=DIR`` in the environment, every pipeline writes the TIR after each
stage that changed it to ``DIR/<R>.<what>.<NN>-<stage>.py`` (R numbers the runs of this
process, NN the stages) - what to read when a rewrite or a lowering goes wrong at stage N.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DUMP_VARIABLE = "TIRBYOC_DUMP"


@dataclass(frozen=True)
class Stage:
    """One row of a pipeline."""

    name: str
    fn: Callable
    what: str = ""  # what it does, as a sentence a reader of the row needs
    target_kinds: tuple[str, ...] | None = None  # the target kinds it serves (None: every one)

    def serves(self, target) -> bool:
        if self.target_kinds is None:
            return True
        return (str(target.kind.name) if target is not None else None) in self.target_kinds


_RUNS = itertools.count()  # numbers the dumps of successive runs


def run_in_order(stages, value, apply: Callable, *, target=None, label: str = "",
                 script: Callable | None = None):
    """``value`` after each of ``stages`` that serves ``target``, in order: ``apply(stage,
    value)`` returns the changed value, or None when the stage does not apply. Under
    `DUMP_VARIABLE`, ``script(value)`` (TVMScript text) is written after each change, named
    by the run, ``label`` and the stage."""
    folder = os.environ.get(DUMP_VARIABLE)
    run = next(_RUNS) if folder else 0
    for index, st in enumerate(stages):
        if not st.serves(target):
            continue
        out = apply(st, value)
        if out is None:
            continue
        value = out
        if folder and script is not None:
            dump(Path(folder), f"{run:03d}.{label}.{index:02d}-{st.name}", st.name, script(value))
    return value


def dump_after(label: str, stage: str, text: Callable[[], str]) -> None:
    """Under `DUMP_VARIABLE`: ``text()`` written as the IR after ``stage`` (for a pipeline that
    TVM runs, whose passes call this themselves); without it, nothing is printed."""
    folder = os.environ.get(DUMP_VARIABLE)
    if folder:
        dump(Path(folder), f"{next(_RUNS):03d}.{label}-{stage}", stage, text())


def dump(folder: Path, name: str, stage: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "_", name)
    (folder / f"{safe}.py").write_text(f"# after stage {stage!r}\n{text}\n")


__all__ = ["DUMP_VARIABLE", "Stage", "dump_after", "run_in_order"]
