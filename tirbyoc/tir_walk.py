"""Small read-only walks over TensorIR statements.

TVM 0.27 exposes no Python statement visitor for TIR, so this walks the few statement
kinds that hold other statements. Nothing here rewrites IR.
"""

from __future__ import annotations

from typing import Iterator

from ._tvm import s_tir, tirx

_CHILD_FIELDS = ("body", "then_case", "else_case", "init")


def child_stmts(stmt) -> list:
    """The statements directly inside ``stmt`` (a realize's block counts as its child)."""
    if stmt is None:
        return []
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block]
    out = []
    for name in _CHILD_FIELDS:
        child = getattr(stmt, name, None)
        if isinstance(child, tirx.Stmt):
            out.append(child)
    return out


def iter_blocks(stmt, *, include_self: bool = True) -> Iterator["s_tir.SBlock"]:
    """Every ``SBlock`` under ``stmt`` in pre-order (the block's init included)."""
    stack = [stmt]
    first = True
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlock) and (include_self or not first):
            yield node
        first = False
        stack.extend(reversed(child_stmts(node)))


def root_block(func) -> "s_tir.SBlock | None":
    """The root block of a schedulable PrimFunc, or None if its body is not one."""
    body = func.body
    if isinstance(body, s_tir.SBlockRealize):
        return body.block
    return None


def child_blocks(block) -> list:
    """Blocks directly nested in ``block``'s body (not in deeper blocks)."""
    out = []
    stack = list(reversed(child_stmts(block.body)))
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlock):
            out.append(node)
            continue
        stack.extend(reversed(child_stmts(node)))
    return out

