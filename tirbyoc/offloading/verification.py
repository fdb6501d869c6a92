"""Numerical proof of a rewrite: build both functions, run them on the same inputs, compare.

Every offload tirbyoc makes is checked this way. Inputs are seeded, drawn in the domain the
function's own use of each buffer implies (`tirbyoc.ir.domains`: gather indices inside the
table, shift amounts below the width, non-zero divisors), and otherwise suited to the dtype
(full range for 8-bit integers, so a saturating instruction shows; small values for wider
integers so sums do not overflow; uniform in [-1, 1] for floats) - or given (a model's
function runs on its call site's constants, `tirbyoc.relax.call_sites`). Integers must agree
exactly; floats within a tolerance relative to the reference's own scale that grows with the
reduction length. A reference that cannot tell a right result from a wrong one (non-finite,
all zero, one constant) is "not meaningfully checked", and a reference build that disagrees
with itself on the same inputs is never blamed on the rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tirbyoc._tvm import REDUCE, expr_dtype, is_buffer, iter_blocks, make_target, tirx, tvm
from tirbyoc.decl.host import host_target
from tirbyoc.dtypes import is_float, numpy_dtype
from tirbyoc.errors import VerificationError
from tirbyoc.ir.domains import buffer_domains, draw
from tirbyoc.ir.tir_walk import iter_exprs
from tirbyoc.offloading.devices import EmulatedRunError, compile_func, device_of, run_executable
from tirbyoc.offloading.devices import reference_target as reference_build_target  # a parameter has its name

# Relative tolerance per float dtype, scaled by sqrt(reduction length) in `tolerance`.
_FLOAT_RTOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-13}
# bfloat16 values are float32 sums rounded (--precision bf16 accumulates in float32): two builds
# whose sums differ in their last float32 bits round a value near a bfloat16 boundary one
# bfloat16 step (2^-7 of its magnitude) apart; a model rounds again at every layer, so the
# steps carry on (ResNet-18: 0.11 of a step of the output's scale at its output). Allowed: 4
# steps of the scale (the factor of 4 every float tolerance has), plus float32's own
_ROUNDING_STEP = {"bfloat16": 2.0 ** -7}


@dataclass(frozen=True)
class Verification:
    """The outcome of `verify`.

    ``passed`` is True when every output agreed within its tolerance, False when one did not,
    and None when nothing meaningful was compared: the rewritten code could not run here (no
    device for its target), or the reference output is degenerate (non-finite, all zero or
    constant) so that agreeing with it proves nothing. ``reason`` then says which.
    """

    passed: bool | None
    max_abs_err: float
    outputs: dict[str, float] = field(default_factory=dict)  # per written buffer: max |diff|
    tolerance: dict[str, float] = field(default_factory=dict)  # per written buffer: abs tolerance
    reason: str | None = None
    max_rel_err: float = float("nan")  # max |diff| / max |reference| over the outputs
    ran_on: str | None = None  # where the rewritten code ran, when not this CPU or its GPU

    def __bool__(self) -> bool:
        return bool(self.passed)

    def describe(self) -> str:
        if self.passed is None:
            return f"not meaningfully checked: {self.reason}" if self.outputs else f"not run: {self.reason}"
        word = "verified" if self.passed else "MISMATCH"
        note = f", {self.reason}" if self.reason else ""
        if self.ran_on:
            note += f", ran under {self.ran_on}"
        tol = max(self.tolerance.values(), default=0.0)
        return (f"{word} (max |err| {self.max_abs_err:.3g}, relative {self.max_rel_err:.3g}, "
                f"tolerance {tol:.3g}{note})")


def tolerance(dtype: str, reduction: int, scale: float) -> float:
    """Absolute tolerance for one output: 0 for integers, else rtol(dtype) *
    sqrt(reduction) * 4 * ``scale``, where ``scale`` is the reference's largest magnitude
    (bfloat16: four bfloat16 steps of ``scale`` more than float32's, `_ROUNDING_STEP`).

    Relative to the output's own scale, never to 1: outputs of 1e-14 are compared at their
    scale, not waved through by an absolute floor.
    """
    if not is_float(dtype):
        return 0.0
    if dtype in _ROUNDING_STEP:
        return float(_ROUNDING_STEP[dtype] * 4 * scale + tolerance("float32", reduction, scale))
    rtol = _FLOAT_RTOL.get(dtype, 1e-5)
    return float(rtol * max(1.0, np.sqrt(reduction)) * 4 * scale)


@dataclass(frozen=True)
class Comparison:
    """One output compared with its reference.

    ``passed`` is None when the reference is degenerate (``note`` says how): non-finite
    values, all zero, or one constant value - agreeing with it would prove nothing.
    """

    passed: bool | None
    abs_err: float
    rel_err: float  # abs_err / scale
    tolerance: float  # absolute
    scale: float  # largest |reference| value
    note: str | None = None


def degenerate(ref: np.ndarray) -> str | None:
    """Why ``ref`` cannot meaningfully check anything (None if it can)."""
    if ref.size == 0:
        return "the output is empty"
    if ref.dtype.kind == "f" or ref.dtype.kind == "c":
        bad = int(np.size(ref) - np.count_nonzero(np.isfinite(ref)))
        if bad:
            return f"the reference has {bad:,} non-finite values of {ref.size:,} (NaN/Inf)"
    if not np.any(ref):
        return "the reference is all zero"
    if ref.size > 1 and np.all(ref == ref.flat[0]):
        return f"the reference is one constant value ({ref.flat[0]!r}) everywhere"
    return None


def compare_arrays(ref: np.ndarray, new: np.ndarray, dtype: str | None = None,
                   reduction: int = 1) -> Comparison:
    """``new`` against ``ref``: integers exactly, floats within `tolerance` of the
    reference's scale. A non-finite value where the reference is finite is an infinite
    error; a degenerate reference (see `degenerate`) gives ``passed=None``."""
    dtype = dtype or str(ref.dtype)
    if ref.shape != new.shape:
        return Comparison(False, float("inf"), float("inf"), 0.0, 0.0,
                          f"shape {new.shape} where the reference has {ref.shape}")
    ref64, new64 = ref.astype(np.float64), new.astype(np.float64)
    finite = np.isfinite(ref64)
    scale = float(np.abs(ref64[finite]).max()) if finite.any() else 0.0
    diff = np.abs(ref64 - new64)
    err = float(diff[finite].max()) if finite.any() else 0.0
    if not np.isfinite(new64[finite]).all():
        err = float("inf")
    tol = tolerance(dtype, reduction, scale)
    rel = err / scale if scale else (0.0 if err == 0 else float("inf"))
    why = degenerate(ref)
    if why is not None:
        return Comparison(None if err <= tol or not finite.all() else False, err, rel, tol, scale, why)
    return Comparison(bool(err <= tol), err, rel, tol, scale)


def concrete_params(func):
    """(buffer, static shape) per parameter; a clear error for a non-buffer or symbolic one."""
    out = []
    for buf in func.params:
        if not is_buffer(buf):
            raise VerificationError(f"parameter {buf} is not a buffer; verify needs a "
                                    "PrimFunc whose parameters are all tensors")
        shape = []
        for s in buf.shape:
            if not hasattr(s, "value"):
                raise VerificationError(
                    f"buffer {buf.name} has symbolic shape {list(buf.shape)}; pass concrete "
                    "`inputs` or specialise the function first")
            shape.append(int(s.value))
        out.append((buf.name, tuple(shape), str(buf.dtype)))
    return out


# What each symbolic extent is bound to for a check, one check per value: 1, below a tile of
# 16, a multiple of 16, one past it, and a large size off every power of two - the paths a
# rewrite takes for a runtime size (a tail, a whole tile, padding, many tiles).
SYMBOLIC_SIZES = (1, 7, 16, 17, 131)
# ... all size variables bound alike while the product of their values stays within this; past
# it each variable is checked alone at the size, the others at 1: a served transformer's batch
# and seq both at 131 made 17,161 rows, and TVM's unscheduled build of the untouched BERT-base
# functions, the reference of every check, took minutes a function.
SYMBOLIC_VOLUME = 17 ** 3


def symbolic_names(funcs) -> list[str]:
    """The size variables of the functions' parameter shapes (``T.int32()``, a Relax ``n``)."""
    return sorted({str(d.name) for f in funcs for p in f.params if is_buffer(p)
                   for d in p.shape if isinstance(d, tirx.Var)} | {str(p.name) for f in funcs for p in _size_params(f)})


def _size_params(func) -> list:
    """The scalar integer parameters of ``func``: sizes Relax passes because no buffer's
    extent is that size alone (``past`` of a concatenation's ``past + seq``)."""
    return [p for p in func.params if not is_buffer(p) and expr_dtype(p).startswith(("int", "uint"))]


def _size_vars(expr) -> set[str]:
    """The names of the variables in an extent (``past + seq``: past, seq)."""
    return {str(n.name) for n in iter_exprs(expr) if isinstance(n, tirx.Var)}


def specialize_symbolic(funcs, values: dict):
    """``funcs`` with every symbolic extent of their parameters bound to ``values[name]``:
    the parameters whose extents are bare size variables are bound, and TVM's specialization
    carries the values into every other extent (a concatenation's ``past + seq``); functions
    without symbolic parameters come back as they are."""
    out = []
    for f in funcs:
        binds = {p: tirx.IntImm(expr_dtype(p), values[str(p.name)]) for p in _size_params(f) if str(p.name) in values}
        for p in f.params:
            shape = list(getattr(p, "shape", ())) if is_buffer(p) else []
            _check_compound(p, shape, values)
            if not any(isinstance(d, tirx.Var) for d in shape):
                continue
            # a compound extent (past + seq) stays as it is (TVM's specialization carries the
            # values bound elsewhere into it) beside this buffer's bare size variables, bound
            # each extent keeps its dtype (a Relax model's are int64): specialize matches them
            concrete = [tirx.IntImm(expr_dtype(d), values[str(d.name)]) if isinstance(d, tirx.Var) else d
                        for d in shape]
            binds[p] = tirx.decl_buffer(concrete, str(p.dtype), str(p.name))
        out.append(f.specialize(binds) if binds else f)
    return out


def _check_compound(param, shape, values: dict) -> None:
    """Raise unless every variable of ``param``'s compound extents is one ``values`` binds
    (through another parameter whose extent it is)."""
    free = set().union(*(_size_vars(d) for d in shape if not isinstance(d, (tirx.Var, tirx.IntImm))))
    if not free <= set(values):
        raise VerificationError(f"buffer {param.name} has shape {shape}; its extents use "
                                f"{', '.join(sorted(free - set(values)))}, which no other parameter's "
                                "extent defines, so no size can be bound for a check")


def _written(func) -> set[str]:

    names = set()
    for block in iter_blocks(func.body):
        for region in block.writes:
            names.add(str(region.source.name))
    return names


def reduction_length(func) -> int:

    longest = 1
    for block in iter_blocks(func.body):
        n = 1
        for iv in block.iter_vars:
            if int(iv.iter_type) == REDUCE and hasattr(iv.dom.extent, "value"):
                n *= int(iv.dom.extent.value)
        longest = max(longest, n)
    return longest


def verify(original, rewritten, target=None, inputs=None, *, seed: int = 0,
           reference_target=None, capacities: dict | None = None) -> Verification:
    """Build ``original`` and ``rewritten`` (PrimFuncs with the same signature), run both on
    the same seeded inputs, and compare every buffer the original writes.

    ``target``: where the rewritten function runs (a Target, a target dict, or a template's
    target); default the host CPU. ``reference_target``: where the original runs (default:
    the host CPU, TVM's default lowering). ``inputs``: optional dict buffer name -> array.
    ``capacities``: bytes per memory scope (a template's scratchpads), for code that runs in
    an emulator which models them (VTCM under qemu-hexagon).
    """

    if not _sized_by(original, inputs):  # symbolic extents the inputs do not fix: one check per size
        sized = at_symbolic_sizes([original, rewritten], lambda funcs, bound: _verify_once(
            *funcs, target, inputs, seed, reference_target, capacities, bound))
        if sized is not None:
            return sized
    return _verify_once(original, rewritten, target, inputs, seed, reference_target, capacities, {})


def _sized_by(func, inputs) -> bool:
    """Whether ``inputs`` hold a buffer of ``func`` whose shape is symbolic (they fix its sizes)."""
    return bool(inputs) and any(not all(isinstance(d, tirx.IntImm) for d in b.shape)
                                for b in func.params if is_buffer(b) and b.name in inputs)


def at_symbolic_sizes(funcs, check) -> Verification | None:
    """``check(funcs, bound)`` once per binding of `symbolic_bindings` (each size of
    `SYMBOLIC_SIZES` for every size variable of ``funcs``; ``funcs`` specialized, ``bound`` the
    binding): the first result that does not pass, else the worst one saying the sizes checked;
    None when ``funcs`` have no size variable."""
    names = symbolic_names(funcs)
    if not names:
        return None
    checks = []
    for bound in symbolic_bindings(names):
        result = check(specialize_symbolic(funcs, bound), bound)
        if result.passed is not True:
            return result  # the first size that fails (or cannot be checked) says so
        checks.append(result)
    worst = max(checks, key=lambda c: c.max_rel_err)
    said = [symbolic_checks_said(names)]
    said += [n for n in (worst.reason or "").split("; ") if n and not n.startswith("checked with ")]
    return replace(worst, reason="; ".join(said))


def _together(names, size: int) -> bool:
    """Whether every variable of ``names`` is bound to ``size`` at once (`SYMBOLIC_VOLUME`)."""
    return size ** len(names) <= SYMBOLIC_VOLUME


def symbolic_bindings(names) -> list[dict]:
    """The bindings a function of the size variables ``names`` is checked at: each size of
    `SYMBOLIC_SIZES` for all of them together, or, where that outgrows `SYMBOLIC_VOLUME`, for
    each alone with the others at 1."""
    out = []
    for size in SYMBOLIC_SIZES:
        if _together(names, size):
            out.append(dict.fromkeys(names, size))
        else:
            out += [{n: size if n == name else 1 for n in names} for name in names]
    return out


def symbolic_checks_said(names) -> str:
    """`symbolic_bindings` in words: "checked with m = n = 1, 7, 16, 17; each alone (the
    others 1) at 131"."""
    together = [s for s in SYMBOLIC_SIZES if _together(names, s)]
    alone = [s for s in SYMBOLIC_SIZES if not _together(names, s)]
    said = f"checked with {' = '.join(names)} = {', '.join(map(str, together))}"
    return said + (f"; each alone (the others 1) at {', '.join(map(str, alone))}" if alone else "")


def _verify_once(original, rewritten, target, inputs, seed, reference_target, capacities, bound) -> Verification:
    """`verify` of two functions with static shapes (``bound``: the sizes they were given)."""
    params = concrete_params(original)
    other = concrete_params(rewritten)
    if [(s, d) for _, s, d in params] != [(s, d) for _, s, d in other]:
        raise VerificationError(
            f"signatures differ: original {params} vs rewritten {other}; a rewrite must keep "
            "the function's parameters")
    target = make_target(target) if target is not None else host_target()
    reference_target = reference_build_target(reference_target)
    device = device_of(target)
    cannot_run = device.cannot_run(rewritten, target)
    if cannot_run is not None:
        return Verification(None, float("nan"), reason=cannot_run)
    arrays = make_inputs(original, params, inputs, seed)
    ref_exe = compile_func(original, reference_target, "original")
    ref_out = run_executable(ref_exe, [a.copy() for a in arrays], tvm.cpu())
    try:
        new_out, ran_on = device.run(rewritten, target, arrays, capacities)
    except EmulatedRunError as err:  # a crash is a failure; missing tools are not
        return Verification(False if err.crashed else None, float("inf") if err.crashed else float("nan"),
                            reason=str(err), ran_on=err.emulator)
    notes = ["checked with " + ", ".join(f"{k}={v}" for k, v in bound.items())] if bound else []
    return _judge(original, params, ref_out, new_out, notes, ran_on,
                  lambda: run_executable(ref_exe, [a.copy() for a in arrays], tvm.cpu()))


def _judge(original, params, ref_out, new_out, notes: list, ran_on, rerun_reference) -> Verification:
    """Every buffer ``original`` writes compared; a failure first re-runs the reference
    (``rerun_reference``): a reference that disagrees with itself is not the rewrite's fault."""
    written = _written(original)
    red = reduction_length(original)
    results = {name: compare_arrays(ref, new, dtype, red)
               for (name, _, dtype), ref, new in zip(params, ref_out, new_out) if name in written}
    if not results:
        raise VerificationError("the original function writes none of its parameters; nothing to compare")
    if any(c.passed is False for c in results.values()):
        again = rerun_reference()
        unstable = [name for (name, _, _), a, b in zip(params, ref_out, again)
                    if name in results and not np.array_equal(a, b, equal_nan=True)]
        passed = None if unstable else False
        if unstable:
            notes.append(f"TVM's build of the untouched function disagrees with itself on "
                         f"{', '.join(unstable)} (does it read outside its inputs' valid "
                         "domain?); give inputs in their domain")
    elif any(c.passed is None for c in results.values()):
        passed = None
        notes += [f"{name}: {c.note}" for name, c in results.items() if c.passed is None]
    else:
        passed = True
    return Verification(passed, max(c.abs_err for c in results.values()),
                        {k: c.abs_err for k, c in results.items()},
                        {k: c.tolerance for k, c in results.items()},
                        reason="; ".join(notes) or None,
                        max_rel_err=max(c.rel_err for c in results.values()), ran_on=ran_on)


def make_inputs(func, params, inputs, seed: int) -> list[np.ndarray]:
    """One array per parameter: the caller's where given (a 0-d buffer takes a scalar),
    else seeded data drawn from the domain the function's own use of the buffer implies
    (`tirbyoc.ir.domains`: gather indices within the table, shift amounts below the width,
    non-zero divisors), else `random_array`."""

    domains = buffer_domains(func)
    rng = np.random.default_rng(seed)
    arrays = []
    for name, shape, dtype in params:
        if inputs and name in inputs:
            arr = np.ascontiguousarray(np.asarray(inputs[name]).astype(numpy_dtype(dtype)))
            if arr.shape != shape and arr.size == int(np.prod(shape)) == 1:
                arr = arr.reshape(shape)
            if arr.shape != shape:
                raise VerificationError(f"input {name!r} has shape {arr.shape}, the function wants {shape}")
        else:
            arr = draw(shape, dtype, rng, domains.get(name))
        arrays.append(arr)
    return arrays


__all__ = ["Comparison", "SYMBOLIC_VOLUME", "Verification", "at_symbolic_sizes", "compare_arrays", "compile_func", "degenerate", "make_inputs",
           "run_executable", "symbolic_bindings", "symbolic_checks_said", "tolerance", "verify"]
