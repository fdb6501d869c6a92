"""A tensor-core block brought into the plain GEMM form the fast kernel schedules.

The fast kernel (`tirbyoc.rewrite.block.tensor_core`) computes C[(b,) i, j] += A[(b,) i, k] .
B[(b,) k, j] (or B[(b,) j, k]) on whole block tiles. Convolutions and GEMMs of awkward sizes
reach it in three steps, all TVM schedule primitives:

- **the window folded into K** (implicit GEMM): a convolution's staged operands keep the
  window's reduction iterators outside the intrinsic's k (A as ``pad_temp[kh, kw, i, c]``, B
  as ``W[kh, kw, c, o]``). `fold_window` lays each staged copy out as one row per output
  (``[i, K]``, ``[o, K]`` with K = (kh, kw, c)) and the block's iteration space as (i, j, K)
  (``transform_layout`` and ``transform_block_layout``);
- **sizes padded to the block tile** (``pad_einsum``): ResNet's 784 or 49 output rows to the
  next multiple of the tile's; the padding becomes producer / consumer blocks;
- **the staged copies read in place**: each copy whose rows stay contiguous along the
  innermost dimension (the window's channels, a padded row) is inlined into the kernel's
  shared-memory copy (`inline_into_copy`) or its write-back (`inline_consumers`), so the
  im2col, the padding and the weight's transpose never go through global memory: 16-byte
  ``cp.async`` loads read the activation itself, a zero-filled predicate past its edges.
"""

from __future__ import annotations

from math import prod

from tirbyoc._tvm import REDUCE, TensorLoad, iter_stores, sym, tirx
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import iter_exprs, uses_var
from tirbyoc.rewrite.foundation.state import RewriteState

VECTOR_BYTES = 16  # the kernel's copies move 16 bytes a thread (cp.async.cg)


def _loads(node) -> list:
    """Every buffer load under ``node``."""
    return [n for n in iter_exprs(node) if isinstance(n, TensorLoad)]


def _plain_vars(indices) -> list | None:
    """The variable each index is, or None when one is an expression."""
    out = []
    for ix in indices:
        if not hasattr(ix, "name") or hasattr(ix, "a"):
            return None
        out.append(ix)
    return out


def whole_loops(state: RewriteState) -> None:
    """Put the tiled loops back into whole axes, nested in the order of the block's iterators,
    each binding one loop variable (what ``transform_block_layout`` and ``pad_einsum`` need)."""
    sch, loops = state.sch, state.loops
    (io, jo), (ko,), (ii, ji, ki) = loops.axis_spatial, loops.axis_reduce, loops.inner[:3]
    sch.reorder(io, ii, jo, ji, ko, ki)
    for tile, within in ((io, ii), (jo, ji), (ko, ki)):
        sch.fuse(tile, within)
    nest = sch.get_loops(state.block)[-len(sch.get(state.block).iter_vars):]
    realize = sch.get(nest[-1]).body
    by_var = {str(sch.get(lp).loop_var.name): lp for lp in nest}
    sch.reorder(*[by_var[str(v.name)] for v in realize.iter_values])


def _row_layout(keep: list[int], rdims: list[int], sizes: list):
    """A buffer's index map that keeps the ``keep`` dimensions and fuses the ``rdims`` ones
    (outermost first, ``sizes`` their extents) into one innermost K."""
    def layout(*ix):
        k = ix[rdims[0]]
        for d, size in zip(rdims[1:], sizes[1:]):
            k = k * size + ix[d]
        return (*[ix[d] for d in keep], k)

    return layout


