"""Epilogues fused into a CPU core's write-back: bias, requantization, ReLU, the narrowing cast.

After ``FuseOps`` / ``FuseTIR`` a quantized layer is one PrimFunc: the core (a conv, a matmul)
writes int32 accumulators to an intermediate buffer and elementwise blocks follow - the bias
add, the requantization (``(acc - z) * s + b``, ``round(x / s_y) + z_y``, clip), the cast to
8 bits. Left as they are, every accumulator goes to memory as int32 and each block reads and
writes the whole tensor again, serially.

The CPU schedule (`tirbyoc.rewrite.cpu.register_blocks`) already writes each register block of accumulators
back from a small stack buffer inside the parallel loop. Here each block of the chain is
inlined into that write-back (TVM's ``reverse_compute_inline``), in order: the write-back then
computes the whole chain on the accumulators while they are in registers or L1, in vectors,
and stores the chain's result (uint8: a quarter of the int32 bytes) - one pass over memory
instead of one per block. Each step is a schedule primitive, which checks its own legality,
so a MetaSchedule trace replays it.

Inlined into one expression, ``x * s + b`` would be one fused multiply-add for LLVM (TVM
builds with FP-op fusion on), rounding once where TVM's build of the separate blocks rounds
twice, and a requantized value could move one step. `mark_writebacks` (run by tirbyoc's TIR
pipeline before lowering) marks each fused write-back's loop nest and `fence_products` (after
TVM's lowering, once its loops are vectors) puts each float product in it behind
``llvm.arithmetic.fence``, which keeps its rounding and costs no instruction: the values stay
TVM's, bit for bit. The chain stops at the first block that is not elementwise
in the previous one's output (a pad, a reduction, a second reader) and says why; what stops it
is left to TVM as it was.
"""

from __future__ import annotations

from math import gcd

from tirbyoc._tvm import SPATIAL, PrimCall, call_name, expr_dtype, s_tir, structural_equal, tirx, tvm, tvm_ffi
from tirbyoc.ir.tir_walk import loop_extent
from tirbyoc.rewrite.cpu.register_blocks import WRITEBACK_ATTR, lanes_dividing
from tirbyoc.rewrite.cpu.exact_division import fenced
from tirbyoc.rewrite.cpu.integer_writeback import integer_writebacks
from tirbyoc.rewrite.foundation.state import RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind



def _output(stmt):
    return stmt.writes[0].source if len(stmt.writes) == 1 else None


def point_indices(region) -> list | None:
    """The indices of a one-element region, else None."""
    if not all(getattr(r.extent, "value", None) == 1 for r in region.region):
        return None
    return [r.min for r in region.region]


def _elementwise_in(stmt, buffer) -> str | None:
    """Why ``stmt`` (a block) is not elementwise in ``buffer`` (None: it is): spatial
    iterators only, one output of ``buffer``'s shape written at the iterators, ``buffer``
    read once, at the same indices."""
    if stmt.init is not None or any(int(iv.iter_type) != SPATIAL for iv in stmt.iter_vars):
        return f"{stmt.name_hint} reduces"
    out = _output(stmt)
    if out is None:
        return f"{stmt.name_hint} writes {len(stmt.writes)} buffers"
    if len(out.shape) != len(buffer.shape) or not all(structural_equal(a, b) for a, b in zip(out.shape, buffer.shape)):
        return f"{stmt.name_hint} changes the shape ({buffer.name} -> {out.name})"
    ivars = [iv.var for iv in stmt.iter_vars]
    written = point_indices(stmt.writes[0])
    reads = [r for r in stmt.reads if r.source.same_as(buffer)]
    read = point_indices(reads[0]) if len(reads) == 1 else None
    if written is None or len(written) != len(ivars) or not all(i.same_as(v) for i, v in zip(written, ivars)):
        return f"{stmt.name_hint} does not write its iterators' element"
    if read is None or len(read) != len(ivars) or not all(i.same_as(v) for i, v in zip(read, ivars)):
        return f"{stmt.name_hint} does not read {buffer.name} elementwise"
    return None


def _crop_of(stmt, buffer) -> bool:
    """Whether ``stmt`` copies the leading part of ``buffer`` unchanged: the valid channels of
    an output the core computed padded to its tile (24 of 32). Each of its indices into
    ``buffer`` is one of its iterators, and each index it writes an iterator or 0 (a unit
    dimension); TVM's ``reverse_compute_inline`` then checks the rest and guards the padded
    lanes with a predicate."""
    if stmt.init is not None or any(int(iv.iter_type) != SPATIAL for iv in stmt.iter_vars):
        return False
    value = getattr(stmt.body, "value", None)
    if len(stmt.reads) != 1 or not stmt.reads[0].source.same_as(buffer) or len(stmt.writes) != 1 \
            or getattr(value, "source", None) is None or not value.source.same_as(buffer):
        return False
    ivars = [iv.var for iv in stmt.iter_vars]
    read, written = point_indices(stmt.reads[0]), point_indices(stmt.writes[0])
    if read is None or written is None:
        return False
    return (all(any(i.same_as(v) for v in ivars) for i in read)
            and all(any(i.same_as(v) for v in ivars) or getattr(i, "value", None) == 0 for i in written))


