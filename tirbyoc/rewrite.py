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

from .errors import RewriteError
from .matcher import Match, OperandMap
from .pattern import Access, BlockPattern, read_block


@dataclass(frozen=True)
class Rewritten:
    """A tensorized PrimFunc and how it was made."""

    func: object  # tirx.PrimFunc
    match: Match
    trace: object  # s_tir.Trace
    steps: tuple[str, ...]  # what was done, in words
    intrinsics: tuple[str, ...]  # the tensor intrinsics the result calls

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


def _index_map(fn, ndim: int):
    from ._tvm import tirx

    return tirx.IndexMap.from_func(fn, ndim=ndim, index_dtype="int32")


class _Tensorizer:
    def __init__(self, func, match: Match, target, schedule: bool | Callable):
        from ._tvm import Schedule

        self.m = match
        self.target = target
        self.schedule_fn = schedule
        self.where = f"{match.function}/{match.block} with {match.intrinsic.name}"
        self.steps: list[str] = []
        try:
            self.sch = Schedule(func)
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

    # -- helpers ------------------------------------------------------------------------
    def _access(self, op: OperandMap) -> Access:
        if op.is_output:
            return self.pattern.store
        for acc in self.pattern.loads:
            if acc.buffer == op.buffer:
                return acc
        raise RewriteError(f"{self.where}: operand {op.operand} reads {op.buffer}, which the block "
                           "no longer reads")

    def _region(self, kind: str, buffer: str) -> int:
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
            idx = self._region(kind, op.buffer)
            stage = sch.cache_write(blk, idx, scope) if kind == "write" else sch.cache_read(blk, idx, scope)
        if order != list(range(ndim)) or op.pack:
            pack = _packing(len(rest), op.tile) if op.pack else None

            def layout(*xs):
                xs = [xs[d] for d in order]
                return pack(*xs) if pack else xs

            desc = "pack " + "x".join(map(str, op.tile)) + " tiles" if op.pack else "transpose"
            with _Step(self, f"{desc} {op.operand} ({op.buffer}) with transform_layout"):
                sch.transform_layout(blk, (kind, self._region(kind, self._stage_name(stage, kind))),
                                     _index_map(layout, ndim))

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
            stage = fn(blk, self._region(kind, op.buffer), scope, _index_map(index_map, ndim))
        self.inline_after_pad.append((stage, kind))
        if op.pack:
            self.packs.append((op, kind, len(others)))

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

    def finish(self, loops: Loops) -> Rewritten:
        m, sch = self.m, self.sch
        group = m.group
        used = []
        if self.schedule_fn:
            from .cpu_schedule import default_schedule

            fn = default_schedule if self.schedule_fn is True else self.schedule_fn
            with _Step(self, "default schedule for the target"):
                note = fn(sch, self.blk, loops, m, self.target)
            if note:
                self.steps[-1] = note
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
        func = sch.mod["main"]
        libraries = self._libraries()
        if libraries:
            # Loaded now (RTLD_GLOBAL) so this process can JIT and run the function; the
            # paths travel with it for export_library / Relax external modules.
            for lib in libraries:
                lib.load()
            func = func.with_attr("tirbyoc.libraries", [str(lib.path) for lib in libraries])
            self.steps.append("links " + ", ".join(lib.name for lib in libraries))
        return Rewritten(func, m, sch.trace, tuple(self.steps), tuple(used))

    def _libraries(self) -> list:
        if self.m.template is None:
            return []
        from .registry import get_template

        return list(get_template(self.m.template).libraries)


def tensorize(func, match: Match, *, target=None, schedule: bool | Callable = True) -> Rewritten:
    """Rewrite ``match.block`` of ``func`` to call ``match.intrinsic`` (and its group's init).

    ``target``: what the default outer-loop schedule optimises for (default: the match's
    template's target). ``schedule``: True for the target's default schedule, False for
    none (loops as tiled, useful to read the IR), or a callable
    ``(sch, block, loops, match, target) -> note`` of your own.
    """
    from ._tvm import make_target

    if target is None and match.template is not None:
        from .registry import get_template

        target = get_template(match.template).target
    target = make_target(target) if target is not None else None
    rw = _Tensorizer(func, match, target, schedule)
    rw.canonicalize()
    rw.stage()
    rw.pad_and_pack()
    loops = rw.tile()
    return rw.finish(loops)


__all__ = ["Loops", "Rewritten", "tensorize"]
