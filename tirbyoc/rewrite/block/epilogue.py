"""Fused epilogues: the elementwise blocks after a core run on its accumulator tile.

After ``FuseOps`` / ``FuseTIR`` a quantized layer is one PrimFunc: the core (conv, matmul)
writes int32 accumulators to an intermediate buffer, and elementwise blocks follow - bias add,
requantization (add a rounding constant, shift right, clip), ReLU - until a cast narrows to
int8. Left to the host, every accumulator goes to DRAM as int32 and comes back; a template
with a `BlockALU` runs those blocks on the accumulator tile instead, inside the scratchpad
tile loop, and its block DMA stores the tile already narrowed (4x fewer bytes leave the
accelerator).

The ``epilogue`` stage (after ``scratchpad``) takes the chain `find_epilogue` reads
(`tirbyoc.rewrite.block.epilogue_chain`), moves it into the tile loop (``reverse_compute_at``),
inlines the copies between the accumulator tile and the first step (the store of the tile,
the write-back of a reindexed output) and every step but the last into the next, so one block
computes the whole chain from the accumulator tile; broadcast operands (a bias) come into the
accumulator scratchpad by block DMA, once per tile. That block's loop nest becomes the ALU's
operations on the whole tile, in place (the tile is dead once stored, so the epilogue needs
no scratchpad of its own), then one block-DMA store of it, narrowing where the chain ends in
a cast. The output must list the tile's elements in the accumulator tile's order (an NCHW
convolution whose tile is pixels x channels does not: its epilogue stays on the host). Like
the block DMA, the replacement is not a schedule primitive: a traced (MetaSchedule) rewrite
leaves the epilogue to the host. Whatever is not fused stays host code, with the reason among
the steps.
"""

from __future__ import annotations

from tirbyoc._tvm import s_tir, tirx
from tirbyoc.errors import RewriteError, schedule_error_line
from tirbyoc.ir.tir_walk import always_true
from tirbyoc.rewrite.block.block_dma import row_major, strided_view, tile_nest, window_region
from tirbyoc.rewrite.block.dma import copy_by_block_dma
from tirbyoc.rewrite.block.epilogue_chain import AluOp, Epilogue, alu_ops, blocks_of, find_epilogue, loads, readers
from tirbyoc.rewrite.block.scratchpad import scratchpad_usage
from tirbyoc.rewrite.foundation.state import RewriteState
from tirbyoc.rewrite.foundation.steps import StepKind


def fuse_epilogue(state: RewriteState) -> RewriteState | None:
    """Run the chain after the core on its accumulator tile (see the module's docstring)."""
    template = state.template
    alu = getattr(template, "block_alu", None)
    if alu is None or template.block_dma is None:
        return None
    out = next((c for c in state.copies if c[3] == "write"), None)
    if out is None:
        return None
    acc_dtype = str(state.match.intrinsic.operand(out[0].operand).dtype)
    chain = find_epilogue(state.sch.mod["main"], out[0].buffer, acc_dtype, alu)
    if not chain.steps:
        if chain.stop:
            state.record(StepKind.EPILOGUE_LEFT, f"epilogue left to the host: {chain.stop}")
        return state if chain.stop else None
    if state.traced:
        state.record(StepKind.EPILOGUE_LEFT, "epilogue left to the host: fusing it is not a schedule "
                                        "primitive a MetaSchedule trace replays")
        return state
    saved = state.sch.copy(), list(state.steps), list(state.copies), list(state.copy_intrinsics)
    try:
        _fuse(state, out, chain, alu)
    except RewriteError as err:
        state.sch, state.steps, state.copies, state.copy_intrinsics = saved
        state.record(StepKind.EPILOGUE_LEFT, f"epilogue left to the host: {err}")
        return state
    capacity = {s.name: s.capacity for s in template.scopes if s.bounded}
    used = scratchpad_usage(state.sch.mod["main"], list(capacity))
    over = [f"{s} {used[s]} > {capacity[s]} B" for s in capacity if used[s] > capacity[s]]
    if over:
        state.sch, state.steps, state.copies, state.copy_intrinsics = saved
        state.record(StepKind.EPILOGUE_LEFT, "epilogue left to the host: its tiles do not fit the "
                                        f"scratchpad ({'; '.join(over)})")
        return state
    fused = ", ".join(s.describe() for s in chain.steps)
    tail = f"; then {chain.stop}, left to the host" if chain.stop else ""
    state.record(StepKind.EPILOGUE, f"fused epilogue on the accumulator tile: {fused}{tail}")
    if chain.stop:
        state.record(StepKind.EPILOGUE_LEFT, f"epilogue left to the host from {chain.stop}")
    state.fused = [(s.block, "block_dma_store" if s.narrow else "block_alu") for s in chain.steps]
    return state


