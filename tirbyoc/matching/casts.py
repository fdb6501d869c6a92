"""Casts a staging copy can do: a block that casts an operand the intrinsic reads as it is.

A float16 convolution accumulating in float32 reads ``float32(D[...]) * float32(W[...])``; a
library's sgemm reads float32 operands with no cast. The products are the same when the
operands are cast ahead, element by element, into float32 copies (a cast of one element does
not depend on where it is computed), so the block matches an intrinsic that reads its
operands as they are once the casts move into staging copies. `cast_staged` gives the
block's pattern as it reads after that move; the matcher tries it only when the block as
written matches no way, and marks the operands so staged (`Staging.CAST`); the rewrite's
first stage makes the copies (`tirbyoc.rewrite.block.cast_staging`).
"""

from __future__ import annotations

from dataclasses import replace

from tirbyoc.ir.pattern import BlockPattern


def _cast_loads(tree, loads, found: dict, plain: set) -> tuple:
    """``tree`` with each cast of a load replaced by the load (recorded in ``found``: load
    index -> the cast's dtype); loads read without a cast go to ``plain``."""
    op = tree[0]
    if op == "cast" and tree[2][0] == "load" and loads[tree[2][1]].dtype != tree[1]:
        found[tree[2][1]] = tree[1]
        return tree[2]
    if op == "load":
        plain.add(tree[1])
        return tree
    if op in ("const", "var", "opaque"):
        return tree
    start = 3 if op == "call" else 2
    return tree[:start] + tuple(_cast_loads(t, loads, found, plain) for t in tree[start:])


def cast_staged(wpat: BlockPattern) -> tuple[BlockPattern, dict[str, str]] | None:
    """``wpat`` as it reads once the casts of its update's loads are staging copies (each such
    load reads its buffer in the cast's dtype), and ``{buffer: dtype}`` of those copies; None
    when the block casts no load, or reads one buffer both cast and not (or cast to two
    dtypes): one copy per buffer serves every read of it."""
    if wpat.value is None or wpat.problem:
        return None
    found: dict[int, str] = {}
    plain: set[int] = set()
    value = _cast_loads(wpat.value, wpat.loads, found, plain)
    if not found:
        return None
    casts: dict[str, str] = {}
    for i, dtype in found.items():
        buffer = wpat.loads[i].buffer
        if casts.setdefault(buffer, dtype) != dtype:
            return None
    if any(wpat.loads[i].buffer in casts for i in plain) or wpat.store.buffer in casts:
        return None
    loads = tuple(replace(acc, dtype=found[i]) if i in found else acc for i, acc in enumerate(wpat.loads))
    return replace(wpat, value=value, loads=loads), casts


__all__ = ["cast_staged"]
