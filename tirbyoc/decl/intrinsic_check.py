"""Validation of an intrinsic's description and implementation PrimFuncs.

Checks that the description is a single leaf block with declared reads and writes, that
description, implementation and the declared signature agree buffer by buffer (shape,
dtype, scope, offset factor), and that the implementation's buffers allow the layout the
declaration promises (a dense-only implementation has no strides to honour a strided
window). Every error names the intrinsic, the buffer and the field.
"""

from __future__ import annotations

from tirbyoc._tvm import PrimFunc, child_blocks, is_buffer, iter_blocks, iter_kind, root_block, s_tir, tirx
from tirbyoc.decl.intrinsic import Axis, Layout, Operand
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.errors import IntrinsicError



def param_buffers(func) -> list:
    """The buffers bound to a PrimFunc's parameters, in parameter order."""
    # TVM 0.27 binds buffers as the parameters themselves (buffer-typed vars).
    return [p for p in func.params if is_buffer(p)]


def _const_tuple(values, what: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if not isinstance(v, tirx.IntImm):
            raise IntrinsicError(f"{what}: {v} is not a constant; intrinsic shapes must be static")
        out.append(int(v.value))
    return tuple(out)


def leaf_block(name: str, desc) -> "s_tir.SBlock":
    """The description's one leaf block; raise if there is not exactly one."""
    root = root_block(desc)
    if root is None:
        raise IntrinsicError(
            f"intrinsic {name!r}: description body is not a root block; wrap the loop nest in "
            "'with T.sblock(\"root\"):' with T.reads/T.writes"
        )
    blocks = [b for b in iter_blocks(root.body)]
    if len(blocks) != 1:
        names = [b.name_hint for b in blocks]
        raise IntrinsicError(
            f"intrinsic {name!r}: description must hold exactly one leaf block, found "
            f"{len(blocks)} {names}; split it into one intrinsic per block (a group chains them)"
        )
    if child_blocks(blocks[0]):
        raise IntrinsicError(f"intrinsic {name!r}: block {blocks[0].name_hint!r} is not a leaf")
    return blocks[0]


def _region_buffers(regions) -> set:
    return {r.source.name for r in regions}


def signature_of(name: str, desc, layouts: dict) -> tuple[list[Operand], list[Axis]]:
    """Derive operands and axes from a description PrimFunc (for `Intrinsic.from_prim_funcs`)."""
    operands = []
    for buf in param_buffers(desc):
        shape = _const_tuple(buf.shape, f"intrinsic {name!r}: buffer {buf.name!r} shape")
        operands.append(
            Operand(buf.name, shape, str(buf.dtype), str(buf.scope()), layouts.get(buf.name, Layout()))
        )
    leaf = leaf_block(name, desc)
    axes = []
    for iv in leaf.iter_vars:
        kind = iter_kind(iv)
        if kind == "O":
            raise IntrinsicError(f"intrinsic {name!r}: iterator {iv.var.name} is neither spatial nor reduction")
        extent = _const_tuple([iv.dom.extent], f"intrinsic {name!r}: iterator {iv.var.name}")[0]
        axes.append(Axis(str(iv.var.name), extent, kind))
    return operands, axes


def _check_func_kind(name: str, which: str, func) -> None:
    if not isinstance(func, PrimFunc):
        raise IntrinsicError(f"intrinsic {name!r}: {which} is a {type(func).__name__}, expected a PrimFunc")


def _check_buffer(name: str, op: Operand, buf, which: str) -> None:
    where = f"intrinsic {name!r}: {which} buffer {buf.name!r} (operand {op.name!r})"
    shape = _const_tuple(buf.shape, f"{where} shape")
    want = op.stored_shape if which == "implementation" else op.shape
    if shape != want:
        packed = f" (packed in {op.layout.tile} tiles)" if want != op.shape else ""
        raise IntrinsicError(f"{where}: shape {shape} != declared {want}{packed}")
    if str(buf.dtype) != op.dtype:
        raise IntrinsicError(f"{where}: dtype {buf.dtype} != declared {op.dtype}")
    if str(buf.scope()) != op.scope:
        raise IntrinsicError(f"{where}: scope {buf.scope()!r} != declared {op.scope!r}")
    align_elems = max(1, op.layout.alignment // dtype_bytes(op.dtype))
    if int(buf.offset_factor) % align_elems:
        raise IntrinsicError(
            f"{where}: offset_factor {int(buf.offset_factor)} does not enforce the declared "
            f"{op.layout.alignment}-byte alignment; use offset_factor={align_elems}"
        )


def _check_layout(name: str, op: Operand, impl_buf) -> None:
    where = f"intrinsic {name!r}: implementation buffer {impl_buf.name!r} (operand {op.name!r})"
    strides = list(impl_buf.strides)
    if op.layout.dense:
        if strides:
            compact, acc = [], 1
            for extent in reversed(op.stored_shape):
                compact.append(acc)
                acc *= extent
            got = [int(s.value) if isinstance(s, tirx.IntImm) else None for s in strides]
            if got != list(reversed(compact)):
                raise IntrinsicError(
                    f"{where}: declared dense but the implementation has strides {strides}; "
                    "declare Layout.row_strided() if it honours strides"
                )
    else:
        if not strides:
            raise IntrinsicError(
                f"{where}: declared row-strided but the implementation buffer has no strides, "
                "so it would read a strided window as dense; give it symbolic strides "
                "(strides=[s, 1]) and pass them to the implementation"
            )
        last = strides[-1]
        if not (isinstance(last, tirx.IntImm) and int(last.value) == 1):
            raise IntrinsicError(f"{where}: innermost stride must be 1, got {last}")


def check_intrinsic(intrin, desc, impl) -> None:
    """Raise `IntrinsicError` unless desc, impl and the declaration agree."""
    name = intrin.name
    _check_func_kind(name, "description", desc)
    _check_func_kind(name, "implementation", impl)
    dbufs, ibufs = param_buffers(desc), param_buffers(impl)
    if len(dbufs) != len(intrin.operands):
        raise IntrinsicError(
            f"intrinsic {name!r}: description has {len(dbufs)} buffers "
            f"{[b.name for b in dbufs]}, declared {len(intrin.operands)} operands "
            f"{[o.name for o in intrin.operands]}"
        )
    if len(ibufs) != len(dbufs):
        raise IntrinsicError(
            f"intrinsic {name!r}: description has {len(dbufs)} buffers, implementation has "
            f"{len(ibufs)}; both take the same operands in the same order"
        )
    for op, dbuf, ibuf in zip(intrin.operands, dbufs, ibufs):
        if dbuf.name != op.name:
            raise IntrinsicError(
                f"intrinsic {name!r}: description buffer {dbuf.name!r} is declared as operand "
                f"{op.name!r}; name them alike, in parameter order"
            )
        _check_buffer(name, op, dbuf, "description")
        _check_buffer(name, op, ibuf, "implementation")
        if int(dbuf.offset_factor) != int(ibuf.offset_factor):
            raise IntrinsicError(
                f"intrinsic {name!r}: buffer {op.name!r} offset_factor differs: description "
                f"{int(dbuf.offset_factor)}, implementation {int(ibuf.offset_factor)}"
            )
        _check_layout(name, op, ibuf)
    _check_blocks(intrin, desc, impl)


def _check_blocks(intrin, desc, impl) -> None:
    """The description's and implementation's root blocks declare their regions alike, the
    leaf computes one store, and the iterators are the declared axes."""
    name = intrin.name
    root = root_block(desc)
    leaf = leaf_block(name, desc)
    if not root.writes:
        raise IntrinsicError(
            f"intrinsic {name!r}: description root block declares no T.writes; declare the "
            "regions it reads and writes (T.reads may be empty only for a fill)"
        )
    touched = _region_buffers(root.reads) | _region_buffers(root.writes)
    for op in intrin.operands:
        if op.name not in touched:
            raise IntrinsicError(
                f"intrinsic {name!r}: operand {op.name!r} is in neither T.reads nor T.writes "
                "of the description's root block"
            )
    iroot = root_block(impl)
    if iroot is None:
        raise IntrinsicError(f"intrinsic {name!r}: implementation body is not a root block")
    if len(iroot.reads) != len(root.reads) or len(iroot.writes) != len(root.writes):
        raise IntrinsicError(
            f"intrinsic {name!r}: implementation root block reads/writes "
            f"({len(iroot.reads)}/{len(iroot.writes)}) differ from the description's "
            f"({len(root.reads)}/{len(root.writes)})"
        )
    if not isinstance(leaf.body, tirx.BufferStore):
        raise IntrinsicError(
            f"intrinsic {name!r}: leaf block {leaf.name_hint!r} body must be one BufferStore, "
            f"got {type(leaf.body).__name__}"
        )
    got = signature_of(name, desc, {})[1]
    want = list(intrin.axes)
    if [(a.extent, a.kind) for a in got] != [(a.extent, a.kind) for a in want]:
        raise IntrinsicError(
            f"intrinsic {name!r}: description iterators "
            f"{[(a.name, a.extent, a.kind) for a in got]} differ from declared axes "
            f"{[(a.name, a.extent, a.kind) for a in want]}"
        )
