"""A matmul of two run-time operands keeps, for the calls with few rows, the loops it had.

An attention's ``q . k^T`` and ``p . v`` multiply two tensors made by the model; a CPU core
stages its second operand into the panels its register block reads (transposed, for the keys)
on every call, which pays back over many rows of the first. A decoding step has one row per
sequence: the core then spends its time on that copy (a 1B-class decoder's step at batch 8
after 128 positions, Zen 4, one thread: ``q . k^T`` 2.10 ms on the core, 0.48 ms as
`tirbyoc.rewrite.rest_schedule` schedules the untouched loops, ``p . v`` 0.81 against 0.40; at
4 rows the two are even, at 8 rows the core leads 2.5 against 4.4, at 32 rows 4.5 against 14.9).
So the offloaded function holds both, chosen when it runs by the row count::

    if rows < FEW_ROWS:   the function's own loops, parallel rows and vector lanes (bit for bit TVM's)
    else:                 the core

Only where that choice exists: a CPU target, a core whose rows are known only at run time (its
row blocks padded when it runs, `tirbyoc.rewrite.cpu.run_time_rows`), no operand a constant
(a weight is packed once, at compile time, and the core reads one row as fast as anything).
Each branch is its own block with its own buffers, so a call allocates only what its branch
uses. The offload's check runs the whole function at sizes on both sides of `FEW_ROWS`
(`tirbyoc.offloading.verification.SYMBOLIC_SIZES`).
"""

from __future__ import annotations

from dataclasses import replace

from tirbyoc._tvm import is_host_target, iter_blocks, make_target, s_tir, tirx, tvm_ffi, vector_bytes, vector_registers
from tirbyoc.rewrite.cpu.run_time_rows import SKIP_ROWS_KEY  # the core's row blocks padded at run time
from tirbyoc.rewrite.cpu.weight_layout import layout_free_positions  # parameters every caller passes as constants
from tirbyoc.rewrite.foundation.steps import Step, StepKind
from tirbyoc.rewrite.rest_schedule.nests import SCHEDULED_ATTR, schedule_rest

FEW_ROWS = 4  # rows below which the untouched loops beat the core (measured above)
FEW_ROWS_BLOCK, MANY_ROWS_BLOCK = "few_rows", "many_rows"


def _padded_at_run_time(func) -> bool:
    """Whether ``func``'s core pads its rows when it runs (they are known only then)."""
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda f: found.append(SKIP_ROWS_KEY in (f.annotations or {}))),
                            order="pre")
    return any(found)


def _block(func, name: str):
    hits = [b for b in iter_blocks(func.body) if str(b.name_hint) == name]
    return hits[0] if len(hits) == 1 else None


def row_count(func, block_name: str):
    """The run-time row count of the matmul block ``block_name`` of ``func``: the extent of the
    iterator its output's second-to-last index is (``C[..., i, j]``), where that extent is
    known only at run time; None otherwise."""
    block = _block(func, block_name)
    if block is None or len(block.writes) != 1 or len(block.writes[0].region) < 2:
        return None
    index = block.writes[0].region[-2].min
    for iv in block.iter_vars:
        if iv.var.same_as(index) and not isinstance(iv.dom.extent, tirx.IntImm):
            return iv.dom.extent
    return None


def _same_params(a, b) -> bool:
    return len(a.params) == len(b.params) and all(p.same_as(q) for p, q in zip(a.params, b.params))


def _branch(name: str, func):
    """``func``'s root block as a block of its own named ``name`` (its buffers allocated in it)."""
    root = func.body.block
    return s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], name, root.body,
                                                      alloc_buffers=list(root.alloc_buffers)))


def dispatched(original, core, rows, target):
    """``core`` (``original`` offloaded) holding ``original``'s own loops, scheduled as
    `schedule_rest` schedules them, for calls with fewer than `FEW_ROWS` ``rows``; None where
    the two do not share their parameters or the loops take no schedule."""
    tgt = make_target(target)
    few, nests = schedule_rest(original, vector_bytes(tgt), vector_registers(tgt), exact=True)
    many, _ = schedule_rest(core, vector_bytes(tgt), vector_registers(tgt), channel_reductions=False, exact=True)
    if not nests or not _same_params(few, many) or not isinstance(many.body, s_tir.SBlockRealize):
        return None
    body = tirx.IfThenElse(rows < FEW_ROWS, _branch(FEW_ROWS_BLOCK, few), _branch(MANY_ROWS_BLOCK, many))
    root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body))
    return many.with_body(root).with_attr(SCHEDULED_ATTR, True)


def with_few_rows_path(original, core, outcomes, rewrites, target):
    """(``core``, ``outcomes``) with `dispatched`'s few-rows branch where the module docstring
    says it applies, a step saying so on the offloaded block; as given elsewhere."""
    if (target is None or not is_host_target(target) or str(make_target(target).kind.name) != "llvm"
            or len(rewrites) != 1 or layout_free_positions(original)
            or not _padded_at_run_time(core)):
        return core, outcomes
    block = rewrites[0].match.block
    rows = row_count(original, block)
    new = dispatched(original, core, rows, target) if rows is not None else None
    if new is None:
        return core, outcomes
    step = Step(StepKind.SCHEDULE, f"calls with fewer than {FEW_ROWS} rows ({rows} < {FEW_ROWS}: a decoding step) run "
                "the function's own loops in parallel rows and vector lanes: for them the core would spend its "
                "time staging its run-time operand")
    return new, [replace(o, steps=tuple(o.steps) + (step,)) if o.block == block and o.offloaded else o
                 for o in outcomes]


__all__ = ["FEW_ROWS", "dispatched", "row_count", "with_few_rows_path"]
