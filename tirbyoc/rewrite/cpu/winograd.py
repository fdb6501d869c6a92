"""Winograd's minimal filtering for a float 3x3 convolution of stride 1, F(m x m, 3 x 3).

A 3x3 convolution spends 9 x C multiply-adds on each output. Winograd's form (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016) computes an m x m tile of outputs
from the (m + 2) x (m + 2) input tile ``d`` around it as ``A^T [(G g G^T) * (B^T d B)] A``,
``*`` elementwise over the alpha x alpha = (m + 2)^2 transformed positions: the sum over the
channels becomes alpha^2 matrix products of tiles x C by C x K, 2.25x fewer multiply-adds at
m = 2 and 4x at m = 4, the rest additions in the transforms. `winograd_form` rewrites each
such convolution block ``conv`` of a PrimFunc into four:

- ``conv_weight``: ``U[e, c, k]``, the weight transformed (``G g G^T`` at ``e = i * alpha +
  j``); it reads the weight alone, so where the weight is a constant it runs once, at compile
  time (`tirbyoc.relax.prepack` takes it as a weight copy);
- ``conv_input_rows`` then ``conv_input``: ``V[e, p, c]``, each input tile ``p = (n, tile
  row, tile column)`` transformed as two one-sided passes (``B^T d``, then ``. B``: alpha
  combinations of up to alpha terms each, not alpha^2 of alpha^2), the first computed per tile
  and channel vector inside the second's loops; the convolution's padding read through (its
  copy inlined), the positions unrolled and the channels in vector lanes;
- ``conv`` itself: ``M[e, p, k] = sum_c V[e, p, c] * U[e, c, k]``, the matrix products a
  template's core takes (a batched matmul whose second operand is a constant; the block keeps
  the convolution's name, so a report counts the convolution's multiply-adds as offloaded);
- ``conv_output_rows`` then ``conv_output``: the output tile ``A^T M A``, two one-sided passes
  the same way, written where the convolution wrote, the elementwise work after it (bias,
  residual, ReLU) inlined into it.

A template declares the largest form it takes (``Template.winograd``: x86_fp32's cores, m =
4); `tile_for` takes m = 2 where m = 4's products would have under `MIN_TILES` tiles (its
transformed weight, 4x the direct one, would then cost more to read than the multiply-adds
saved). `winograd_for` applies it before matching, so the offload's verification compares the
rewritten function with TVM's build of the direct sum. The transforms' coefficients (Lavin
and Gray's matrices) are exact in float32 but for F(4 x 4)'s sixths and twelfths; the results
differ from the direct sum by rounding alone: on ResNet-50's 3x3 layers 1-2e-6 of the
output's scale at m = 2, 0.6-1.3e-5 at m = 4 (a float32 sum's order changes as much over a
few thousand terms). Alone, at one thread on a Zen 4, m = 4 ran those layers 2.0-3.5x
faster than the direct sum, m = 2 1.6-2.2x.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as Q

from tirbyoc._tvm import TensorLoad, iter_blocks, iter_kind, root_block, s_tir, sym, te, tirx, tvm_ffi, vector_bytes
from tirbyoc.ir.tir_walk import with_root_body
from tirbyoc.rewrite.cpu.register_blocks import lanes_dividing
from tirbyoc.rewrite.cpu.weight_layout import layout_free_positions
from tirbyoc.rewrite.foundation.steps import Step, StepKind

# (B^T, G, A^T) by output tile m, for a 3-tap filter (Lavin and Gray's F(2, 3) and F(4, 3))
MATRICES = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [Q(1, 2), Q(1, 2), Q(1, 2)], [Q(1, 2), Q(-1, 2), Q(1, 2)], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[Q(1, 4), 0, 0], [Q(-1, 6), Q(-1, 6), Q(-1, 6)], [Q(-1, 6), Q(1, 6), Q(-1, 6)],
         [Q(1, 24), Q(1, 12), Q(1, 6)], [Q(1, 24), Q(-1, 12), Q(1, 6)], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
TILES = tuple(MATRICES)


@dataclass(frozen=True)
class Conv3x3:
    """A 3x3, stride-1 float32 convolution block ``out[n, h, w, k] += data[n, h + kh, w + kw, c]
    * weight[...]`` (the weight's dimensions any order of k, kh, kw, c: ``weight_axes``)."""

    block: str
    out: object  # Buffer [N, Ho, Wo, K]
    data: object  # Buffer [N, >= Ho + 2, >= Wo + 2, C] (the padded input)
    weight: object  # Buffer, 4-d
    weight_axes: tuple  # per weight dimension: "k", "kh", "kw" or "c"

    @property
    def shape(self) -> tuple:
        """(N, Ho, Wo, K, C)."""
        n, ho, wo, k = (int(s) for s in self.out.shape)
        return n, ho, wo, k, int(self.data.shape[3])

    def macs(self) -> int:
        n, ho, wo, k, c = self.shape
        return n * ho * wo * k * c * 9

    def tiles(self, m: int) -> int:
        """Output tiles of m x m, the rows of each matrix product: N x ceil(Ho / m) x ceil(Wo / m)."""
        n, ho, wo, _, _ = self.shape
        return n * -(-ho // m) * -(-wo // m)

    def winograd_macs(self, m: int) -> int:
        _, _, _, k, c = self.shape
        return self.tiles(m) * (m + 2) ** 2 * c * k


def conv3x3(block) -> Conv3x3 | str:
    """The block as a `Conv3x3` (its iterators in any order), or why it is not one."""
    kinds = sorted(iter_kind(iv) for iv in block.iter_vars)
    if kinds != ["R"] * 3 + ["S"] * 4:
        return "not four spatial and three reduction iterators"
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is None or len(store.buffer.shape) != 4:
        return "not one store into a 4-d buffer with an init"
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.a, TensorLoad) and isinstance(value.b, tirx.Mul)
            and value.a.source.same_as(store.buffer) and all(isinstance(x, TensorLoad) for x in (value.b.a, value.b.b))):
        return "not out = out + a * b"
    if any(str(b.dtype) != "float32" for b in (store.buffer, value.b.a.source, value.b.b.source)):
        return "not float32"
    window = _window(block, store.indices, value.b.a) or _window(block, store.indices, value.b.b)
    if window is None:
        return "the input is not read [n, h + kh, w + kw, c] (stride 1, no dilation, NHWC)"
    names, data = window
    weight = value.b.b if data.same_as(value.b.a) else value.b.a
    axes = tuple(next((n for var, n in names.items() if i.same_as(var)), None) for i in weight.indices)
    if sorted(map(str, axes)) != ["c", "k", "kh", "kw"]:
        return "the weight is not indexed by k, kh, kw, c"
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    if any(not isinstance(e, tirx.IntImm) for e in extents.values()) or [
            int(extents[v]) for v, n in names.items() if n in ("kh", "kw")] != [3, 3]:
        return "not a static 3x3 window"
    return Conv3x3(str(block.name_hint), store.buffer, data.source, weight.source, axes)


