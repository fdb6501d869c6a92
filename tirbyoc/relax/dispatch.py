"""Target dispatch before legalization: Relax operators to hand-written TIR or library calls.

`Dispatch(rules)` is an IRModule => IRModule pass over a Relax module *before* ``LegalizeOps``.
Each `Rule` names a Relax operator (``"relax.concat"``) or a dataflow pattern of several
(``relax.dpl``: ``relu(conv2d(x, w))``), an optional predicate on the matched call (shapes,
dtypes, attributes) and the targets it is for; its action is a `TIRKernel` (the call becomes
``R.call_tir`` of a PrimFunc the rule writes) or a `LibraryKernel` (``R.call_dps_packed`` of a
`PackedFunction`, its library appended to ``external_mods``). Rules are tried in order, first
match wins; whatever no rule takes is left for TVM's ``LegalizeOps``. Where it goes::

    Dispatch(rules) -> LegalizeOps -> [OffloadTIR] -> tvm.compile

Every replacement is verified by default: the matched subgraph and its replacement are built
as two small Relax functions and run on the same random inputs. A kernel whose signature does
not fit the call, or that disagrees, is not used (the report says why) - the operator then
takes TVM's default path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from tvm import relax
from tvm.relax.dpl import rewrite_call

from tirbyoc._tvm import is_buffer, is_host_target, make_target, relax_vm, tvm, with_external_mods
from tirbyoc.ir.domains import random_array
from tirbyoc.offloading.verification import compare_arrays
from tirbyoc.relax.rules import (
    Dispatched,
    DispatchError,
    DispatchReport,
    LibraryKernel,
    Matched,
    Rule,
    TIRKernel,
)


# ------------------------------------------------------------------------ helpers
def _tensor_type(expr):

    ty = expr.ty
    return ty if isinstance(ty, relax.TensorType) else None


def _static_shape(ty) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (AttributeError, TypeError):
        return None


def _op_inputs(call) -> list:

    out = []
    for arg in call.args:
        if isinstance(arg, relax.Tuple):
            out += list(arg.fields)
        elif _tensor_type(arg) is not None:
            out.append(arg)
    return out


def _check_signature(func, inputs, out_ty) -> str | None:
    """Why ``func`` cannot stand for the call (None if it can)."""

    params = list(func.params)
    want = [(_static_shape(_tensor_type(i)), str(_tensor_type(i).dtype)) for i in inputs]
    want.append((_static_shape(out_ty), str(out_ty.dtype)))
    if len(params) != len(want):
        return f"the kernel takes {len(params)} buffers, the call has {len(want) - 1} inputs and 1 output"
    for n, (p, (shape, dtype)) in enumerate(zip(params, want)):
        if not is_buffer(p):
            return f"kernel parameter {n} is not a buffer"
        got = tuple(int(s.value) if hasattr(s, "value") else None for s in p.shape)
        role = "output" if n == len(params) - 1 else f"input {n}"
        if got != shape or str(p.dtype) != dtype:
            return f"{role} is {dtype}{list(shape or ())}, the kernel's {p.name} is {p.dtype}{list(got)}"
    return None


def _rebuild(expr, inputs, params, var2val):
    """``expr`` (a matched subgraph) re-expressed over ``params`` instead of ``inputs``."""

    for i, p in zip(inputs, params):
        if expr.same_as(i):
            return p
    if isinstance(expr, relax.Var):
        value = var2val.get(expr)
        if value is None:
            raise DispatchError(f"the matched subgraph uses {expr.name_hint}, which is not among "
                                "the rule's inputs")
        return _rebuild(value, inputs, params, var2val)
    if isinstance(expr, relax.Call):
        args = [_rebuild(a, inputs, params, var2val) for a in expr.args]
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_rebuild(f, inputs, params, var2val) for f in expr.fields])
    return expr


def _single_call_module(params, make_call, libs=()):
    """A module whose ``main(params)`` returns ``make_call(add_func)`` (``add_func`` adds a
    PrimFunc to the module and returns its GlobalVar), with ``libs`` linked."""

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        out = bb.emit(make_call(bb.add_func))
        bb.emit_func_output(out)
    return with_external_mods(bb.get(), libs)


def _run_main(mod, target, arrays):

    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=target)
    vm = relax_vm(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _unique(exprs) -> list:
    out = []
    for e in exprs:
        if not any(e.same_as(o) for o in out):
            out.append(e)
    return out


def _verify(original, inputs, var2val, make_new, target, seed: int = 0):
    """(passed, max abs error) of the replacement against the original subgraph, both run on
    the same random inputs (an expression used twice, ``concat((h, x, h))``, is one input)."""


    distinct = _unique(inputs)
    params = [relax.Var(f"x{i}", _tensor_type(e)) for i, e in enumerate(distinct)]
    ref_mod = _single_call_module(params, lambda _add: _rebuild(original, distinct, params, var2val))
    new_params = [relax.Var(f"x{i}", _tensor_type(e)) for i, e in enumerate(distinct)]
    position = [next(n for n, d in enumerate(distinct) if d.same_as(e)) for e in inputs]
    new_mod = make_new(new_params, [new_params[n] for n in position])
    rng = np.random.default_rng(seed)
    arrays = [random_array(_static_shape(p.ty), str(p.ty.dtype), rng) for p in params]
    ref = _run_main(ref_mod, target, arrays)
    new = _run_main(new_mod, target, arrays)
    reduction = max((int(np.prod(a.shape[1:])) for a in arrays if a.ndim > 1), default=1)
    c = compare_arrays(ref, new, reduction=reduction)
    return c.passed, c.abs_err


# ---------------------------------------------------------------------------- pass
def _resolve_target(target):

    if target is not None:
        return make_target(target)
    return tvm.target.Target.current(allow_none=True)


def dispatch_module(mod, rules: Sequence[Rule], *, target=None, verify: bool = True,
                    report: DispatchReport | None = None):
    """``mod`` with every call a rule takes replaced; returns (mod, report)."""

    target = _resolve_target(target)
    active = [r for r in rules if r.applies_to(target)]
    runnable = target is not None and is_host_target(target)
    state = _Dispatching(relax.BlockBuilder(mod), report if report is not None else DispatchReport(),
                         verify and runnable, target)
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        for rule in active:
            var2val = relax.analysis.get_var2val(func)

            def rewriter(orig, matchings, rule=rule, var2val=var2val, fname=gv.name_hint):
                return _replace(orig, matchings, rule, var2val, fname, state)

            func = rewrite_call(rule.dfpattern(), rewriter, func)
        state.bb.update_func(gv, func)
    return with_external_mods(state.bb.get(), state.libs), state.report


@dataclass
class _Dispatching:
    """What one `dispatch_module` pass shares among its rewrites."""

    bb: object  # the BlockBuilder the kernels are added to
    report: DispatchReport
    verify: bool  # check each kernel against TVM's lowering (a target this CPU runs)
    target: object
    libs: list = field(default_factory=list)  # runtime modules of the library kernels used
    cache: dict = field(default_factory=dict)  # (rule, kernel, input shapes, attrs) -> (verified, error)
    seen: list = field(default_factory=list)  # calls reported already


def _kernel_call(action, m: Matched, inputs, out_ty):
    """(a function ``(args, add_func) -> the new call``, the runtime module it needs or None)
    for a rule's action, or why the kernel does not fit the call."""
    if isinstance(action, TIRKernel):
        prim = action.primfunc(m)
        why = _check_signature(prim, inputs, out_ty)
        if why:
            return why
        prim = prim.without_attr("global_symbol") if prim.attrs and "global_symbol" in prim.attrs else prim

        def tir_call(args, add_func):
            return relax.call_tir(add_func(prim, action.name), relax.Tuple(list(args)), out_ty)

        return tir_call, None
    module = action.packed.library.runtime_module()
    extra = action.scalar_args(m)

    def packed_call(args, add_func):
        return relax.call_dps_packed(relax.ExternFunc(action.packed.symbol),
                                     relax.Tuple(list(args) + extra), out_ty)

    return packed_call, module


