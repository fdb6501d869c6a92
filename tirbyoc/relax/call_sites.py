"""What a Relax module's ``call_tir`` sites say about the PrimFuncs they call: how often each
is called, which of its arguments are constants (a model's weights), and their values.

The offload reads them: a constant argument is a weight the CPU schedule may pack once
(`tirbyoc.rewrite.cpu.weight_layout`), and its values are the inputs a function's check
should run on - a quantized layer's real scales and weights keep its outputs in range, where
drawn ones saturate every requantize to one constant and the check proves nothing.
"""

from __future__ import annotations

from tvm import relax

from tirbyoc._tvm import tvm


def _call_tir_sites(mod, visit) -> None:
    """``visit(call)`` for every ``call_tir`` in ``mod``'s Relax functions."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def each(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and len(expr.args) >= 2:
            visit(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, each)


def _is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.GenericConst)  # TVM 0.27's Relax constant (`const_value`)


def call_counts(mod) -> dict[str, int]:
    """How many ``call_tir`` sites name each PrimFunc (LegalizeOps shares one PrimFunc
    between equal operators: ResNet-50's repeated blocks)."""
    counts: dict[str, int] = {}

    def visit(call):
        name = call.args[0].name_hint
        counts[name] = counts.get(name, 0) + 1

    _call_tir_sites(mod, visit)
    return counts


def constant_arguments(mod) -> dict[str, set[int]]:
    """For each PrimFunc a ``call_tir`` names, the argument positions that are a Relax
    constant at every one of its call sites."""
    found: dict[str, set[int]] = {}

    def visit(call):
        name = call.args[0].name_hint
        here = {i for i, a in enumerate(getattr(call.args[1], "fields", ())) if _is_constant(a)}
        found[name] = here if name not in found else found[name] & here

    _call_tir_sites(mod, visit)
    return found


def constant_argument_values(mod) -> dict[str, dict[int, object]]:
    """For each PrimFunc a ``call_tir`` names, its first call site's Relax constants by argument
    position (the positions `constant_arguments` finds constant at every site): the values its
    check runs on (`offload`'s ``inputs``; `const_value` makes each a numpy array when needed)."""
    constant = constant_arguments(mod)
    values: dict[str, dict[int, object]] = {}

    def visit(call):
        name = call.args[0].name_hint
        if name in values or not constant.get(name):
            return
        fields = getattr(call.args[1], "fields", ())
        values[name] = {i: fields[i] for i in constant[name] if i < len(fields)}

    _call_tir_sites(mod, visit)
    return values


__all__ = ["call_counts", "constant_argument_values", "constant_arguments"]