def _window(block, out_indices, data):
    """({iterator: "k" / "kh" / "kw" / "c"}, ``data``) when the output is indexed by four
    spatial iterators [n, h, w, k] and ``data`` is read [n, h + kh, w + kw, c] by the three
    reduction ones; None otherwise."""
    spatial = [iv.var for iv in block.iter_vars if iter_kind(iv) == "S"]
    reduce = [iv.var for iv in block.iter_vars if iter_kind(iv) == "R"]
    if len(data.indices) != 4 or not all(any(i.same_as(v) for v in spatial) for i in out_indices):
        return None
    n, h, w, k = out_indices
    ana = sym.Analyzer()
    kh, kw = ana.simplify(data.indices[1] - h), ana.simplify(data.indices[2] - w)
    c = data.indices[3]
    found = [next((v for v in reduce if x.same_as(v)), None) for x in (kh, kw, c)]
    if not data.indices[0].same_as(n) or any(v is None for v in found) or len({id(v) for v in found}) != 3:
        return None
    return {k: "k", found[0]: "kh", found[1]: "kw", found[2]: "c"}, data


def _f32(value) -> tirx.PrimExpr:
    return tirx.const(float(value), "float32")


def _combination(coefficients, terms):
    """sum(c * t) over the nonzero coefficients, a coefficient of +-1 as an addition."""
    out = None
    for c, t in zip(coefficients, terms):
        if c == 0:
            continue
        t = t if c == 1 else -t if c == -1 else t * _f32(c)
        out = t if out is None else out + t
    return out if out is not None else _f32(0)


