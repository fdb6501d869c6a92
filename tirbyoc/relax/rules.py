"""What a `Dispatch` rule is: the operator or pattern it takes, the predicate and targets it
applies to, and its action - a `TIRKernel` (``R.call_tir`` of a PrimFunc the rule writes) or a
`LibraryKernel` (``R.call_dps_packed`` of a packed function); and the report of what was
replaced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tvm import relax
from tvm.relax.dpl import is_op

from tirbyoc._tvm import tirx, tvm
from tirbyoc.decl.extern import PackedFunction
from tirbyoc.errors import TirbyocError


def tvm_float(v: float):
    """A float64 constant (Relax's ``prim_value`` of a Python float)."""
    return tirx.FloatImm("float64", v)


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


__all__ = ["DispatchError", "DispatchReport", "Dispatched", "LibraryKernel", "Matched", "Rule", "TIRKernel"]
