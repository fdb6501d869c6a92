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
from typing import Callable, Sequence

import numpy as np

from .errors import TirbyocError
from .extern import PackedFunction


class DispatchError(TirbyocError):
    """A dispatch rule that is malformed (not a mismatch at one call: those fall back)."""


@dataclass(frozen=True)
class Matched:
    """What a rule matched: the root ``call``, the kernel ``inputs``, and ``m[pattern]`` for
    the expression any sub-pattern matched (``m[conv].attrs.strides``)."""

    call: object
    inputs: tuple
    matchings: object = None

    def __getitem__(self, pattern):
        return self.matchings[pattern]

    @property
    def attrs(self):
        return self.call.attrs


@dataclass(frozen=True)
class TIRKernel:
    """A hand-written TensorIR kernel: a PrimFunc (inputs..., output) with static shapes, or a
    function ``(m: Matched) -> PrimFunc`` that writes one for the matched call."""

    func: object
    name: str = "dispatched"

    def primfunc(self, m: Matched):
        from ._tvm import tirx

        func = self.func(m) if callable(self.func) and not isinstance(self.func, tirx.PrimFunc) else self.func
        if not isinstance(func, tirx.PrimFunc):
            raise DispatchError(f"TIR kernel {self.name!r} gave {type(func).__name__}, not a PrimFunc")
        return func


@dataclass(frozen=True)
class LibraryKernel:
    """A library's packed function, called as ``R.call_dps_packed(symbol, (inputs...,
    scalars...), out)``. ``scalars(m: Matched)``: optional integers or floats the kernel
    needs besides its tensors (a convolution's stride and padding), read from the matched
    calls' attributes; passed after the inputs, before the destination."""

    packed: PackedFunction
    scalars: Callable | None = None

    def scalar_args(self, m: Matched) -> list:
        from tvm import relax

        extra = list(self.scalars(m)) if self.scalars is not None else []
        values = []
        for v in extra:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise DispatchError(f"library kernel {self.name!r}: scalars must be int or float, got {v!r}")
            values.append(relax.prim_value(v) if isinstance(v, int) else relax.prim_value(tvm_float(v)))
        return values

    @property
    def name(self) -> str:
        return self.packed.symbol


@dataclass(frozen=True)
class Rule:
    """Replace ``op`` (or ``pattern``) by ``action`` where ``when`` holds, for ``targets``.

    ``op``: a Relax operator name; the kernel's inputs are the call's tensor arguments (a
    tuple argument, as ``concat`` has, is flattened). ``pattern``: a ``tvm.relax.dpl``
    pattern instead, with ``inputs`` the sub-patterns whose matches are the kernel's inputs,
    in order. ``when(m: Matched)``: optional predicate on what matched (shapes, dtypes,
    attributes of any matched call); a rule whose predicate declines is silent. ``targets``:
    target kinds or keys (``"llvm"``, ``"cuda"``, ``"cpu"``, ``"gpu"``) or a predicate on the
    ``tvm.target.Target``; empty means every target.
    """

    op: str | None = None
    action: TIRKernel | LibraryKernel | None = None
    pattern: object = None
    inputs: tuple = ()
    when: Callable | None = None
    targets: tuple | Callable = ()
    name: str = ""

    def __post_init__(self):
        if (self.op is None) == (self.pattern is None):
            raise DispatchError("a Rule needs exactly one of op (a Relax operator name) or pattern")
        if self.op is not None:
            from ._tvm import tvm

            try:
                tvm.ir.Op.get(self.op)
            except Exception:
                raise DispatchError(f"rule for {self.op!r}: TVM has no operator of that name "
                                    "(operator names look like 'relax.concat')") from None
        if self.pattern is not None and not self.inputs:
            raise DispatchError("a pattern rule must name its kernel inputs (inputs=(x, w, ...))")
        if not isinstance(self.action, (TIRKernel, LibraryKernel)):
            raise DispatchError(f"rule {self.label}: action must be a TIRKernel or LibraryKernel, "
                                f"got {self.action!r}")
        if not callable(self.targets):
            object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def label(self) -> str:
        return self.name or self.op or "pattern"

    def applies_to(self, target) -> bool:
        if callable(self.targets):
            return target is not None and bool(self.targets(target))
        if not self.targets:
            return True
        if target is None:
            return False
        names = {str(target.kind.name), *(str(k) for k in target.keys)}
        return any(t in names for t in self.targets)

    def dfpattern(self):
        if self.pattern is not None:
            return self.pattern
        from tvm.relax.dpl import is_op

        return is_op(self.op)(varg_default_wildcard=True)


@dataclass
class Dispatched:
    """One matched call: what it became, or why it stayed."""

    function: str
    rule: str
    kernel: str
    replaced: bool
    verified: bool | None = None
    max_abs_err: float = float("nan")
    reason: str | None = None


@dataclass
class DispatchReport:
    calls: list[Dispatched] = field(default_factory=list)

    @property
    def replaced(self) -> list[Dispatched]:
        return [c for c in self.calls if c.replaced]


# ------------------------------------------------------------------------ helpers
def tvm_float(v: float):
    from ._tvm import tirx

    return tirx.FloatImm("float64", v)


def _tensor_type(expr):
    from tvm import relax

    ty = expr.ty
    return ty if isinstance(ty, relax.TensorType) else None


def _static_shape(ty) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (AttributeError, TypeError):
        return None