def fold_window(state: RewriteState) -> str | None:
    """Lay the window into K (see the module's docstring); None when done, else why not."""
    sch = state.sch
    block = sch.get(state.block)
    ivs = list(block.iter_vars)
    reduce_vars = [iv.var for iv in ivs if int(iv.iter_type) == REDUCE]
    extents = {iv.var: iv.dom.extent for iv in ivs}
    params = {str(p.name) for p in sch.mod["main"].params}
    for index, region in enumerate(block.reads):  # an operand read in place gets a copy to lay out
        access = next(ld for ld in _loads(block.body) if ld.source.same_as(region.source))
        if _plain_vars(access.indices) is None:  # through the window: an im2col copy by the iterators
            sch.reindex(state.block, ("read", index))
        elif str(region.source.name) in params:
            sch.cache_read(state.block, index, "global")
    block = sch.get(state.block)
    for region in block.reads:
        name = str(region.source.name)
        access = next(ld for ld in _loads(block.body) if ld.source.same_as(region.source))
        dims = _plain_vars(access.indices)
        if dims is None:
            return f"{name} is not indexed by the block's iterators alone"
        rdims = sorted((d for d, v in enumerate(dims) if any(v.same_as(r) for r in reduce_vars)),
                       key=lambda d: next(n for n, r in enumerate(reduce_vars) if dims[d].same_as(r)))
        keep = [d for d in range(len(dims)) if d not in rdims]
        layout = _row_layout(keep, rdims, [region.source.shape[d] for d in rdims])
        index = [str(r.source.name) for r in block.reads].index(name)
        sch.transform_layout(state.block, ("read", index), tirx.IndexMap.from_func(layout, ndim=len(dims)))
    spatial = [iv.var for iv in ivs if int(iv.iter_type) != REDUCE]  # in the block's order

    def block_layout(*vs):  # (spatial..., K), K over the reduction iterators, outermost first
        by = dict(zip([iv.var for iv in ivs], vs))
        k = by[reduce_vars[0]]
        for r in reduce_vars[1:]:
            k = k * extents[r] + by[r]
        return (*[by[v] for v in spatial], k)

    sch.transform_block_layout(state.block, tirx.IndexMap.from_func(block_layout, ndim=len(ivs)))
    return None


def contiguous(block) -> bool:
    """Whether ``block`` copies one buffer into another with the innermost dimension running
    along the innermost dimension (a window row, a padded row; not a transpose), both rows a
    whole number of 16-byte vectors: then it can be inlined into the kernel's 16-byte copies
    and every vector stays one aligned access under one predicate (a row of 300 halves is
    neither: its padding to 304 is a copy of its own)."""
    stores = list(iter_stores(block.body))
    loads = list(_loads(block.body))
    if len(stores) != 1 or len({str(ld.source.name) for ld in loads}) != 1:
        return False
    for buf in (stores[0].buffer, loads[0].source):
        lanes = VECTOR_BYTES // dtype_bytes(str(buf.dtype))
        if not hasattr(buf.shape[-1], "value") or int(buf.shape[-1].value) % lanes:
            return False
    if _plain_vars(loads[0].indices[-1:]) is None:
        return False
    x = loads[0].indices[-1]
    *outer, last = stores[0].indices
    coeffs = sym.detect_linear_equation(last, [x])
    unit = len(coeffs) == 2 and hasattr(coeffs[0], "value") and int(coeffs[0].value) == 1
    return unit and not any(uses_var(o, x) for o in outer) and _whole_rows(block, x, loads[0].source,
                                                                           stores[0], last)


def _whole_rows(block, x, source, store, last) -> bool:
    """Whether the copy moves whole rows: its innermost iterator ``x`` runs over all of the
    source's row (and of the destination's, where it indexes it alone), so no padding or cut
    falls inside a row. Padding inside a row would put a predicate on the vectorized
    dimension, which the kernel's copies do not take (measured on an H100: a GEMM whose 200
    columns were padded to 224 inside the kernel's copies did not verify)."""
    extent = next((iv.dom.extent for iv in block.iter_vars if iv.var.same_as(x)), None)
    if extent is None or not hasattr(extent, "value"):
        return False
    rows = [source.shape[-1]] + ([store.buffer.shape[-1]] if last.same_as(x) else [])
    return all(hasattr(r, "value") and int(r.value) == int(extent.value) for r in rows)


