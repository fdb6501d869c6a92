"""Every loop nest of a CUDA function that the kernel's schedule left unbound, put on the GPU.

A CUDA PrimFunc runs its unbound loops in the host function, where the buffers are device
pointers: the host dereferences GPU memory and the process dies (seen on an H200 with the
cuda_mma padding copies ``A_pad`` / ``B_pad`` / the un-pad, a transposed weight's staging copy,
a convolution's im2col copy). So after the blocks are rewritten, each nest under the root
with no thread binding gets one: its leading spatial loops fused, split by `THREADS` and
bound to ``blockIdx.x`` / ``threadIdx.x``; a reduction left inside runs serially per thread.
A nest with no spatial loop (a whole reduction) gets a unit loop bound to one thread.
"""

from __future__ import annotations

from itertools import takewhile

from tirbyoc._tvm import s_tir, tirx
from tirbyoc.errors import RewriteError
from tirbyoc.ir.tir_walk import loop_extent, perfect_nest, spatial_prefix

THREADS = 256  # threads per block for the copies around a kernel: a multiple of the warp, full occupancy


def _is_bound(sch, loops) -> bool:
    return any(sch.get(l).kind == tirx.ForKind.THREAD_BINDING for l in loops)


def _static_spatial_prefix(sch, loops, realize) -> list:
    """The leading ``loops`` of static extent that only spatial iterators' bindings use."""
    return list(takewhile(lambda l: loop_extent(sch, l) is not None, spatial_prefix(sch, loops, realize)))


def _bind(sch, block) -> None:
    loops = sch.get_loops(block)
    nest = perfect_nest(sch.get(loops[0])) if loops else None
    if loops and nest is None:
        raise RewriteError(f"block {sch.get(block).name_hint!r} is not alone in its loop nest; "
                           "it cannot be bound to GPU threads")
    prefix = _static_spatial_prefix(sch, loops, nest[1]) if loops else []
    if not prefix:  # no spatial loop: one thread does the whole nest
        unit = sch.add_unit_loop(loops[0] if loops else block)
        sch.bind(unit, "threadIdx.x")
        sch.bind(sch.add_unit_loop(unit), "blockIdx.x")
        return
    fused = sch.fuse(*prefix) if len(prefix) > 1 else prefix[0]
    blocks, threads = sch.split(fused, [None, THREADS])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")


def bind_unbound_nests(func) -> tuple[object, list[str]]:
    """(``func`` with every unbound loop nest under its root bound to GPU threads, the names of
    their blocks); ``func`` itself when every nest is bound already."""
    sch = s_tir.Schedule(func)
    done = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if _is_bound(sch, sch.get_loops(block)):
            continue
        try:
            _bind(sch, block)
        except s_tir.ScheduleError as err:
            raise RewriteError(f"block {sch.get(block).name_hint!r} could not be bound to GPU "
                               f"threads: {str(err).strip().splitlines()[-1]}") from None
        done.append(str(sch.get(block).name_hint))
    return (sch.mod["main"], done) if done else (func, [])


__all__ = ["THREADS", "bind_unbound_nests"]
