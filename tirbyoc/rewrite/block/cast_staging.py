"""The first stage: operands the block casts, copied ahead in the dtype the intrinsic reads.

The matcher marks such operands `Staging.CAST` (`tirbyoc.matching.casts`): a float16
convolution accumulating in float32 under a library's sgemm, which reads float32. Each
buffer gets a staging copy in the cast's dtype - TVM's ``cache_read`` then
``unsafe_set_dtype``, which is exact here because every value the copy holds came from the
narrower buffer - and the block's ``float32(float16(copy[...]))`` reads become ``copy[...]``
(a round trip through the narrower type that changes no such value). The block is then
matched again: from here on it reads its operands as the intrinsic does.
"""

from __future__ import annotations

from dataclasses import replace

from tirbyoc._tvm import TensorLoad, expr_dtype, prim_expr, s_tir
from tirbyoc.errors import RewriteError
from tirbyoc.ir.pattern import load_source, read_block
from tirbyoc.ir.tir_walk import map_expr
from tirbyoc.matching.candidates import Candidate
from tirbyoc.matching.matcher import match_block
from tirbyoc.matching.results import Mismatch, Staging
from tirbyoc.rewrite.block.stages import replace_stored_value
from tirbyoc.rewrite.foundation.state import RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind


def _unwrapped(copies: dict):
    """A function for `map_expr`: ``wide(narrow(copy[...]))`` -> ``copy[...]`` for the copies
    (buffer -> wide dtype) made here."""

    def fn(node):
        if isinstance(node, prim_expr.Cast) and isinstance(node.value, prim_expr.Cast):
            load = node.value.value
            if isinstance(load, TensorLoad) and copies.get(str(load_source(load).name)) == expr_dtype(node):
                return load
        return None

    return fn


def _inline_narrow_producers(state: RewriteState, copy, buffer: str) -> None:
    """Compute ``buffer`` (made in this function in the narrow dtype: a convolution's padding)
    inside its wide staging copy, so that no narrow intermediate is left. Left, it does not
    build: TVM's StorageRewrite gives a narrow buffer's memory to a wide one whose pointer the
    intrinsic takes, and the pointer's element type then contradicts its buffer. A producer
    that cannot be inlined (a reduction) refuses the rewrite here, before it is built."""
    sch = state.sch
    for producer in sch.get_producers(copy):
        name = sch.get(producer).name_hint
        try:
            sch.compute_inline(producer)
        except s_tir.ScheduleError as err:
            raise RewriteError(
                f"{state.where}: {buffer} is computed in this function ({name}) in its narrow "
                f"dtype and cannot be computed inside its staging copy "
                f"({str(err).strip().splitlines()[-1]}); a narrow buffer beside the wide copies "
                "does not build (TVM's StorageRewrite shares their memory)") from None
        state.record(StepKind.CAST, f"{name} computed inside the staging copy of {buffer}")


def stage_casts(state: RewriteState) -> RewriteState | None:
    dtypes = {s.name: s.dtype for s in state.match.intrinsic.operands}
    casts = {o.buffer: dtypes[o.operand] for o in state.match.operands if Staging.CAST in o.staging}
    if not casts:
        return None
    if state.traced:
        raise RewriteError(f"{state.where}: casting an operand in its staging copy rewrites the "
                           "block, which no schedule primitive records; cast the input first")
    sch = state.sch
    copies = {}
    for buffer, dtype in casts.items():
        with state.step(StepKind.CAST, f"cast {buffer} to {dtype} in a staging copy"):
            block = sch.get(state.block)
            index = next(i for i, r in enumerate(block.reads) if str(r.source.name) == buffer)
            copy = sch.cache_read(state.block, index, "global")
            sch.unsafe_set_dtype(copy, 0, dtype)
            copies[str(sch.get(copy).writes[0].source.name)] = dtype
            _inline_narrow_producers(state, copy, buffer)
    replace_stored_value(sch, state.block, map_expr(sch.get(state.block).body.value, _unwrapped(copies)))
    m = state.match
    pattern = read_block(sch.get(state.block))
    again = match_block(Candidate(m.intrinsic, m.group, state.template), pattern, m.function)
    if isinstance(again, Mismatch) or any(Staging.CAST in o.staging for o in again.operands):
        why = again.message if isinstance(again, Mismatch) else "its operands are still cast"
        raise RewriteError(f"{state.where}: after casting {', '.join(casts)} in staging copies the "
                           f"block does not match: {why}")
    state.match, state.pattern = replace(again, template=m.template, init=m.init), pattern
    return state
