"""The rewrite engine: a `Match` in, a tensorized PrimFunc out, with TVM's schedule primitives.

The matcher already decided, per operand, whether the implementation can read the workload
in place or what must happen first (`OperandMap.staging`). This module carries that out on
an ``s_tir.Schedule`` so the result comes with a replayable trace:

1. **Stage** operands that cannot be read in place. A transposed or tile-packed operand is
   copied whole (``cache_read`` / ``cache_write``) and its copy re-laid-out with
   ``transform_layout`` (the intrinsic's dimensions innermost, packed into tiles where the
   implementation reads a dense tile: VNNI's weights become [N/16, K/4, 16, 4] once per
   call, not per tile). An operand seen through a fused axis (implicit GEMM) gets a
   ``reindex_cache_read`` / ``reindex_cache_write`` copy laid out by the intrinsic's axes.
   Operands the intrinsic wants in another scope are staged into that scope.
2. **Canonicalise** the block with ``transform_block_layout`` so its iterators are the loops
   around the intrinsic followed by the intrinsic's own axes (`Match.block_index_map`).
3. **Pad** with ``pad_einsum`` where an axis is not a multiple of the intrinsic's width.
4. **Tile** each axis by the intrinsic's extent, order the loops (spatial outside, reduction,
   then the intrinsic's loops in its own order), let the target's default schedule arrange
   the outer loops (`tirbyoc.cpu_schedule` on CPUs), split off the reduction's init and
   ``tensorize`` compute and init with the template's intrinsics.

Every step that TVM refuses becomes a `RewriteError` naming the step; `tirbyoc.offload`
turns it into a clean fallback to TVM's default lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ._tvm import expr_dtype
from .cpu_schedule import _extent
from .errors import RewriteError
from .matcher import Match, OperandMap
from .pattern import _LOADS, Access, BlockPattern, _load_buffer, read_block


@dataclass(frozen=True)
class Rewritten:
    """A tensorized PrimFunc and how it was made."""

    func: object  # tirx.PrimFunc
    match: Match
    trace: object  # s_tir.Trace
    steps: tuple[str, ...]  # what was done, in words
    intrinsics: tuple[str, ...]  # the tensor intrinsics the result calls
    schedule: object = field(default=None, repr=False)  # the s_tir.Schedule that made it

    def describe(self) -> str:
        return "; ".join(self.steps)


@dataclass
class Loops:
    """Loop handles of the canonical nest, for the target's default schedule."""

    outer_spatial: list  # loops around the intrinsic that are not reductions
    outer_reduce: list  # reduction iterators left outside the intrinsic (conv's kh, kw)
    axis_spatial: list  # tile loops of the intrinsic's spatial axes
    axis_reduce: list  # tile loops of the intrinsic's reduction axes
    inner: list  # the intrinsic's own loops (tensorized)
    outer_names: list = field(default_factory=list)  # workload iterator of each outer loop


class _Step:
    """Context manager naming the current step so a TVM error says where it happened."""

    def __init__(self, rw: "_Tensorizer", what: str):
        self.rw, self.what = rw, what

    def __enter__(self):
        return self

    def __exit__(self, typ, err, tb):
        if err is None:
            self.rw.steps.append(self.what)
            return False
        if isinstance(err, RewriteError):
            return False
        text = str(err).strip().splitlines()
        msg = next((ln for ln in text if "Error message" in ln or ln.startswith("ScheduleError")), None)
        msg = msg or (text[-1] if text else type(err).__name__)
        raise RewriteError(f"{self.rw.where}: step '{self.what}' failed: {msg.strip()}") from err


def _pure(acc: Access) -> bool:
    """Every index is a plain iterator or a constant (``pad_einsum``'s requirement)."""
    for form in acc.indices:
        if form is None:
            return False
        if form.terms and (len(form.terms) != 1 or form.terms[0][1] != 1 or form.const):
            return False
    return True