def _relayout_of(stmt, buffer) -> bool:
    """Whether ``stmt`` copies ``buffer`` unchanged into a buffer of another shape: the copy
    that puts a core's [rows, channels] output back as the convolution's [n, h, w, c] (a
    reindexed implicit GEMM, or one padded to the core's tile). TVM's
    ``reverse_compute_inline`` inverts its index map (and refuses where it cannot), so the
    write-back then stores straight into the convolution's output."""
    if stmt.init is not None or any(int(iv.iter_type) != SPATIAL for iv in stmt.iter_vars):
        return False
    value = getattr(stmt.body, "value", None)
    return (len(stmt.reads) == 1 and stmt.reads[0].source.same_as(buffer) and len(stmt.writes) == 1
            and getattr(value, "source", None) is not None and value.source.same_as(buffer)
            and point_indices(stmt.reads[0]) is not None and point_indices(stmt.writes[0]) is not None)


def elementwise_chain(sch, writeback) -> tuple[list, str | None]:
    """The blocks after ``writeback`` that are each the only reader of the previous one's
    output and elementwise in it (the first may be a crop of it, `_crop_of`; any may copy it
    into another shape, `_relayout_of`), in order, and why the chain stops (None: nothing
    follows)."""
    chain, current = [], writeback
    while True:
        consumers = sch.get_consumers(current)
        if not consumers:
            return chain, None
        buffer = _output(sch.get(current))
        if len(consumers) > 1:
            return chain, f"{buffer.name} has {len(consumers)} readers"
        why = _elementwise_in(sch.get(consumers[0]), buffer)
        if why is not None and not (current is writeback and _crop_of(sch.get(consumers[0]), buffer)) \
                and not _relayout_of(sch.get(consumers[0]), buffer):
            return chain, why
        chain.append(consumers[0])
        current = consumers[0]


def join_branches(sch, block) -> bool:
    """Inline into their reader the blocks that branch off ``block``'s output and join again
    (GELU, ``x * 0.5 * (1 + erf(x / sqrt 2))``, reads x on two paths): each block that reads
    it, has exactly one reader itself (nothing is computed twice) and writes no output of the
    function goes into that reader, until one block reads ``block``'s output. Whether it got
    there."""
    outputs = {p.name for p in sch.mod["main"].params}
    while len(sch.get_consumers(block)) > 1:
        for branch in sch.get_consumers(block):
            out = _output(sch.get(branch))
            if out is None or out.name in outputs or len(sch.get_consumers(branch)) != 1:
                continue
            try:
                sch.compute_inline(branch)
                break
            except s_tir.schedule.ScheduleError:
                continue
        else:
            return False
    return True


def fuse_into_writeback(sch, writeback) -> tuple[list, str | None]:
    """Inline the elementwise chain after ``writeback`` (the register block's write-back,
    inside the parallel loop) into it, block by block, joining branches (`join_branches`)
    where a block has several readers; returns (the names of the blocks fused, why the chain
    stops or a block refused: None when the whole rest of the function is fused)."""
    chain, stop = elementwise_chain(sch, writeback)
    # an integer core's branches stay apart: BERT's int8 GELU joined (a quantize and dequantize
    # around each of its steps) made LLVM take 16.5 s instead of 0.3 on the unrolled write-back
    joins = str(_output(sch.get(writeback)).dtype).startswith("float")
    while joins and stop is not None and stop.endswith("readers") and join_branches(sch, chain[-1] if chain else writeback):
        chain, stop = elementwise_chain(sch, writeback)
    fused = []
    for blk in chain:
        name = sch.get(blk).name_hint
        why = _inline_side_inputs(sch, blk, writeback)
        if why is not None:
            return fused, why
        crop = not fused and _crop_of(sch.get(blk), _output(sch.get(writeback)))
        valid = int(getattr(_output(sch.get(blk)).shape[-1], "value", 0)) if crop else 0
        try:
            sch.reverse_compute_inline(blk)
        except s_tir.schedule.ScheduleError as err:
            return fused, f"{name}: TVM refused to inline it ({type(err).__name__})"
        fused.append(name)
        if valid:
            _vectors_within(sch, writeback, valid)
    return fused, stop


def _vectors_within(sch, writeback, valid: int) -> None:
    """Re-split the write-back's vector loop after a crop was inlined into it: its predicate
    (``channel < valid``) varies across a vector of the whole tile, and TVM's vectorizer
    scalarizes such a loop (MobileNetV2's 24-channel projections ran 4x slower). In vectors
    of lanes that divide ``valid`` the predicate is the same for every lane, and TVM keeps
    the vectors."""
    loops = sch.get_loops(writeback)
    extent = loop_extent(sch, loops[-1]) or 0
    lanes = lanes_dividing(gcd(valid, extent), 16, 2)
    if not lanes or lanes >= extent:
        return
    outer, inner = sch.split(loops[-1], [None, lanes])
    sch.vectorize(inner)
    sch.unroll(outer)