def inline_into_copy(sch, copy) -> None:
    """Inline the producers of what ``copy`` reads, as long as they are contiguous copies
    (their chain: a padding, an im2col, a weight re-layout)."""
    while True:
        producers = sch.get_producers(copy)
        if len(producers) != 1 or not contiguous(sch.get(producers[0])):
            return
        sch.compute_inline(producers[0])


def inline_consumers(sch, copy) -> list[str]:
    """Inline the consumers of what ``copy`` writes while each is a contiguous copy (the
    padding's cut back, a reindex back to NHWC) or an elementwise epilogue reading it point
    for point (a fused model's cast, bias, ReLU, GELU, residual add: they then run on the tile
    on its way out, and C is written once, in the model's dtype). Returns the elementwise
    blocks inlined."""
    fused = []
    while True:
        consumers = sch.get_consumers(copy)
        if len(consumers) != 1:
            return fused
        consumer = sch.get(consumers[0])
        written = sch.get(copy).writes[0].source
        if contiguous(consumer):
            sch.reverse_compute_inline(consumers[0])
        elif _pointwise(consumer, written):
            fused.append(str(consumer.name_hint))
            sch.reverse_compute_inline(consumers[0])
        else:
            return fused


def _pointwise(block, buffer) -> bool:
    """Whether ``block`` is elementwise over ``buffer``: no reduction, one store, and every
    read of ``buffer`` at exactly the stored element's indices."""
    if any(int(iv.iter_type) == REDUCE for iv in block.iter_vars) or block.init is not None:
        return False
    stores = list(iter_stores(block.body))
    if len(stores) != 1:
        return False
    reads = [ld for ld in _loads(block.body) if ld.source.same_as(buffer)]
    index = [str(i) for i in stores[0].indices]
    return bool(reads) and all([str(i) for i in ld.indices] == index for ld in reads)


def fold_staged_inputs(state: RewriteState) -> list[str]:
    """Inline the copies earlier stages staged A or B into where they transpose (the one-warp
    schedule needs it; the kernel reads either layout in place). A copy that keeps rows
    contiguous (a reindex, a padding) stays, for the kernel's shared-memory copy to read
    through (`inline_into_copy`). Returns the operands folded back."""
    sch, folded = state.sch, []
    for op in state.match.operands:
        if op.is_output:
            continue
        fed = state.feeding(op, "read")
        if fed == op.buffer:
            continue
        for producer in sch.get_producers(state.block):
            if [str(w.source.name) for w in sch.get(producer).writes] == [fed] and not contiguous(
                    sch.get(producer)):
                sch.compute_inline(producer)
                folded.append(op.operand)
    return folded


def squeeze(sch, copy) -> None:
    """Drop the size-1 dimensions inside the buffer ``copy`` writes (a 1x1 convolution's weight
    read in place as [O, 1, 1, C]): the fragment layouts index a tile's last two dimensions.
    Leading ones (a batch's) stay."""
    shape = [int(d) for d in sch.get(copy).writes[0].source.shape]
    first = next((d for d, size in enumerate(shape) if size != 1), len(shape))
    keep = list(range(first)) + [d for d in range(first, len(shape)) if shape[d] != 1]
    if len(keep) == len(shape) or len(keep) < 2:
        return
    sch.transform_layout(copy, ("write", 0), tirx.IndexMap.from_func(lambda *ix: [ix[d] for d in keep],
                                                                      ndim=len(shape)))


def padded(size: int, tile: int) -> int:
    """``size`` rounded up to a multiple of ``tile``."""
    return -(-size // tile) * tile


def pad_waste(sizes, tiles) -> float:
    """Padded work over real work when each size is rounded up to its tile."""
    return prod(padded(s, t) for s, t in zip(sizes, tiles)) / prod(sizes)


__all__ = ["contiguous", "fold_staged_inputs", "fold_window", "inline_consumers", "inline_into_copy", "pad_waste",
           "padded", "squeeze", "whole_loops"]