def _replace(orig, matchings, rule, var2val, fname, state: _Dispatching):

    out_ty = _tensor_type(orig)
    record = Dispatched(fname, rule.label, rule.action.name, False)
    try:
        inputs = _op_inputs(orig) if rule.pattern is None else [matchings[p] for p in rule.inputs]
        m = Matched(orig, tuple(inputs), matchings)
        if rule.when is not None and not rule.when(m):
            return orig  # the predicate declines: not reported, the operator is simply not this rule's
        if out_ty is None or _static_shape(out_ty) is None:
            record.reason = f"the result is not a tensor of static shape ({orig.ty})"
            return orig
        if any(_tensor_type(i) is None or _static_shape(_tensor_type(i)) is None for i in inputs):
            record.reason = "an input is not a tensor of static shape"
            return orig
        action = rule.action
        built = _kernel_call(action, m, inputs, out_ty)
        if isinstance(built, str):
            record.reason = built
            return orig
        kernel_call, module = built
        libraries = [module] if module is not None else []
        if state.verify:
            key = (rule.label, action.name, tuple((_static_shape(_tensor_type(i)), str(_tensor_type(i).dtype))
                                                  for i in inputs), str(orig.attrs))
            if key not in state.cache:
                state.cache[key] = _verify(orig, inputs, var2val, lambda params, args: _single_call_module(
                    params, lambda add_func: kernel_call(args, add_func), libraries), state.target)
            record.verified, record.max_abs_err = state.cache[key]
            if record.verified is None:
                record.verified = False
                record.reason = ("not used: TVM's lowering gives a degenerate output (non-finite, "
                                 "zero or constant) on test data, so the kernel could not be checked")
                return orig
            if not record.verified:
                record.reason = f"the kernel disagrees with TVM's lowering (max abs error {record.max_abs_err:.3g})"
                return orig
        record.replaced = True
        state.libs.extend(libraries)
        return kernel_call(inputs, state.bb.add_func)
    except DispatchError:
        raise
    except Exception as err:  # noqa: BLE001 - a kernel that fails to build is not used
        record.reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
        return orig
    finally:
        # rewrite_call repeats until nothing changes, so a kept call is seen again: report once
        if (record.replaced or record.reason) and not any(orig.same_as(c) for c in state.seen):
            state.seen.append(orig)
            state.report.calls.append(record)


def Dispatch(rules: Sequence[Rule], *, target=None, verify: bool = True,
             report: DispatchReport | None = None):
    """The pass form of `dispatch_module`. ``target``: the target to dispatch for (default:
    the current ``tvm.target.Target``, as inside ``with target:``)."""

    rules = list(rules)
    for r in rules:
        if not isinstance(r, Rule):
            raise DispatchError(f"Dispatch takes Rule objects, got {r!r}")
    report = report if report is not None else DispatchReport()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.Dispatch")
    def _pass(mod, _ctx):
        new, _ = dispatch_module(mod, rules, target=target, verify=verify, report=report)
        return new

    _pass.report = report
    return _pass


__all__ = ["Dispatch", "DispatchError", "DispatchReport", "Dispatched", "LibraryKernel", "Matched", "Rule",
           "TIRKernel", "dispatch_module"]