def _inline_side_inputs(sch, blk, writeback) -> str | None:
    """Inline into ``blk`` the blocks that compute its other operands (a residual branch's
    dequantization, fused into the function before the core), so that the write-back is its
    only producer and it can be inlined there; why not, if TVM refuses."""
    main = sch.get(writeback).name_hint
    while True:
        others = [p for p in sch.get_producers(blk) if sch.get(p).name_hint != main]
        if not others:
            return None
        for producer in others:
            name = sch.get(producer).name_hint
            try:
                sch.compute_inline(producer)
            except s_tir.schedule.ScheduleError as err:
                return f"{name}, an operand of {sch.get(blk).name_hint}: TVM refused to inline it ({type(err).__name__})"


FENCE_KEY = "tirbyoc_fence_products"  # an AttrStmt around a fused write-back's loop nest


def _marked(loop):
    """The parallel loop around a write-back block, under an AttrStmt that `fence_products`
    reads after TVM's lowering (block annotations do not survive it). The mark covers the
    whole parallel loop: the core there has no float product to fence (an integer core), and
    the write-back's ``nearbyint`` becomes ``round`` for TVM's vectorizer (`_round`)."""
    if loop.kind != tirx.ForKind.PARALLEL:
        return loop
    found = []
    tvm_ffi.structural_walk(loop.body, (s_tir.SBlock, lambda b: found.append(WRITEBACK_ATTR in b.annotations)),
                            order="pre")
    if not any(found):
        return loop
    loop = tvm_ffi.structural_map(loop, [(PrimCall, _round)])
    return tirx.AttrStmt(tvm.ir.StringImm(FENCE_KEY), FENCE_KEY, tirx.IntImm("int32", 1), loop)


def _round(call):
    """``nearbyint`` as ``round``: TVM lowers both to LLVM's ``nearbyint`` (ties to even), but
    its vectorizer knows only ``round`` and gives up on the whole loop for the other; LLVM's
    own loop vectorizer would then not vectorize it back past an arithmetic fence."""
    if call_name(call) != "tirx.nearbyint":
        return call
    return tirx.round(call.args[0])


def mark_writebacks(func):
    """``func`` with each parallel loop that holds a write-back (`WRITEBACK_ATTR`) under a
    `FENCE_KEY` AttrStmt (run before TVM's lowering, while blocks and their annotations are
    there). The loop holds the core too: an integer core has no float product to fence."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.For, _marked)])
    return func if body.same_as(func.body) else func.with_body(body)


def _fenced(mul):
    dtype = expr_dtype(mul)
    if not dtype.startswith(("float", "bfloat")):
        return mul
    return fenced(mul)


def _unmarked(attr):
    if attr.attr_key != FENCE_KEY:
        return attr
    return integer_writebacks(tvm_ffi.structural_map(attr.body, [(tirx.Mul, _fenced)]))


def fence_products(func):
    """``func`` (lowered: loops vectorized) with every float product inside a `FENCE_KEY`
    AttrStmt behind an arithmetic fence, each ``round(x / c)`` there computed without a
    division (`tirbyoc.rewrite.cpu.exact_division`), a store of integers in the cheaper forms of
    `tirbyoc.rewrite.cpu.integer_writeback`, the AttrStmt removed (see the module's docstring)."""
    if not isinstance(func, tirx.PrimFunc):
        return func
    body = tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, _unmarked)])
    return func if body.same_as(func.body) else func.with_body(body)


def _writeback(sch, block):
    """The register block's write-back the CPU schedule made for ``block`` (marked with
    `WRITEBACK_ATTR`), or None."""
    return next((c for c in sch.get_consumers(block) if WRITEBACK_ATTR in sch.get(c).annotations), None)


def fuse_cpu_epilogue(state: RewriteState) -> RewriteState | None:
    """Fuse the elementwise chain after the core into its register block's write-back (see
    the module's docstring); a template with a block ALU fuses on its own tile instead."""
    if state.template is not None and getattr(state.template, "block_alu", None) is not None:
        return None
    if "x86" not in str(state.target.attrs.get("mtriple") or "x86"):
        return None  # the fences are checked on x86 CPUs only (another LLVM backend may lack them)
    writeback = _writeback(state.sch, state.block)
    if writeback is None:
        chain, _ = elementwise_chain(state.sch, state.block)
        if not chain:
            return None
        state.record(StepKind.EPILOGUE_LEFT, "epilogue left to TVM: no register-blocked write-back to fuse it into")
        return state
    fused, stop = fuse_into_writeback(state.sch, writeback)
    if fused:
        out = state.sch.get(writeback).writes[0].source
        state.record(StepKind.EPILOGUE, f"epilogue fused into the write-back: {', '.join(fused)} "
                                        f"(stores {out.dtype})")
    if stop is not None:
        state.record(StepKind.EPILOGUE_LEFT, f"epilogue {'partly ' if fused else ''}left to TVM: {stop}")
    return state if fused or stop else None


__all__ = ["FENCE_KEY", "elementwise_chain", "fence_products", "fuse_cpu_epilogue", "fuse_into_writeback",
           "join_branches", "mark_writebacks", "point_indices"]
