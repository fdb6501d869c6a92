"""Small read-only walks over TensorIR statements.

TVM 0.27 exposes no Python statement visitor for TIR, so this walks the few statement
kinds that hold other statements. Nothing here rewrites IR.
"""

from __future__ import annotations

from typing import Iterator

from tirbyoc._tvm import SPATIAL, PrimExpr, child_stmts, expr_dtype, root_block, s_tir, tirx


def perfect_nest(stmt):
    """(loops outer to inner, leaf SBlockRealize) of a perfect loop nest - each loop's body is
    the next loop or the realize; no loops: a bare realize - or None."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return (loops, stmt) if isinstance(stmt, s_tir.SBlockRealize) else None


def block_realize(stmt, block):
    """The SBlockRealize of ``block`` (an SBlock) under ``stmt``: its bindings to the loop
    variables around it. LookupError when ``block`` is not there."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlockRealize) and node.block.same_as(block):
            return node
        stack.extend(child_stmts(node))
    raise LookupError(f"block {block.name_hint!r} is not under the statement")


def with_loop_body(loop, body):
    """``loop`` (a ``For``) around ``body`` instead of its own body, all else kept."""
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                    loop.annotations)


def always_true(predicate) -> bool:
    """Whether a block realize's predicate is absent or the constant true."""
    return predicate is None or bool(getattr(predicate, "value", 0))


def with_root_body(func, body, alloc_buffers=None):
    """``func`` with its root block's body replaced by ``body`` (and its allocations by
    ``alloc_buffers`` when given; everything else kept): how the IR normalisations hand back
    a rewritten function."""
    root = root_block(func)
    allocs = root.alloc_buffers if alloc_buffers is None else list(alloc_buffers)
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body,
                            root.init, allocs, root.match_buffers, root.annotations)
    realize = func.body
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))


_EXPR_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "args", "indices",
                "base", "stride", "min", "extent")


def _nodes(value) -> list:
    """The IR nodes in a field's value (one node, or an array of them)."""
    if isinstance(value, (PrimExpr, tirx.Stmt)):
        return [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return []
    try:
        return [v for v in value if isinstance(v, (PrimExpr, tirx.Stmt))]
    except TypeError:
        return []


def iter_exprs(node) -> Iterator:
    """Every expression node under ``node`` (a statement or an expression), parents before
    children: loop bounds, stored values and their indices, conditions, call arguments, the
    body of a ``Let``."""
    stack = [node]
    while stack:
        cur = stack.pop()
        children = child_stmts(cur) if isinstance(cur, tirx.Stmt) else []
        if isinstance(cur, PrimExpr):
            yield cur
            children += _nodes(getattr(cur, "body", None))  # tirx.Let
        for name in _EXPR_FIELDS:
            children += _nodes(getattr(cur, name, None))
        stack.extend(reversed(children))


def uses_var(expr, var) -> bool:
    """Whether ``var`` (a Var) occurs in ``expr``."""
    return any(isinstance(n, tirx.Var) and n.same_as(var) for n in iter_exprs(expr))


def at_iterators(indices, block) -> bool:
    """Whether ``indices`` are exactly ``block``'s iterators, in order (an elementwise access)."""
    ivars = [iv.var for iv in block.iter_vars]
    return len(indices) == len(ivars) and all(i.same_as(v) for i, v in zip(indices, ivars))


def loop_extent(sch, loop) -> int | None:
    """The constant extent of a schedule's ``loop`` (None: symbolic)."""
    ext = sch.get(loop).extent
    return int(ext.value) if hasattr(ext, "value") else None


def spatial_prefix(sch, loops, realize) -> list:
    """The leading ``loops`` that only the spatial iterators' bindings in ``realize`` use."""
    binds = list(zip(realize.block.iter_vars, realize.iter_values))
    prefix = []
    for loop in loops:
        var = sch.get(loop).loop_var
        kinds = {int(iv.iter_type) for iv, value in binds if uses_var(value, var)}
        if not kinds <= {SPATIAL}:
            break
        prefix.append(loop)
    return prefix


def divisor_split(extent: int | None, divisors) -> list[int] | None:
    """The factors that split a loop of ``extent`` at the constants its iterator is divided by
    (`constant_divisors`: ``k // 192``, ``k % 192 // 64`` give 576 -> [3, 3, 64]), when they
    form a chain dividing the extent; else None. After such a split no element divides."""
    chain = _chain(divisors)
    if chain is None or extent is None or extent % chain[-1]:
        return None
    return [extent // chain[-1]] + [b // a for a, b in zip(chain, chain[1:])][::-1] + [chain[0]]


def _chain(divisors) -> list[int] | None:
    """``divisors`` sorted, when each divides the next; else None."""
    chain = sorted(divisors)
    return chain if chain and not any(b % a for a, b in zip(chain, chain[1:])) else None


def padded_divisor_split(extent: int | None, divisors) -> list[int] | None:
    """Where `divisor_split` finds no chain dividing ``extent`` because the loop was padded past
    a multiple of the largest divisor (an im2col row of a 7 x 7 x 3 window, 147 bf16 padded to
    the 148 a pair needs): the factors ``[ceil(extent / d), d]`` at that largest divisor ``d``,
    the last piece guarded by the split's predicate. Inside a piece the indices then divide by
    constants below ``d`` only (``i // 3``, ``i % 3`` of ``i < 21``), which TVM's simplifier
    folds into one contiguous run of the source (a window row's 7 pixels x 3 channels). None
    where the divisors form no chain or nothing is padded."""
    chain = _chain(divisors)
    if chain is None or extent is None or extent % chain[-1] == 0 or extent < chain[-1]:
        return None
    return [-(-extent // chain[-1]), chain[-1]]


def constant_divisors(node, variables) -> dict:
    """For each of ``variables`` (Vars) that ``node`` divides or takes modulo by constants
    (``v // 9``, ``v % 9 // 3``: an im2col copy's index arithmetic), the set of those
    constants; each counts for the one variable its dividend mentions."""
    found: dict = {}
    for expr in iter_exprs(node):
        if not isinstance(expr, (tirx.FloorDiv, tirx.FloorMod)) or not isinstance(expr.b, tirx.IntImm):
            continue
        used = [v for v in variables if any(e.same_as(v) for e in iter_exprs(expr.a))]
        if len(used) == 1 and int(expr.b.value) > 1:
            found.setdefault(used[0], set()).add(int(expr.b.value))
    return found


def map_expr(expr, fn):
    """``expr`` rebuilt bottom-up with ``fn(node)`` replacing each node it returns a
    replacement for (None: keep it, with its children mapped). Casts and binary nodes
    (arithmetic, comparisons) are rebuilt; every other node (loads, constants, variables,
    selects, calls) is a leaf. TVM 0.27's Python has no expression mutator."""
    new = fn(expr)
    if new is not None:
        return new
    if isinstance(expr, tirx.Cast):
        value = map_expr(expr.value, fn)
        return expr if value.same_as(expr.value) else tirx.Cast(expr_dtype(expr), value)
    if hasattr(expr, "a") and hasattr(expr, "b"):
        a, b = map_expr(expr.a, fn), map_expr(expr.b, fn)
        return expr if a.same_as(expr.a) and b.same_as(expr.b) else type(expr)(a, b)
    return expr
