"""tirbyoc's matcher side by side with TVM's own checks, on the same block and intrinsic.

TVM offers three ways to ask "can this intrinsic compute this block?":

- ``exact``: ``Schedule.tensorize`` on the block's loop nest as written (shapes, loop order
  and layouts must equal the description's);
- ``loop_mapping``: ``s_tir.schedule.analysis.get_tensorize_loop_mapping`` with padding
  allowed (what ``tile_with_tensor_intrin`` uses);
- ``auto``: ``get_auto_tensorize_mapping_info`` (MetaSchedule's auto-tensorization check).

`compare` runs all three and tirbyoc's `explain`, and checks that where TVM's loop mapping
exists, tirbyoc maps the same workload iterator to each intrinsic axis.
"""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc._tvm import Schedule, root_block, s_tir
from tirbyoc.decl.intrinsic_check import leaf_block
from tirbyoc.ir.pattern import expr_vars
from tirbyoc.ir.tir_walk import block_realize
from tirbyoc.matching.matcher import explain


@dataclass(frozen=True)
class Comparison:
    block: str
    intrinsic: str
    tvm_exact: bool
    tvm_loop_mapping: bool
    tvm_auto: bool
    tirbyoc: bool
    tirbyoc_direct: bool  # tirbyoc's match reads every operand in place
    agree: bool | None  # TVM's iterator per axis is among tirbyoc's (None: nothing to compare)
    reason: str | None  # tirbyoc's reason when it does not match
    staging: str | None  # what tirbyoc's match must stage (pack, transpose, pad...)


def _tvm_loop_mapping(func, block: str, intrin):
    """TVM's loop mapping as {intrinsic axis: workload iterator}, or None if it finds none."""

    sch = Schedule(func)
    blk = sch.get_sblock(block)
    info = s_tir.schedule.analysis.get_tensorize_loop_mapping(sch, blk, intrin.fresh_desc(), allow_padding=True)
    if info is None:
        return None
    iter_of_loop = _iter_of_loop(sch.mod["main"].body, sch.get(blk))
    axis_of_loop = _iter_of_loop(root_block(intrin.desc).body, leaf_block(intrin.name, intrin.desc))
    out = {}
    for wl_loop, desc_loop in info.loop_map.items():
        axis = axis_of_loop.get(str(desc_loop.loop_var.name))
        it = iter_of_loop.get(str(sch.get(wl_loop).loop_var.name))
        if axis is not None and it is not None:
            out[axis] = it
    return out


def _iter_of_loop(body, block) -> dict[str, str]:
    """Loop variable -> the iterator of ``block`` bound to exactly that loop."""
    node = block_realize(body, block)
    out = {}
    for iv, value in zip(node.block.iter_vars, node.iter_values):
        loops = expr_vars(value)
        if len(loops) == 1:
            out[next(iter(loops))] = str(iv.var.name)
    return out


def _tvm_exact(func, block: str, intrin) -> bool:
    intrin.register()
    sch = Schedule(func)
    try:
        blk = sch.get_sblock(block)
        loops = sch.get_loops(blk)
        if sch.get(blk).init is not None:  # descriptions carry no init: split it off first
            sch.decompose_reduction(blk, loops[0])
        sch.tensorize(loops[0], intrin.name)
        return True
    except Exception:  # TVM raises its own error types for every kind of mismatch
        return False


def _tvm_auto(func, block: str, intrin) -> bool:

    sch = Schedule(func)
    try:
        return s_tir.schedule.analysis.get_auto_tensorize_mapping_info(sch, sch.get_sblock(block), intrin.fresh_desc()) is not None
    except Exception:
        return False


def compare(func, block: str, intrin) -> Comparison:
    """Run TVM's three checks and tirbyoc's matcher on one block of a single-function workload."""
    (result,) = [r for r in explain(func, intrin) if r.block == block]
    m = result.best
    try:
        tvm_map = _tvm_loop_mapping(func, block, intrin)
    except Exception:
        tvm_map = None
    agree = None
    if m is not None and tvm_map:
        agree = all(it in m.mapping.get(axis, ()) for axis, it in tvm_map.items())
    staging = None
    if m is not None and not m.direct:
        staging = "; ".join(f"{o.operand}:{'+'.join(o.staging)}" for o in m.operands if not o.direct)
    return Comparison(block, intrin.name, _tvm_exact(func, block, intrin), tvm_map is not None,
                      _tvm_auto(func, block, intrin), m is not None, bool(m and m.direct), agree,
                      result.reason, staging)