def _op_inputs(call) -> list:
    from tvm import relax

    out = []
    for arg in call.args:
        if isinstance(arg, relax.Tuple):
            out += list(arg.fields)
        elif _tensor_type(arg) is not None:
            out.append(arg)
    return out


def _check_signature(func, inputs, out_ty) -> str | None:
    """Why ``func`` cannot stand for the call (None if it can)."""
    from ._tvm import tirx

    params = list(func.params)
    want = [(_static_shape(_tensor_type(i)), str(_tensor_type(i).dtype)) for i in inputs]
    want.append((_static_shape(out_ty), str(out_ty.dtype)))
    if len(params) != len(want):
        return f"the kernel takes {len(params)} buffers, the call has {len(want) - 1} inputs and 1 output"
    for n, (p, (shape, dtype)) in enumerate(zip(params, want)):
        if not isinstance(p, tirx.Buffer):
            return f"kernel parameter {n} is not a buffer"
        got = tuple(int(s.value) if hasattr(s, "value") else None for s in p.shape)
        role = "output" if n == len(params) - 1 else f"input {n}"
        if got != shape or str(p.dtype) != dtype:
            return f"{role} is {dtype}{list(shape or ())}, the kernel's {p.name} is {p.dtype}{list(got)}"
    return None


def _rebuild(expr, inputs, params, var2val):
    """``expr`` (a matched subgraph) re-expressed over ``params`` instead of ``inputs``."""
    from tvm import relax

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
    from ._tvm import with_external_mods
    from tvm import relax

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        out = bb.emit(make_call(bb.add_func))
        bb.emit_func_output(out)
    return with_external_mods(bb.get(), libs)


def _run_main(mod, target, arrays):
    from ._tvm import relax_vm, tvm
    from tvm import relax

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
    from tvm import relax

    from .verification import compare_arrays, random_array

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
    from ._tvm import make_target, tvm

    if target is not None:
        return make_target(target)
    return tvm.target.Target.current(allow_none=True)


def dispatch_module(mod, rules: Sequence[Rule], *, target=None, verify: bool = True,
                    report: DispatchReport | None = None):
    """``mod`` with every call a rule takes replaced; returns (mod, report)."""
    from ._tvm import is_host_target, with_external_mods
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    report = report if report is not None else DispatchReport()
    target = _resolve_target(target)
    active = [r for r in rules if r.applies_to(target)]
    runnable = target is not None and is_host_target(target)
    bb = relax.BlockBuilder(mod)
    libs: list = []  # runtime modules of the library kernels used
    verified_cache: dict = {}
    seen: list = []
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        for rule in active:
            var2val = relax.analysis.get_var2val(func)

            def rewriter(orig, matchings, rule=rule, var2val=var2val, fname=gv.name_hint):
                return _replace(orig, matchings, rule, var2val, fname, bb, libs, report,
                                verify and runnable, target, verified_cache, seen)

            func = rewrite_call(rule.dfpattern(), rewriter, func)
        bb.update_func(gv, func)
    return with_external_mods(bb.get(), libs), report


def _replace(orig, matchings, rule, var2val, fname, bb, libs, report, verify, target, cache, seen):
    from tvm import relax

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
        module = None
        if isinstance(action, TIRKernel):
            prim = action.primfunc(m)
            why = _check_signature(prim, inputs, out_ty)
            if why:
                record.reason = why
                return orig
            prim = prim.without_attr("global_symbol") if prim.attrs and "global_symbol" in prim.attrs else prim

            def kernel_call(args, add_func):
                return relax.call_tir(add_func(prim, action.name), relax.Tuple(list(args)), out_ty)
        else:
            module = action.packed.library.runtime_module()
            extra = action.scalar_args(m)

            def kernel_call(args, add_func):
                return relax.call_dps_packed(relax.ExternFunc(action.packed.symbol),
                                             relax.Tuple(list(args) + extra), out_ty)
        libraries = [module] if module is not None else []
        if verify:
            key = (rule.label, action.name, tuple((_static_shape(_tensor_type(i)), str(_tensor_type(i).dtype))
                                                  for i in inputs), str(orig.attrs))
            if key not in cache:
                cache[key] = _verify(orig, inputs, var2val, lambda params, args: _single_call_module(
                    params, lambda add_func: kernel_call(args, add_func), libraries), target)
            record.verified, record.max_abs_err = cache[key]
            if record.verified is None:
                record.verified = False
                record.reason = ("not used: TVM's lowering gives a degenerate output (non-finite, "
                                 "zero or constant) on test data, so the kernel could not be checked")
                return orig
            if not record.verified:
                record.reason = f"the kernel disagrees with TVM's lowering (max abs error {record.max_abs_err:.3g})"
                return orig
        record.replaced = True
        libs.extend(libraries)
        return kernel_call(inputs, bb.add_func)
    except DispatchError:
        raise
    except Exception as err:  # noqa: BLE001 - a kernel that fails to build is not used
        record.reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
        return orig
    finally:
        # rewrite_call repeats until nothing changes, so a kept call is seen again: report once
        if (record.replaced or record.reason) and not any(orig.same_as(c) for c in seen):
            seen.append(orig)
            report.calls.append(record)


def Dispatch(rules: Sequence[Rule], *, target=None, verify: bool = True,
             report: DispatchReport | None = None):
    """The pass form of `dispatch_module`. ``target``: the target to dispatch for (default:
    the current ``tvm.target.Target``, as inside ``with target:``)."""
    from ._tvm import tvm

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
