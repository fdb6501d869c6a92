"""Whole-function library calls: a PrimFunc that is nothing but one library kernel.

When a PrimFunc computes exactly what a group's `PackedFunction` computes - one block, a
zero init, every operand one of the function's own parameters addressed in place, no padding,
no loops left around the call - there is nothing left for TIR to do: the Relax bridge calls the
kernel itself through ``R.call_dps_packed``. `whole_function_call` decides that from the
matcher's `Match` (so the matcher's flexibility - roles, commuted operands, exact-size groups -
carries over) and says why not otherwise; `verify_whole_call` runs the kernel against TVM's
build of the function on the same inputs. A group declared for any size (``resize``) needs no
padding: the kernel reads the real extents from its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tirbyoc._tvm import is_buffer, iter_blocks, prim_expr, root_block, tirx, to_tensor, tvm
from tirbyoc.decl.extern import PackedFunction
from tirbyoc.ir.pattern import static_int
from tirbyoc.matching.results import Match, Staging
from tirbyoc.offloading.devices import reference_target
from tirbyoc.offloading.verification import (
    Verification,
    at_symbolic_sizes,
    compare_arrays,
    compile_func,
    concrete_params,
    make_inputs,
    reduction_length,
    run_executable,
)


@dataclass(frozen=True)
class WholeCall:
    """``packed(params[inputs[0]], ..., params[output])`` computes the whole PrimFunc."""

    function: str
    packed: PackedFunction
    inputs: tuple[int, ...]  # PrimFunc parameter index of each kernel input, kernel order
    output: int  # PrimFunc parameter index of the destination
    match: Match

    @property
    def symbol(self) -> str:
        return self.packed.symbol


def _init_is_zero(block) -> bool:
    init = block.init
    if init is None or not isinstance(init, tirx.BufferStore):
        return False
    value = init.value
    return isinstance(value, (prim_expr.IntImm, prim_expr.FloatImm)) and float(value.value) == 0.0


def whole_function_call(func, match: Match) -> tuple[WholeCall | None, str | None]:
    """(the call, None) if ``match`` makes ``func`` one packed-kernel call, else (None, why)."""

    group = match.group
    if group is None or group.packed is None:
        return None, f"{match.intrinsic.name} has no whole-function kernel"
    root = root_block(func)
    blocks = [b for b in iter_blocks(root.body, include_self=False)] if root is not None else []
    if len(blocks) != 1:
        return None, f"the function has {len(blocks)} blocks; a whole-function call needs exactly one"
    if not _init_is_zero(blocks[0]):
        return None, "the block does not start its accumulator at zero"
    any_size = group.resize is not None  # the kernel takes the real extents: no padding needed
    if match.padding and not any_size:
        return None, f"axes need padding {match.padding}"
    extents = {a.axis: a.extent for a in match.axes}
    # an axis of run-time size: the size variable its iterator runs over, which must be the
    # buffer's own dimension (the kernel takes the tensor's whole extent there)
    doms = {str(iv.var.name): iv.dom.extent for iv in blocks[0].iter_vars}
    extents.update({a.axis: _var_name(doms.get(a.iters[0])) for a in match.axes if a.extent is None})
    if match.outer:
        return None, f"iterators {', '.join(match.outer)} would stay loops around the call"
    params = [p for p in func.params]
    if not all(is_buffer(p) for p in params):
        return None, "a parameter is not a buffer"
    ranks = [len(p.shape) for p in params]
    if len(set(ranks)) != 1 and not _shared_weight(ranks):  # the kernel batches leading dimensions alike
        return None, "the operands have different ranks; the kernel takes tensors of one rank"
    by_name = {str(p.name): i for i, p in enumerate(params)}
    if len(by_name) != len(params) or len(params) != len(match.operands):
        return None, "the function's parameters are not exactly the kernel's operands"
    inputs, output = [], None
    for op in match.operands:
        staging = [s for s in op.staging if not (any_size and s == Staging.PAD)]
        if staging or (not op.direct and not any_size):
            return None, f"operand {op.operand} ({op.buffer}) needs {'+'.join(staging or op.staging)}"
        index = by_name.get(op.buffer)
        if index is None:
            return None, f"operand {op.operand} reads {op.buffer}, not a parameter"
        shape = tuple(static_int(s) if static_int(s) is not None else _var_name(s) for s in params[index].shape)
        view = tuple(extents.get(a, 1) for a in op.view_axes)
        if _sized(shape) != _sized(view):  # a unit dimension is whole either way (the kernel batches leading ones)
            return None, (f"operand {op.operand} addresses a {list(view)} view of "
                          f"{op.buffer} {list(shape)}, not the whole buffer")
        if op.is_output:
            output = index
        else:
            inputs.append(index)
    if output != len(params) - 1:
        return None, "the destination is not the function's last parameter"
    return WholeCall(match.function, group.packed, tuple(inputs), output, match), None


def _shared_weight(ranks) -> bool:
    """A, B, C of ranks (r, 2, r): one [K, N] matrix for every row of A (a Linear layer on
    [batch, tokens, K]), which the kernel takes as one GEMM over all of A's rows."""
    return len(ranks) == 3 and ranks[0] == ranks[2] > 2 and ranks[1] == 2


def _sized(dims) -> tuple:
    return tuple(d for d in dims if d != 1)


def _var_name(extent) -> str | None:
    """A symbolic extent's size variable, by name ("n"); None for anything else."""
    return str(extent.name) if isinstance(extent, tirx.Var) else None


def find_whole_call(func, matches: Sequence[Match]) -> tuple[WholeCall | None, str | None]:
    """The first of ``matches`` that makes ``func`` a whole-function call (or the first why not)."""
    reasons = []
    for m in matches:
        call, why = whole_function_call(func, m)
        if call is not None:
            return call, None
        reasons.append(why)
    return None, reasons[0] if reasons else "no match"


def verify_whole_call(func, call: WholeCall, *, seed: int = 0):
    """Run the packed kernel and TVM's build of ``func`` on the same seeded inputs and compare
    the destination (a `Verification`); a function of symbolic extents at each binding of
    `symbolic_bindings` (`at_symbolic_sizes`: the first size that fails says so)."""

    def check(funcs, bound):
        result = _verify_whole_once(funcs[0], call, seed)
        if result.passed is True:
            return result
        at = "with " + ", ".join(f"{name} = {size}" for name, size in bound.items())
        return replace(result, reason="; ".join(filter(None, [at, result.reason])))

    sized = at_symbolic_sizes([func], check)
    return sized if sized is not None else _verify_whole_once(func, call, seed)


def _verify_whole_once(func, call: WholeCall, seed: int):
    params = concrete_params(func)
    arrays = make_inputs(func, params, None, seed)
    ref = run_executable(compile_func(func, reference_target(), "original"), [a.copy() for a in arrays], tvm.cpu())
    tensors = [to_tensor(a.copy(), tvm.cpu()) for a in arrays]
    try:
        call.packed.function()(*[tensors[i] for i in call.inputs], tensors[call.output])
    except Exception as err:  # noqa: BLE001 - the kernel refusing its arguments: not this call
        return Verification(None, float("nan"), reason=f"{call.symbol} refused the arguments: {err}")
    name, _, dtype = params[call.output]
    c = compare_arrays(ref[call.output], tensors[call.output].numpy(), dtype, reduction_length(func))
    return Verification(c.passed, c.abs_err, {name: c.abs_err}, {name: c.tolerance},
                        reason=c.note, max_rel_err=c.rel_err)


__all__ = ["WholeCall", "find_whole_call", "verify_whole_call", "whole_function_call"]