def _fuse(state: RewriteState, out, chain: Epilogue, alu) -> None:
    sch = state.sch
    op, copy, _, _, nest = out
    acc_scope = op.scope
    loops = sch.get_loops(copy)
    at = loops[-nest - 1] if len(loops) > nest else None
    # the blocks between the tile's store and the first step: the store itself, and the
    # write-back of a reindexed output
    first_input = chain.steps[0].reads
    between = [copy]
    buffer = str(sch.get(copy).writes[0].source.name)  # what the store writes
    while buffer != first_input:
        found = readers(blocks_of(sch.mod["main"]), buffer)
        if len(found) != 1:
            raise RewriteError(f"the accumulator tile reaches {first_input} through {len(found)} "
                               f"readers of {buffer}")
        block = found[0]
        between.append(sch.get_sblock(block.name_hint))
        buffer = str(block.writes[0].source.name)
    steps = [sch.get_sblock(s.block) for s in chain.steps]
    if at is not None:
        for block in between[1:] + steps:
            _step_do(f"move {sch.get(block).name_hint} into the tile loop",
                     lambda b=block: sch.reverse_compute_at(b, at, preserve_unit_loops=True))
    # one block computing the whole chain from the accumulator tile: its operations then run
    # in place on that tile (dead once stored), so the epilogue needs no scratchpad of its own
    for block in between + steps[:-1]:
        _step_do(f"inline {sch.get(block).name_hint}", lambda b=block: sch.compute_inline(b))
    state.copies = [c for c in state.copies if c is not out]  # the tile's store is the chain's now
    last = steps[-1]
    tensors = dict.fromkeys(o.tensor for s in chain.steps for o in s.ops if o.tensor is not None)
    staged = [_load_operand(state, last, tensor, acc_scope, at) for tensor in tensors]
    _replace_with_alu_and_store(state, last, staged, alu, acc_scope, at)