def _by_index(index, values):
    """``values[index]`` for an expression ``index``: selects a loop unrolled to constants folds."""
    out = values[-1]
    for i in range(len(values) - 2, -1, -1):
        out = tirx.Select(index == i, values[i], out)
    return out


def _two_sided(left, right, tile):
    """The alpha^2 (or m^2) entries of ``left . tile . right^T`` as combinations of the tile."""
    rows, cols = len(tile), len(tile[0])
    return [_combination([left[i][a] * right[j][b] for a in range(rows) for b in range(cols)],
                         [tile[a][b] for a in range(rows) for b in range(cols)])
            for i in range(len(left)) for j in range(len(right))]


def _rows_of(matrix, values):
    """``matrix . values`` (a list), one combination per row of ``matrix``."""
    return [_combination(row, values) for row in matrix]


def _stages(conv: Conv3x3, m: int):
    """A PrimFunc (data, weight, out) computing ``conv`` in Winograd's form with tile ``m``.
    Each two-sided transform runs as two one-sided passes (``B^T d``, then ``. B``): alpha
    combinations of up to alpha terms each, where the whole product would be alpha^2 of up to
    alpha^2 (F(4 x 4): 36 of 36, which TVM and LLVM took 15 s a function to build)."""
    bt, g, at = MATRICES[m]
    alpha = m + 2
    _, ho, wo, k_, c_ = conv.shape
    nh, nw = -(-ho // m), -(-wo // m)
    tiles = conv.tiles(m)
    i64 = lambda *dims: tuple(tirx.IntImm("int64", d) for d in dims)  # noqa: E731 - legalized functions' index type
    data = te.placeholder(conv.data.shape, "float32", name="data")
    weight = te.placeholder(conv.weight.shape, "float32", name="weight")
    _, hd, wd, _ = (int(s) for s in conv.data.shape)

    def weight_at(k, kh, kw, c):
        at_axis = {"k": k, "kh": kh, "kw": kw, "c": c}
        return weight[tuple(at_axis[a] for a in conv.weight_axes)]

    u = te.compute(i64(alpha * alpha, c_, k_), lambda e, c, k: _by_index(e, _two_sided(
        g, g, [[weight_at(k, a, b, c) for b in range(3)] for a in range(3)])), name=f"{conv.block}_weight")

    guarded = nh * m + 2 > hd or nw * m + 2 > wd  # the last tiles read past the (padded) input

    def tile_rows(i, b, p, c):  # (B^T d)[i, b] of tile p
        n, th, tw = p // (nh * nw), p // nw % nh, p % nw
        def at(a):
            h, w = th * m + a, tw * m + b
            read = data[n, h, w, c]
            return tirx.if_then_else(tirx.all(h < hd, w < wd), read, _f32(0)) if guarded else read
        return _by_index(i, _rows_of(bt, [at(a) for a in range(alpha)]))

    rows = te.compute(i64(alpha, alpha, tiles, c_), tile_rows, name=f"{conv.block}_input_rows")
    v = te.compute(i64(alpha * alpha, tiles, c_), lambda e, p, c: _by_index(
        e % alpha, _rows_of(bt, [rows[e // alpha, b, p, c] for b in range(alpha)])), name=f"{conv.block}_input")
    r = te.reduce_axis(i64(0, c_), name="c")
    # the matrix products carry the convolution's name: they are what computes it now
    mm = te.compute(i64(alpha * alpha, tiles, k_), lambda e, p, k: te.sum(v[e, p, r] * u[e, r, k], axis=r),
                    name=conv.block)
    out_rows = te.compute(i64(m, alpha, tiles, k_), lambda i, j, p, k: _by_index(
        i, _rows_of(at, [mm[a * alpha + j, p, k] for a in range(alpha)])), name=f"{conv.block}_output_rows")

    def output(n, h, w, k):
        p = n * nh * nw + h // m * nw + w // m
        return _by_index(w % m, _rows_of(at, [out_rows[h % m, j, p, k] for j in range(alpha)]))

    out = te.compute(conv.out.shape, output, name=f"{conv.block}_output")
    return te.create_prim_func([data, weight, out])


def _lanes(sch, loop, lanes: int) -> int:
    """The most lanes, a power of two up to ``lanes``, that divide the loop's extent."""
    return lanes_dividing(int(sch.get(loop).extent), lanes, 1)


def _schedule_transforms(sch, name: str, m: int, lanes: int) -> None:
    """The input and output transforms as loops over tiles (parallel) and channel vectors,
    each tile's one-sided passes computed there (``compute_at``) with their positions unrolled
    (each position's coefficients fold to constants) and channels in vector lanes; the
    elementwise blocks after the output inlined into it."""
    alpha = m + 2
    v = sch.get_sblock(f"{name}_input")
    e, p, c = sch.get_loops(v)
    c_out, c_in = sch.split(c, [None, _lanes(sch, c, lanes)])
    i, j = sch.split(e, [alpha, alpha])
    sch.reorder(p, c_out, i, j, c_in)
    sch.parallel(p)
    _per_tile(sch, sch.get_sblock(f"{name}_input_rows"), c_out)
    sch.unroll(i)
    sch.unroll(j)
    sch.vectorize(c_in)
    y = sch.get_sblock(f"{name}_output")
    _inline_epilogue(sch, y)
    n, h, w, k = sch.get_loops(y)
    h_out, h_in = sch.split(h, [None, m])
    w_out, w_in = sch.split(w, [None, m])
    k_out, k_in = sch.split(k, [None, _lanes(sch, k, lanes)])
    sch.reorder(n, h_out, w_out, k_out, h_in, w_in, k_in)
    sch.parallel(sch.fuse(n, h_out, w_out))
    _per_tile(sch, sch.get_sblock(f"{name}_output_rows"), k_out)
    sch.unroll(h_in)
    sch.unroll(w_in)
    sch.vectorize(k_in)


def _per_tile(sch, block, loop) -> None:
    """A one-sided pass computed under ``loop`` (a tile's channel vector): its two position
    loops unrolled, its channels in vector lanes."""
    sch.compute_at(block, loop, preserve_unit_loops=True)
    *_, first, second, tile, channels = sch.get_loops(block)
    sch.unroll(first)
    sch.unroll(second)
    sch.vectorize(channels)


def _inline_epilogue(sch, block) -> int:
    """The chain of single elementwise consumers after ``block`` inlined into it; how many."""
    done = 0
    while len(consumers := sch.get_consumers(block)) == 1:
        try:
            sch.reverse_compute_inline(consumers[0])
        except s_tir.ScheduleError:  # not elementwise on its output: it stays a nest of its own
            return done
        done += 1
    return done


@dataclass(frozen=True)
class WinogradConv:
    """One convolution `winograd_form` rewrote: its block, shape, tile and multiply-adds."""

    block: str
    shape: tuple  # (N, Ho, Wo, K, C)
    tile: int
    macs: int  # the direct convolution's
    winograd_macs: int  # the matrix products'

    def note(self) -> str:
        n, ho, wo, k, c = self.shape
        a = self.tile + 2
        return (f"{self.block} in Winograd's form F({self.tile}x{self.tile}, 3x3): {a * a} matrix products of "
                f"{self.winograd_macs // (a * a * c * k)} tiles x {c} x {k} ({self.macs / self.winograd_macs:.2f}x "
                "fewer multiply-adds), its input and output transformed in vector lanes, its weight once, the "
                "elementwise work after it in its output transform")


def winograd_form(func, tile: int, lanes: int) -> tuple:
    """(``func`` with each `Conv3x3` whose weight is a constant parameter (layout-free) in
    Winograd's form F(m x m, 3x3), m up to ``tile`` as `tile_for` chooses, vectors of
    ``lanes`` floats; the `WinogradConv` of each). Anything else comes back unchanged."""
    root = root_block(func)
    constant = {func.params[i] for i in layout_free_positions(func)}
    if root is None or tile not in MATRICES or not constant:
        return func, ()
    done = []
    for block in [b for b in iter_blocks(root.body) if b.init is not None]:
        conv = conv3x3(block)
        if isinstance(conv, Conv3x3) and any(conv.weight.same_as(p) for p in constant) and _pays(conv):
            m = tile_for(conv, tile)
            func = _spliced(func, conv, m)
            done.append(WinogradConv(conv.block, conv.shape, m, conv.macs(), conv.winograd_macs(m)))
    if not done:
        return func, ()
    sch = s_tir.Schedule(func)
    for conv in done:
        _inline_padding(sch, conv.block)
        _schedule_transforms(sch, conv.block, conv.tile, lanes)
    return sch.mod["main"], tuple(done)


# measured (Zen 4, one thread, each layer alone against the direct sum at the core's peak):
# 1.6-3.6x at 64-512 channels each side (ResNet's 3x3 layers), 2.4-3.0x at 32 (112 x 112 down
# to 28 x 28), 1.18x at 16 (224 x 224): under 32 the transforms' passes eat the gain
MIN_CHANNELS = 32
MIN_TILES = 32  # a position's product reuses each transformed weight over this many tiles at least


def tile_for(conv: Conv3x3, largest: int) -> int:
    """The largest output tile up to ``largest`` whose matrix products have `MIN_TILES` rows
    (tiles) or more, else the smallest. The transformed weight is (m + 2)^2 / 9 times the
    weight (4x at m = 4), read once per call: with few tiles that traffic outweighs the
    multiply-adds saved (ResNet-50's 7 x 7 layer: 4 tiles at m = 4, a 38 MB weight a call,
    1.39 ms in the model against 1.00 alone; 16 tiles and 17 MB at m = 2: 1.49 against the
    direct sum's 2.08)."""
    fits = [m for m in sorted(MATRICES) if m <= largest and conv.tiles(m) >= MIN_TILES]
    return fits[-1] if fits else min(MATRICES)


def _pays(conv: Conv3x3) -> bool:
    """Whether the form is worth it: enough channels on both sides that the matrix products,
    not the transforms (passes over (m + 2)^2 / m^2 times the input and the output), carry the
    time. Measured at `MIN_CHANNELS` and up; fewer stay direct."""
    _, _, _, k, c = conv.shape
    return k >= MIN_CHANNELS and c >= MIN_CHANNELS


def _spliced(func, conv: Conv3x3, tile: int):
    """``func`` with the top-level nest computing ``conv`` replaced by the stages of `_stages`."""
    stages = _stages(conv, tile)
    pairs = list(zip(stages.params, (conv.data, conv.weight, conv.out)))

    def swap(buf):
        return next((ours for theirs, ours in pairs if buf.same_as(theirs)), buf)

    inner = root_block(stages)
    body = tvm_ffi.structural_map(inner.body, [(tirx.Buffer, swap)])
    root = root_block(func)
    nests = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    at = next(i for i, s in enumerate(nests) if any(str(b.name_hint) == conv.block for b in iter_blocks(s)))
    new = nests[:at] + list(body.seq) + nests[at + 1:]
    return with_root_body(func, tirx.SeqStmt(new), list(root.alloc_buffers) + list(inner.alloc_buffers))


def _inline_padding(sch, name: str) -> None:
    """The copy that pads the input (a block of this function) read through by the input transform."""
    for producer in sch.get_producers(sch.get_sblock(f"{name}_input_rows")):
        if str(sch.get(producer).name_hint) != f"{name}_weight":
            try:
                sch.compute_inline(producer)
            except s_tir.ScheduleError:  # not a copy TVM can inline: it stays a pass of its own
                pass


def winograd_for(func, tile: int, target) -> tuple:
    """(``func`` with its 3x3 convolutions in Winograd's form F(tile x tile, 3x3) where ``target``
    is a CPU (LLVM) target and ``tile`` one of `TILES` (0: never), the steps saying so)."""
    if not tile or target.kind.name != "llvm":
        return func, ()
    func, done = winograd_form(func, tile, max(1, vector_bytes(target) // 4))
    return func, tuple(Step(StepKind.WINOGRAD, conv.note()) for conv in done)