def _packing(lead: int, tiles: tuple[int, ...]):
    """(lead dims..., view dims...) -> (lead..., view // tile..., view % tile...)."""

    def layout(*xs):
        head, tail = list(xs[:lead]), list(xs[lead:])
        return head + [x // t for x, t in zip(tail, tiles)] + [x % t for x, t in zip(tail, tiles)]

    return layout


def _relayout(order: list[int], lead: int, tiles: tuple[int, ...] | None):
    """Dimensions permuted to ``order``, then the last ones packed into ``tiles``."""
    pack = _packing(lead, tiles) if tiles else None

    def layout(*xs):
        xs = [xs[d] for d in order]
        return pack(*xs) if pack else xs

    return layout


def _index_map(fn, ndim: int):
    from ._tvm import tirx

    return tirx.IndexMap.from_func(fn, ndim=ndim, index_dtype="int32")


_COMMUTATIVE = ("Add", "Mul", "Max", "Min")


def _loads(expr, role_of) -> tuple:
    """The operand roles an expression loads, in order (what decides a commuted match)."""
    kind = type(expr).__name__
    if kind in _LOADS:
        return (role_of(str(_load_buffer(expr).name)),)
    out = ()
    for name in ("value", "a", "b"):
        child = getattr(expr, name, None) if kind in _COMMUTATIVE + ("Cast",) else None
        if child is not None:
            out += _loads(child, role_of)
    return out


def _commuted(w, d, w_role, d_role):
    """``w`` (a workload expression) with the operands of commutative nodes put in the
    order of ``d`` (the intrinsic's description): TVM's tensorize compares the two
    expressions literally, so ``B[j, k] * A[i, k]`` does not match ``A[i, k] * B[j, k]``."""
    from ._tvm import tirx

    kind = type(w).__name__
    if kind != type(d).__name__:
        return w
    if kind == "Cast":
        value = _commuted(w.value, d.value, w_role, d_role)
        return w if value.same_as(w.value) else tirx.Cast(expr_dtype(w), value)
    if kind not in _COMMUTATIVE:
        return w
    a, b = w.a, w.b
    if _loads(a, w_role) != _loads(d.a, d_role) and _loads(a, w_role) == _loads(d.b, d_role):
        a, b = b, a
    new_a, new_b = _commuted(a, d.a, w_role, d_role), _commuted(b, d.b, w_role, d_role)
    if new_a.same_as(w.a) and new_b.same_as(w.b):
        return w
    return getattr(tirx, kind)(new_a, new_b)


def _blockize_exact(sch, loop, traced: bool = False):
    """``sch.blockize(loop)`` with the outer block's bindings taken from the original block.

    TVM 0.27's blockize mis-divides a binding that adds two overlapping loops — a
    convolution window copied per tile, row = tile_row + kernel_row — into a fused one
    (``ax2_0 + ax1`` becomes ``ax2_0 * 12 + ax1`` under a predicate), which would copy the
    wrong rows. A binding that uses no loop inside ``loop`` belongs wholly to the outer block,
    so it is put back as it was, with the original predicate; the bindings split across the
    blockized loops are kept as TVM divided them. That repair is not a schedule primitive, so
    with ``traced`` (a MetaSchedule trace must replay the same IR) a blockize that needs it is
    refused instead.
    """
    from ._tvm import s_tir, tirx
    from .pattern import expr_vars

    inner, node = set(), sch.get(loop)
    while isinstance(node, tirx.For):
        inner.add(str(node.loop_var.name))
        node = node.body
    if not isinstance(node, s_tir.SBlockRealize):
        raise RewriteError("blockize: the loop does not hold one block")
    original = node
    if expr_vars(original.predicate) & inner:
        raise RewriteError("blockize: the block's predicate depends on the blockized loops")
    outer_block = sch.blockize(loop)
    parents = sch.get_loops(outer_block)
    if not parents:
        return outer_block
    parent = sch.get(parents[-1])
    realize = parent.body
    if not isinstance(realize, s_tir.SBlockRealize) or \
            len(realize.iter_values) != len(original.iter_values):
        raise RewriteError("blockize: the outer block does not keep one iterator per original one")
    values = [orig if not expr_vars(orig) & inner else new
              for orig, new in zip(original.iter_values, realize.iter_values)]
    if all(v.same_as(n) or str(v) == str(n) for v, n in zip(values, realize.iter_values)) and \
            str(original.predicate) == str(realize.predicate):
        return outer_block  # TVM's own blockize was exact
    if traced:
        raise RewriteError("blockize of a window copy needs tirbyoc's repair, which a "
                           "MetaSchedule trace cannot replay")
    fixed = s_tir.SBlockRealize(values, original.predicate, realize.block)
    sch.state.replace(sch.get_sref(parents[-1]),
                      tirx.For(parent.loop_var, parent.min, parent.extent, parent.kind, fixed,
                               parent.thread_binding, parent.annotations),
                      {realize.block: realize.block})
    return outer_block


class _Tensorizer:
    def __init__(self, sch, match: Match, target, schedule: bool | Callable, template=None,
                 *, traced: bool = False, plan: int = 0):
        self.m = match
        # traced: every change must be a schedule primitive (the trace is the result)
        self.traced = traced
        self.plan = plan  # which of the scratchpad tilings that fit (0: the best ranked)
        self.target = target
        self.schedule_fn = schedule
        self.where = f"{match.function}/{match.block} with {match.intrinsic.name}"
        self.steps: list[str] = []
        try:
            self.sch = sch
            self.blk = self.sch.get_sblock(match.block)
        except Exception as err:
            raise RewriteError(f"{self.where}: block {match.block!r} not found in the function "
                               f"({str(err).strip().splitlines()[-1]})") from err
        self.pattern: BlockPattern = read_block(self.sch.get(self.blk))
        self.axes = {a.axis: a for a in match.axes}
        absent = [a.axis for a in match.axes if not a.iters and a.size > 1]
        if absent:
            raise RewriteError(
                f"{self.where}: intrinsic axis {absent[0]} has no workload iterator (e.g. a GEMV "
                "under a GEMM intrinsic); the operands would need a broadcast dimension that "
                "TVM's reindex cannot add. Declare an intrinsic without that axis (a GEMV).")
        self.padded = any(a.padding for a in match.axes)
        self.template = template
        # operands the intrinsic wants in a bounded scratchpad: staged per tile by DMA
        self.spad = {op.operand: op for op in match.operands if self._bounded(op.scope)
                     and op.scope != op.workload_scope}
        # operands the intrinsic wants in GPU fragments: staged per warp tile (gpu_staging)
        gpu = target is not None and str(target.kind.name) == "cuda"
        self.fragments = {op.operand: op for op in match.operands
                          if gpu and op.scope != op.workload_scope and op.operand not in self.spad}
        self.tiled = {**self.spad, **self.fragments}  # staged per tile, not as a whole buffer
        self.fragment_copies: list[tuple] = []
        self.dma_used: list[str] = []
        self.copies: list[tuple] = []  # DMA copies to tensorize once the compute is done

    def _bounded(self, scope: str) -> bool:
        s = self.template.scope(scope, missing_ok=True) if self.template is not None else None
        return s is not None and s.bounded

    # -- helpers ------------------------------------------------------------------------
    def step(self, what: str) -> "_Step":
        """A named step (for staging modules): recorded, and named in any TVM error."""
        return _Step(self, what)

    def _access(self, op: OperandMap) -> Access:
        if op.is_output:
            return self.pattern.store
        for acc in self.pattern.loads:
            if acc.buffer == op.buffer:
                return acc
        raise RewriteError(f"{self.where}: operand {op.operand} reads {op.buffer}, which the block "
                           "no longer reads")

    def region(self, kind: str, buffer: str) -> int:
        block = self.sch.get(self.blk)
        regions = block.writes if kind == "write" else block.reads
        hits = [i for i, r in enumerate(regions) if str(r.source.name) == buffer]
        if len(hits) != 1:
            raise RewriteError(f"{self.where}: the block {kind}s {buffer!r} {len(hits)} times; "
                               "staging needs exactly one region")
        return hits[0]

    def _view_dims(self, acc: Access, op: OperandMap) -> list[int]:
        """The buffer dimension each intrinsic axis of the operand indexes (in view order)."""
        dims = []
        for a in op.view_axes:
            it = self.axes[a].iters[0]
            dims.append(next(d for d, vs in enumerate(acc.index_vars) if it in vs))
        return dims

    # -- step 1: staging ----------------------------------------------------------------
    def stage(self) -> None:
        self.packs: list[tuple[OperandMap, str, int]] = []  # (op, kind, #leading dims)
        self.inline_after_pad: list = []
        for op in self.m.operands:
            acc = self._access(op)
            scope = op.scope
            staged = not op.direct or scope != op.workload_scope
            if op.operand in self.tiled:
                # Only re-order it in its own memory here; DMA (or the warp's copies) move
                # tiles later (and lay them out, so no packing now).
                scope = op.workload_scope
                staged = "reindex" in op.staging or "transpose" in op.staging or \
                    not self._dma_ready(acc, op)
            if self.padded and not _pure(acc):
                staged = True
            if not staged:
                continue
            kind = "write" if op.is_output else "read"
            # Padding comes after staging (pad_einsum needs plain iterator indices), so a
            # padded block stages through reindex and packs after padding.
            whole = not self.padded and "reindex" not in op.staging and \
                all(len(self.axes[a].iters) == 1 for a in op.view_axes)
            if whole:
                self._stage_whole(op, acc, kind, scope)
            else:
                self._stage_reindex(op, kind, scope)

    def _dma_ready(self, acc: Access, op: OperandMap) -> bool:
        """A DMA copies a tile as rows with a stride: the operand's axes must index the
        buffer's dimensions in order, the last one its innermost (contiguous) dimension."""
        try:
            view = self._view_dims(acc, op)
        except StopIteration:
            return False
        return view == sorted(view) and view[-1] == len(acc.indices) - 1

    def _packs(self, op: OperandMap) -> bool:
        return op.pack and op.operand not in self.tiled

    def _stage_whole(self, op: OperandMap, acc: Access, kind: str, scope: str) -> None:
        """Copy the whole buffer and move the intrinsic's dimensions innermost (transpose),
        packed into tiles if the implementation reads dense tiles."""
        sch, blk = self.sch, self.blk
        view = self._view_dims(acc, op)
        ndim = len(acc.indices)
        rest = [d for d in range(ndim) if d not in view]
        order = rest + view
        what = f"stage {op.operand}: {'cache_write' if kind == 'write' else 'cache_read'} " \
               f"{op.buffer} into {scope}"
        with _Step(self, what):
            idx = self.region(kind, op.buffer)
            stage = sch.cache_write(blk, idx, scope) if kind == "write" else sch.cache_read(blk, idx, scope)
        pack = self._packs(op)
        if order != list(range(ndim)) or pack:
            desc = "pack " + "x".join(map(str, op.tile)) + " tiles" if pack else "transpose"
            with _Step(self, f"{desc} {op.operand} ({op.buffer}) with transform_layout"):
                sch.transform_layout(blk, (kind, self.region(kind, self._stage_name(stage, kind))),
                                     _index_map(_relayout(order, len(rest), op.tile if pack else None), ndim))

    def _stage_name(self, stage_block, kind: str) -> str:
        block = self.sch.get(stage_block)
        regions = block.reads if kind == "write" else block.writes
        return str(regions[0].source.name)

    def _stage_reindex(self, op: OperandMap, kind: str, scope: str) -> None:
        """Copy the operand into a buffer indexed by the canonical iterators (im2col for an
        implicit GEMM): [loops around the intrinsic that the access uses..., the operand's
        intrinsic axes]. An axis the workload lacks (GEMV's N) still gets its dimension, so
        padding can widen it."""
        m, sch, blk = self.m, self.sch, self.blk
        acc = self._access(op)
        # positions in the canonical iterators (workload and intrinsic names may clash)
        others = [i for i, it in enumerate(m.outer) if it in acc.vars]
        axis_pos = {a.axis: len(m.outer) + i for i, a in enumerate(m.axes)}
        ndim = len(m.outer) + len(m.axes)

        def index_map(*vs):
            return [vs[i] for i in others] + [vs[axis_pos[a]] for a in op.view_axes]

        fn = sch.reindex_cache_write if kind == "write" else sch.reindex_cache_read
        with _Step(self, f"stage {op.operand}: reindex {op.buffer} by the intrinsic's axes into {scope}"):
            stage = fn(blk, self.region(kind, op.buffer), scope, _index_map(index_map, ndim))
        self.inline_after_pad.append((stage, kind))
        if self._packs(op):
            self.packs.append((op, kind, len(others)))

    def commute(self) -> None:
        """Put the block's multiply-add operands in the intrinsic's order (see `_commuted`).
        Done on the block itself (``ScheduleState.replace``), so this step is not in the
        trace."""
        from ._tvm import s_tir, tirx
        from .tir_walk import iter_blocks

        block = self.sch.get(self.blk)
        desc_block = next((b for b in iter_blocks(self.m.intrinsic.desc.body)
                           if type(b.body).__name__ == "BufferStore"), None)
        if desc_block is None or type(block.body).__name__ != "BufferStore":
            return
        by_buffer = {op.buffer: op.operand for op in self.m.operands}
        value = _commuted(block.body.value, desc_block.body.value,
                          lambda n: by_buffer.get(n, n), lambda n: n)
        # tensorize also compares the read regions in order
        order = [str(r.source.name) for r in desc_block.reads]
        rank = {name: i for i, name in enumerate(order)}
        reads = sorted(block.reads, key=lambda r: rank.get(by_buffer.get(str(r.source.name)), len(order)))
        if value.same_as(block.body.value) and all(a.same_as(b) for a, b in zip(reads, block.reads)):
            return
        if self.traced:
            raise RewriteError(f"{self.where}: the block's operands are in another order than the "
                               "intrinsic's, which no schedule primitive changes; prepare the "
                               "workload first (tirbyoc.tuning.prepare)")
        body = tirx.BufferStore(block.body.buffer, value, block.body.indices)
        new = s_tir.SBlock(block.iter_vars, reads, block.writes, block.name_hint, body,
                           block.init, block.alloc_buffers, block.match_buffers, block.annotations)
        with _Step(self, "order the block's operands as the intrinsic's (multiply-add, reads)"):
            self.sch.state.replace(self.sch.get_sref(self.blk), new, {block: new})

    def canonicalize(self) -> None:
        with _Step(self, "transform_block_layout to (outer loops, intrinsic axes)"):
            self.sch.transform_block_layout(self.blk, self.m.block_index_map())

    def pad_and_pack(self) -> None:
        m = self.m
        if self.padded:
            factors = [1] * len(m.outer) + [a.size if a.padding else 1 for a in m.axes]
            pads = ", ".join(f"{a.axis} {a.extent}->{a.padded}" for a in m.axes if a.padding)
            with _Step(self, f"pad_einsum ({pads})"):
                self.sch.pad_einsum(self.blk, factors)
            block = self.sch.get(self.blk)
            touched = {str(r.source.name) for r in list(block.reads) + list(block.writes)}
            for stage, kind in self.inline_after_pad:
                if self._stage_name(stage, kind) in touched:
                    continue  # not padded: the compute still reads this copy itself
                try:  # fold the reindex copy into the pad copy: one staging pass, not two
                    if kind == "read":
                        self.sch.compute_inline(stage)
                    else:
                        self.sch.reverse_compute_inline(stage)
                except Exception:  # noqa: BLE001 - keeping both copies is still correct
                    pass
        for op, kind, lead in self.packs:
            layout = _packing(lead, op.tile)
            block = self.sch.get(self.blk)
            regions = block.writes if kind == "write" else block.reads
            idx = self._staged_region(regions, op)
            with _Step(self, f"pack {op.operand} into {'x'.join(map(str, op.tile))} tiles"):
                ndim = len(regions[idx].region)
                self.sch.transform_layout(self.blk, (kind, idx), _index_map(layout, ndim))

    def _staged_region(self, regions, op: OperandMap) -> int:
        name = op.buffer
        hits = [i for i, r in enumerate(regions) if str(r.source.name).startswith(name + "_")]
        if len(hits) != 1:
            raise RewriteError(f"{self.where}: cannot find the staged copy of {name}")
        return hits[0]

    # -- step 4: tiling ---------------------------------------------------------------------
    def tile(self) -> Loops:
        m, sch = self.m, self.sch
        loops = sch.get_loops(self.blk)
        n_outer = len(m.outer)
        if len(loops) < n_outer + len(m.axes):
            raise RewriteError(f"{self.where}: expected {n_outer + len(m.axes)} loops after "
                               f"canonicalisation, found {len(loops)}")
        loops = loops[-(n_outer + len(m.axes)):]
        kinds = dict(zip(m.iters, (it.kind for it in self.pattern.iters)))
        out = Loops([], [], [], [], [])
        for name, loop in zip(m.outer, loops[:n_outer]):
            (out.outer_reduce if kinds[name] == "R" else out.outer_spatial).append(loop)
            if kinds[name] != "R":
                out.outer_names.append(name)
        with _Step(self, "tile to " + "x".join(str(a.size) for a in m.axes)):
            for a, loop in zip(m.axes, loops[n_outer:]):
                o, i = sch.split(loop, [None, a.size])
                (out.axis_reduce if a.kind == "R" else out.axis_spatial).append(o)
                out.inner.append(i)
            sch.reorder(*out.outer_spatial, *out.axis_spatial, *out.outer_reduce, *out.axis_reduce,
                        *out.inner)
        return out

    # -- step 5 (scratchpad templates): DMA staging per tile ---------------------------------
    def stage_scratchpads(self, loops: Loops) -> Loops:
        """Group intrinsic tiles (and rows of the loops around the intrinsic) into scratchpad
        tiles that fit (`scratchpad.rank_tiles`), load each input's tile into its
        scratchpad at the innermost loop around it, keep the output tile in its scratchpad
        across the reduction and store it after, lay every scratchpad tile out as dense
        intrinsic tiles, and tensorize the copies with the template's DMA intrinsics where
        one fits (the rest stay copy loops). The allocation TVM will make is measured
        (`scratchpad_usage`); a plan whose real windows overflow a scope gives way to the
        next."""
        from .scratchpad import TileAxis, TileOperand, rank_tiles, scratchpad_usage

        m = self.m
        dtypes = {o.name: o.dtype for o in m.intrinsic.operands}
        scopes = {op.scope: self.template.scope(op.scope) for op in self.spad.values()}
        kinds = {it.name: it.kind for it in self.pattern.iters}
        outer = []  # (name, loop, extent, reduce)
        for name, loop in zip(m.outer, self._outer_loops(loops)):
            outer.append((name, loop, _extent(self.sch, loop) or 1, kinds[name] == "R"))
        # keyed "loop NAME": a workload iterator may share its name with an intrinsic axis
        outer = [(f"loop {n}", loop, e, r) for n, loop, e, r in outer]
        axes = [TileAxis(n, 1, e, r) for n, _, e, r in outer]
        axes += [TileAxis(a.axis, a.size, a.padded // a.size, a.kind == "R") for a in m.axes]
        tile_ops = []
        for op in self.spad.values():
            uses = {f"loop {v}" for v in self._access(op).vars}
            tile_ops.append(TileOperand(op.operand, op.scope,
                                        tuple(n for n, *_ in outer if n in uses) + op.view_axes,
                                        dtypes[op.operand], op.is_output))
        capacity = {s: sc.capacity for s, sc in scopes.items()}
        plans = rank_tiles(axes, tile_ops, capacity, {s: sc.alignment for s, sc in scopes.items()},
                           self.where)
        base, steps = self.sch, list(self.steps)
        tried, fitting = [], 0
        for plan in plans[:8 + self.plan]:
            self.sch, self.steps, self.copies = base.copy(), list(steps), []
            out = self._split_for(plan, outer, loops)
            used = scratchpad_usage(self.sch.mod["main"], list(scopes))
            if all(used[s] <= capacity[s] for s in scopes):
                fitting += 1
                if fitting > self.plan:
                    self.steps.insert(len(steps), plan.describe(used))
                    return out
                continue
            tried.append(", ".join(f"{s} {used[s]} > {capacity[s]} B" for s in scopes if used[s] > capacity[s]))
        if fitting:
            raise RewriteError(f"{self.where}: only {fitting} scratchpad tilings fit "
                               f"(asked for tiling {self.plan})")
        raise RewriteError(f"{self.where}: the {len(tried)} best scratchpad tilings overflow once "
                           f"TVM allocates their windows ({'; '.join(tried)})")

    def _outer_loops(self, loops: Loops) -> list:
        """The loops around the intrinsic in the order of ``Match.outer``."""
        kinds = {it.name: it.kind for it in self.pattern.iters}
        spatial, reduce = iter(loops.outer_spatial), iter(loops.outer_reduce)
        return [next(reduce) if kinds[n] == "R" else next(spatial) for n in self.m.outer]

    def _split_for(self, plan, outer: list, loops: Loops) -> Loops:
        """Cut every loop by the plan, order tile loops outside, then stage each operand."""
        sch, m = self.sch, self.m
        so, ro, si, ri = [], [], [], []
        with _Step(self, "split into scratchpad tiles"):
            cut = [(n, loop, r) for n, loop, _, r in outer]
            tile_loops = iter(loops.axis_spatial), iter(loops.axis_reduce)
            cut += [(a.axis, next(tile_loops[a.kind == "R"]), a.kind == "R") for a in m.axes]
            for name, loop, reduce in cut:
                o, i = sch.split(loop, [None, plan.factors[name]])
                (ro if reduce else so).append(o)
                (ri if reduce else si).append(i)
            sch.reorder(*so, *ro, *si, *ri, *loops.inner)
        load_at = (so + ro)[-1:] or [None]
        store_at = so[-1:] or [None]
        for op in self.spad.values():
            self._dma(op, store_at[0] if op.is_output else load_at[0])
        n_out_s = sum(1 for *_, r in outer if not r)
        n_out_r = len(outer) - n_out_s
        return Loops(so + si[:n_out_s], ro + ri[:n_out_r], si[n_out_s:], ri[n_out_r:], loops.inner,
                     loops.outer_names)

    def feeding(self, op: OperandMap, kind: str) -> str:
        """The buffer the compute block now uses for ``op`` (the workload's, or its staged
        or padded copy)."""
        block = self.sch.get(self.blk)
        regions = block.writes if kind == "write" else block.reads
        names = [str(r.source.name) for r in regions]
        hits = [n for n in names if n == op.buffer] or [n for n in names if n.startswith(op.buffer + "_")]
        if len(hits) != 1:
            raise RewriteError(f"{self.where}: cannot tell which buffer feeds operand {op.operand} "
                               f"(candidates {hits or names})")
        return hits[0]

    def _dims_of(self, buffer: str, kind: str, op: OperandMap) -> tuple[int, list[int]]:
        """(ndim, the dimension of ``buffer`` each of the operand's axes indexes)."""
        block = self.sch.get(self.blk)
        pat = read_block(block)
        acc = pat.store if kind == "write" else next(a for a in pat.loads if a.buffer == buffer)
        names = [str(iv.var.name) for iv in block.iter_vars]
        pos = {a.axis: len(self.m.outer) + i for i, a in enumerate(self.m.axes)}
        dims = []
        for a in op.view_axes:
            var = names[pos[a]]
            hits = [d for d, vs in enumerate(acc.index_vars) if var in vs]
            if len(hits) != 1:
                raise RewriteError(f"{self.where}: axis {a} of {op.operand} does not index one "
                                   f"dimension of {buffer}")
            dims.append(hits[0])
        return len(acc.indices), dims

    def _dma(self, op: OperandMap, at) -> None:
        """Stage one operand's scratchpad tile at loop ``at`` and tensorize its copy."""
        sch, blk = self.sch, self.blk
        kind = "write" if op.is_output else "read"
        src = self.feeding(op, kind)
        ndim, view = self._dims_of(src, kind, op)
        rest = [d for d in range(ndim) if d not in view]
        verb = "store" if op.is_output else "load"
        with _Step(self, f"DMA {verb} {op.operand} tiles of {src} in {op.scope}"):
            idx = self.region(kind, src)
            if op.is_output:
                stage = sch.cache_write(blk, idx, op.scope)
                if at is not None:
                    sch.reverse_compute_at(stage, at, preserve_unit_loops=True)
            else:
                stage = sch.cache_read(blk, idx, op.scope)
                if at is not None:
                    sch.compute_at(stage, at, preserve_unit_loops=True)
            staged = self._stage_name(stage, kind)
            sch.transform_layout(blk, (kind, self.region(kind, staged)),
                                 _index_map(_relayout(rest + view, len(rest), op.tile), ndim))
            # the copy's own loops run over the source region: cut them into intrinsic tiles
            copy_loops = sch.get_loops(stage)[-ndim:]
            outs, ins = [], []
            for d, t in zip(view, op.tile):
                o, i = sch.split(copy_loops[d], [None, t])
                outs.append(o)
                ins.append(i)
            sch.reorder(*[copy_loops[d] for d in rest], *outs, *ins)
        # Tensorized last: a tensorized window copy (a halo) ends TVM's stage-pipeline
        # analysis of the scope, which compute_at on the other operands needs.
        self.copies.append((op, stage, ins, kind))

    def _tensorize_copy(self, op: OperandMap, stage, loops: list, kind: str) -> None:
        block = self.sch.get(stage)
        read, write = block.reads[0].source, block.writes[0].source
        role = "store" if kind == "write" else "load"
        candidates = [i for i in self.template.intrinsics()
                      if i.role.value == role and len(i.operands) == 2
                      and (i.operands[0].scope, i.operands[1].scope) == (str(read.scope()), str(write.scope()))
                      and (i.operands[0].dtype, i.operands[1].dtype) == (str(read.dtype), str(write.dtype))]
        for intrin in candidates:
            intrin.register()
            for loop in loops:
                trial = self.sch.copy()
                try:
                    trial.tensorize(_blockize_exact(trial, loop, self.traced), intrin.name)
                except Exception:  # noqa: BLE001 - the next candidate may fit
                    continue
                with _Step(self, f"tensorize the {role} of {op.operand} with {intrin.name}"):
                    self.sch.tensorize(_blockize_exact(self.sch, loop, self.traced), intrin.name)
                self.dma_used.append(intrin.name)
                return
        tile = "x".join(map(str, op.tile))
        self.steps.append(f"{role} of {op.operand} ({read.dtype} {read.scope()} -> {write.dtype} "
                          f"{write.scope()}, {tile} tiles) left as a copy loop: no DMA intrinsic of "
                          f"the template fits ({len(candidates)} tried)")

    def finish(self, loops: Loops) -> Rewritten:
        m, sch = self.m, self.sch
        group = m.group
        used = []
        if self.schedule_fn and not self.tiled:
            from .cpu_schedule import default_schedule

            fn = default_schedule if self.schedule_fn is True else self.schedule_fn
            with _Step(self, "default schedule for the target"):
                note = fn(sch, self.blk, loops, m, self.target)
            if note:
                self.steps[-1] = note
        for copy in self.copies:
            self._tensorize_copy(*copy)
        if self.fragment_copies:
            from .gpu_staging import tensorize_copies

            tensorize_copies(self, self.fragment_copies)
        init_block = None
        reduce_loops = loops.outer_reduce + loops.axis_reduce
        if self.pattern.init_value is not None and reduce_loops:
            with _Step(self, "decompose_reduction (split off the init)"):
                init_block = sch.decompose_reduction(self.blk, reduce_loops[0])
        init_loops = sch.get_loops(init_block) if init_block is not None else None
        intrin = m.intrinsic
        intrin.register()
        with _Step(self, f"tensorize with {intrin.name}"):
            sch.tensorize(loops.inner[0], intrin.name)
        used.append(intrin.name)
        if init_block is not None and group is not None and group.init is not None:
            n_spatial = sum(1 for a in m.axes if a.kind == "S")
            group.init.register()
            try:
                with _Step(self, f"tensorize the init with {group.init.name}"):
                    sch.tensorize(init_loops[-n_spatial], group.init.name)
                used.append(group.init.name)
            except RewriteError:
                self.steps.append("init left to TVM (its tile does not fit the init intrinsic)")
        used += self.dma_used
        func = sch.mod["main"]
        libraries = self._libraries()
        if libraries:
            # Loaded now (RTLD_GLOBAL) so this process can JIT and run the function; the
            # paths travel with it for export_library / Relax external modules.
            for lib in libraries:
                lib.load()
            func = func.with_attr("tirbyoc.libraries", [str(lib.path) for lib in libraries])
            self.steps.append("links " + ", ".join(lib.name for lib in libraries))
        return Rewritten(func, m, sch.trace, tuple(self.steps), tuple(used), sch)

    def _libraries(self) -> list:
        return list(self.template.libraries) if self.template is not None else []


def _resolve(match: Match, target, template):
    from ._tvm import make_target

    if template is None and match.template is not None:
        from .registry import get_template

        template = get_template(match.template)
    if target is None and template is not None:
        target = template.target
    return (make_target(target) if target is not None else None), template


def _carry_out(rw: _Tensorizer) -> Rewritten:
    rw.commute()
    rw.canonicalize()
    rw.stage()
    rw.pad_and_pack()
    loops = rw.tile()
    if rw.spad:
        loops = rw.stage_scratchpads(loops)
    if rw.fragments:
        from .gpu_staging import stage_fragments

        loops, rw.fragment_copies = stage_fragments(rw, loops)
    return rw.finish(loops)


def tensorize(func, match: Match, *, target=None, schedule: bool | Callable = True,
              template=None) -> Rewritten:
    """Rewrite ``match.block`` of ``func`` to call ``match.intrinsic`` (and its group's init).

    ``target``: what the default outer-loop schedule optimises for (default: the match's
    template's target). ``schedule``: True for the target's default schedule, False for
    none (loops as tiled, useful to read the IR), or a callable
    ``(sch, block, loops, match, target) -> note`` of your own. ``template``: the Template
    the match came from (its scopes' capacities and DMA intrinsics), default: the one
    registered under ``match.template`` — pass it for an unregistered variant.
    """
    from ._tvm import Schedule
    from .normalize import trivial_loops

    target, template = _resolve(match, target, template)
    if match.init not in (None, "in-block"):
        # a separate init block makes the output two-writer, which staging cannot handle
        from dataclasses import replace

        from .init_merge import merge_separate_init

        merged = merge_separate_init(func, match.init, match.block)
        if merged is not None:
            func, match = merged, replace(match, init="in-block")
    # a block whose loops a schedule split or fused: one loop per iterator again, so that
    # transform_block_layout can re-tile it for the intrinsic
    func = trivial_loops(func, match.block) or func
    try:
        sch = Schedule(func)
    except Exception as err:
        raise RewriteError(f"{match.function}/{match.block}: TVM cannot schedule the function "
                           f"({str(err).strip().splitlines()[-1]})") from err
    return _carry_out(_Tensorizer(sch, match, target, schedule, template))


def tensorize_in(sch, match: Match, *, target=None, schedule: bool | Callable = True,
                 template=None, plan: int = 0) -> Rewritten:
    """`tensorize` on a schedule you hold (MetaSchedule's), with schedule primitives only,
    so that ``sch``'s trace replays the rewrite. ``sch`` is left as it was; the result's
    ``schedule`` carries on from it. Steps that are not primitives (folding a separate init
    block, reordering a commuted product, repairing a window blockize) are refused with a
    `RewriteError`: `tirbyoc.tuning.prepare` does the first two on the workload beforehand.
    ``plan``: on a scratchpad template, which of the tilings that fit to use (0: the best)."""
    target, template = _resolve(match, target, template)
    if match.init not in (None, "in-block"):
        raise RewriteError(f"{match.function}/{match.block}: the reduction's init is the separate "
                           f"block {match.init!r}; prepare the workload first "
                           "(tirbyoc.tuning.prepare folds it into the block)")
    return _carry_out(_Tensorizer(sch.copy(), match, target, schedule, template, traced=True,
                                  plan=plan))


__all__ = ["Loops", "Rewritten", "tensorize", "tensorize_in"]