def _step_do(what: str, fn):
    """``fn()``, a TVM error becoming a `RewriteError` that names ``what`` (not recorded as a
    step: the fusion as a whole is one)."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - TVM's errors have no common base
        raise RewriteError(f"step '{what}' failed: {schedule_error_line(err)}") from err


def _nest(sch, block, at) -> list:
    """The loops of ``block``'s own nest: those inside ``at`` (the tile loop it was moved
    into; None: all its loops)."""
    loops = list(sch.get_loops(block))
    if at is None:
        return loops
    at_var = sch.get(at).loop_var
    index = next((i for i, loop in enumerate(loops) if sch.get(loop).loop_var.same_as(at_var)), None)
    if index is None:
        raise RewriteError(f"block {sch.get(block).name_hint!r} is not inside the tile loop")
    return loops[index + 1:]


def _load_operand(state: RewriteState, block, buffer: str, scope: str, at) -> str:
    """Load the tensor operand ``buffer`` of ``block`` into ``scope`` by block DMA, once per
    tile (its window: the part of it the tile uses, e.g. the tile's channels of a bias); the
    name of its scratchpad copy, which ``block`` now reads."""
    sch = state.sch
    reads = sch.get(block).reads
    index = next(i for i, r in enumerate(reads) if str(r.source.name) == buffer)
    copy = _step_do(f"load {buffer} into {scope}", lambda: sch.cache_read(block, index, scope))
    if at is not None:
        _step_do(f"move the load of {buffer} into the tile loop",
                 lambda: sch.compute_at(copy, at, preserve_unit_loops=True))
    staged = str(sch.get(copy).writes[0].source.name)
    if not copy_by_block_dma(state, _nest(sch, copy, at), "load", scope, buffer):
        raise RewriteError(f"the load of {buffer} is not a plain window a block DMA moves")
    return staged


def _replace_with_alu_and_store(state: RewriteState, block, tensors: list, alu, scope: str, at) -> None:
    """Replace the composed chain's loop nest by one block: the ALU's operations on the whole
    accumulator tile, in place, then the block DMA's store of it (narrowing where the chain
    ends in a cast). ``tensors``: the scratchpad copies of its tensor operands."""
    sch = state.sch
    loops = _nest(sch, block, at)
    name = sch.get(block).name_hint
    nest = tile_nest(sch, loops) if loops else None
    if nest is None:
        raise RewriteError(f"block {name!r} is not alone in a nest of constant tile loops")
    if not always_true(nest.realize.predicate):
        raise RewriteError(f"block {name!r} runs under a predicate (a partial tile)")
    old = nest.realize.block
    store = old.body
    value = store.value.value if isinstance(store.value, tirx.Cast) else store.value
    x_load = _input_load(value, tensors, old)
    ops: list[AluOp] = []
    why = alu_ops(value, str(x_load.source.name), None, str(x_load.source.dtype), alu, ops)
    if why:
        raise RewriteError(f"the composed epilogue is not a sequence of ALU operations: {why}")
    z_aff, x_aff = nest.affine(store.indices), nest.affine(x_load.indices)
    if z_aff is None or x_aff is None:
        raise RewriteError(f"block {name!r}: its tiles are not affine windows of its loops")
    z_rm, x_rm = row_major(z_aff, nest.extents), row_major(x_aff, nest.extents)
    if z_rm is None or x_rm is None or z_rm[1] != x_rm[1]:
        raise RewriteError("the output's layout does not list the tile's elements in the "
                           "accumulator tile's order, so no block DMA stores it")
    out_region = window_region(store.buffer, z_aff, z_rm[0])
    acc_region = window_region(x_load.source, x_aff, x_rm[0])
    acc, dst = strided_view(acc_region, "X"), strided_view(out_region, "D")
    calls, reads, matches = _alu_calls(ops, alu, acc, value, old, nest, x_aff, x_rm[0])
    block_dma = state.template.block_dma
    calls.append(tirx.call_packed(block_dma.symbol("store"), dst, acc, *block_dma.scope_args.get(scope, ())))
    new = s_tir.SBlock([], [acc_region, *reads], [acc_region, out_region], old.name_hint + "_alu",
                       tirx.SeqStmt([tirx.Evaluate(c) for c in calls]), None, [],
                       [s_tir.MatchBufferRegion(dst, out_region), s_tir.MatchBufferRegion(acc, acc_region),
                        *matches])
    sch.state.replace(sch.get_sref(loops[0]), s_tir.SBlockRealize([], tirx.const(True, "bool"), new),
                      {old: new})
    name = state.template.name
    state.copy_intrinsics += [f"{name}.block_alu"] * (len(calls) - 1) + [f"{name}.block_dma_store"]


def _alu_calls(ops: list, alu, acc, value, block, nest, x_aff, window) -> tuple[list, list, list]:
    """(the ALU calls of ``ops`` on the accumulator view ``acc``, in place; the regions of
    their tensor operands; those operands' match buffers)."""
    # the accumulator window's dimension each loop walks alone, with step 1 (a broadcast
    # operand follows those)
    walks = {}
    for d, (coefs, _) in enumerate(x_aff):
        moving = [k for k, c in enumerate(coefs) if c and nest.extents[k] > 1]
        if len(moving) == 1 and coefs[moving[0]] == 1 and nest.extents[moving[0]] == window[d]:
            walks[moving[0]] = d
    calls, reads, matches, views = [], [], [], {}
    for alu_op in ops:
        if alu_op.tensor is None:
            calls.append(tirx.call_packed(alu.immediate, acc, acc, alu.opcode(alu_op.op), alu_op.imm))
            continue
        if alu_op.tensor not in views:
            views[alu_op.tensor] = _broadcast_view(alu_op.tensor, value, block, nest, walks, f"Y{len(views)}")
            y_region, yv, _ = views[alu_op.tensor]
            reads.append(y_region)
            matches.append(s_tir.MatchBufferRegion(yv, y_region))
        _, yv, dims = views[alu_op.tensor]
        calls.append(tirx.call_packed(alu.tensor, acc, acc, yv, alu.opcode(alu_op.op), *dims))
    return calls, reads, matches


def _broadcast_view(tensor, value, block, nest, walks, label):
    """(region, view, the accumulator dimension each of its dimensions follows; -1 for a unit
    dimension) of a tensor operand read at a window whose every dimension one loop of the
    tile walks alone (a bias)."""
    load = _operand_load(value, tensor, block)
    aff = nest.affine(load.indices)
    if aff is None:
        raise RewriteError(f"{tensor} is not read at an affine window of the tile's loops")
    dims, ext = [], []
    for coefs, _ in aff:
        moving = [k for k, c in enumerate(coefs) if c and nest.extents[k] > 1]
        if not moving:  # a unit dimension (the operand's own, or one the tile does not walk)
            dims.append(-1)
            ext.append(1)
            continue
        if len(moving) > 1 or coefs[moving[0]] != 1 or moving[0] not in walks:
            raise RewriteError(f"{tensor} is not a broadcast along dimensions of the accumulator tile")
        dims.append(walks[moving[0]])
        ext.append(nest.extents[moving[0]])
    region = window_region(load.source, aff, ext)
    return region, strided_view(region, label), dims


def _operand_load(expr, tensor: str, block):
    hits = [ld for ld in loads(expr) if str(ld.source.name) == tensor]
    if len(hits) != 1:
        raise RewriteError(f"block {block.name_hint!r}: cannot find its one read of {tensor}")
    return hits[0]


def _input_load(expr, tensors: list, block):
    """The load of the chain's input: the one that is no tensor operand (inlining renamed it
    to the accumulator tile's buffer)."""
    hits = [ld for ld in loads(expr) if str(ld.source.name) not in tensors]
    if len(hits) != 1:
        raise RewriteError(f"block {block.name_hint!r}: reads its input {len(hits)} times")
    return hits[0]


__all__ = ["fuse_epilogue"]
