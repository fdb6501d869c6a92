"""Differential fuzzing: random workloads x templates, every rewrite checked against TVM.

Each case is drawn from a seed (``case(seed, index)``, reproducible): a schedulable PrimFunc -
a matmul (loop order, transposed operands, commuted product, init inside or out), a batched
matmul, a conv2d (NCHW / NHWC, stride, padding, dilation), a depthwise conv, a pooling, an
elementwise op or a non-multiply-add reduction, written with tirbyoc's TVMScript generators or
legalized from Relax operators - with extents that include 1, primes and values around each
intrinsic's width, and int8 / uint8 / int32 / float16 / bfloat16 / float32 operands. `run_case` offloads it
to a template that runs here (on this CPU, or under qemu-hexagon) *without* tirbyoc's own
verification, then builds the result and the untouched function and compares them on inputs
of its own. Outcomes are exactly:

* ``verified``: at least one block rewritten, and the outputs agree;
* ``fallback``: nothing rewritten, with the reason (grouped into a category);
* ``failure``: a wrong result, or an exception escaping `offload` - a bug to fix.

``python -m tirbyoc.testing.fuzz --cases 10000 [--seed S] [--templates x86_vnni,blas] [--json]
[--save-failures F]`` runs the long mode with a progress line and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tvm import relax

from tirbyoc._tvm import tirx
from tirbyoc.app.jsonout import dumps, finite
from tirbyoc.decl.registry import get_template, templates
from tirbyoc.matching.results import MatchStage, Mismatch
from tirbyoc.offloading.devices import device_of
from tirbyoc.offloading.offloader import BlockOutcome, offload
from tirbyoc.offloading.table import render
from tirbyoc.offloading.verification import verify
from tirbyoc.testing.workloads import matmul

# extents near the widths intrinsics use (4, 16, 32, 64), primes, and 1
EXTENTS = (1, 2, 3, 4, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65)
MATMUL_DTYPES = (("uint8", "int8", "int32"), ("int8", "int8", "int32"), ("uint8", "uint8", "int32"),
                 ("float32", "float32", "float32"), ("float16", "float16", "float32"),
                 ("float16", "float16", "float16"), ("int32", "int32", "int32"), ("bfloat16", "bfloat16", "float32"))
CONV_DTYPES = (("uint8", "int8", "int32"), ("int8", "int8", "int32"), ("float32", "float32", "float32"),
               ("float16", "float16", "float32"), ("bfloat16", "bfloat16", "float32"))
KINDS = ("matmul", "matmul", "matmul", "batch_matmul", "conv2d", "conv2d", "depthwise", "pool",
         "elementwise", "reduce_sum")
MAX_MACS = 1 << 20  # keeps a case around a second on two cores


@dataclass(frozen=True)
class Case:
    """One workload and template, as plain data (what a regression test stores)."""

    seed: int
    index: int
    kind: str
    params: dict
    template: str

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind}({args}) on {self.template}"


@dataclass
class Outcome:
    case: Case
    outcome: str  # verified | fallback | failure
    category: str  # for fallbacks and failures: a short class of reason
    detail: str = ""
    seconds: float = 0.0


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _small(rng, count: int, budget: int = MAX_MACS) -> list[int]:
    """``count`` extents from EXTENTS whose product stays within ``budget``."""
    while True:
        dims = [int(_pick(rng, EXTENTS)) for _ in range(count)]
        if int(np.prod(dims)) <= budget:
            return dims


def template_dtypes(name: str) -> list[tuple[str, str, str]]:
    """(a, b, accumulator) dtypes of the template's compute intrinsics."""

    out = []
    for g in get_template(name).groups:
        ops = g.compute.operands
        if len(ops) == 3:
            out.append(tuple(str(o.dtype) for o in ops))
    return sorted(set(out))


def _dtypes(rng, template: str, pool):
    """Mostly what the template computes (so rewrites happen), sometimes anything."""
    own = template_dtypes(template)
    return tuple(_pick(rng, own)) if own and rng.random() < 0.7 else tuple(_pick(rng, pool))


def case(seed: int, index: int, templates) -> Case:
    """The ``index``-th case of run ``seed`` (independent of the others)."""
    rng = np.random.default_rng([seed, index])
    kind = str(_pick(rng, KINDS))
    template = str(_pick(rng, list(templates)))
    if kind in ("matmul", "batch_matmul"):
        m, n, k = _small(rng, 3)
        a, b, c = _dtypes(rng, template, MATMUL_DTYPES)
        params = dict(m=m, n=n, k=k, a=a, b=b, c=c, trans_a=bool(rng.integers(2)),
                      trans_b=bool(rng.integers(2)), order="".join(rng.permutation(list("ijk"))),
                      init=str(_pick(rng, ("inside", "outside"))), swap_mul=bool(rng.integers(2)))
        if kind == "batch_matmul":
            params["batch"] = int(_pick(rng, (1, 2, 3, 4)))
        # extents known only at run time (rows; or a lane or reduction axis, padded when the
        # function runs); drawn last, so the other parameters of a seed stay as they were
        if rng.random() < 0.25:
            params["symbolic"] = str(_pick(rng, ("m", "m", "n", "k", "mnk")))
    elif kind in ("conv2d", "depthwise"):
        a, b, c = _dtypes(rng, template, CONV_DTYPES)
        k = int(_pick(rng, (1, 3, 5)))
        hw = int(_pick(rng, (k, k + 1, 7, 8, 9, 14, 15, 16)))
        ch = int(_pick(rng, (1, 3, 4, 8, 16, 17, 32)))
        oc = ch if kind == "depthwise" else int(_pick(rng, (1, 4, 8, 16, 17, 32, 48)))
        params = dict(c=ch, hw=hw, oc=oc, k=k, stride=int(_pick(rng, (1, 1, 2))),
                      padding=int(_pick(rng, (0, 0, 1, k // 2))), dilation=int(_pick(rng, (1, 1, 2))),
                      layout=str(_pick(rng, ("NCHW", "NHWC"))) if kind == "conv2d" else "NCHW",
                      a=a, b=b, c_dtype=c)
        if params["dilation"] * (k - 1) + 1 > hw + 2 * params["padding"]:
            params["dilation"] = 1
    elif kind == "pool":
        params = dict(c=int(_pick(rng, (1, 4, 16))), hw=int(_pick(rng, (4, 7, 8, 15))),
                      k=int(_pick(rng, (2, 3))), op=str(_pick(rng, ("max", "avg"))),
                      dtype=str(_pick(rng, ("float32", "int8", "uint8"))))
        if params["op"] == "avg" and params["dtype"] != "float32":
            params["dtype"] = "float32"
    else:
        shape = _small(rng, 2, 1 << 14)
        params = dict(shape=shape, dtype=str(_pick(rng, ("float32", "int32", "int8", "float16"))),
                      op=str(_pick(rng, ("add", "multiply"))) if kind == "elementwise" else "sum")
    return Case(seed, index, kind, params, template)


# ------------------------------------------------------------------- workloads
def _relax_primfunc(build):
    """The one PrimFunc LegalizeOps makes of ``build(bb)`` (a function of Relax vars)."""


    bb = relax.BlockBuilder()
    params, expr = build()
    with bb.function("main", params):
        out = bb.emit(expr)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def workload(c: Case):
    """The PrimFunc of a case."""


    p = c.params
    if c.kind in ("matmul", "batch_matmul"):
        return matmul(p["m"], p["n"], p["k"], p["a"], p["b"], p["c"], trans_a=p["trans_a"],
                      trans_b=p["trans_b"], order=p["order"], init=p["init"], swap_mul=p["swap_mul"],
                      batch=p.get("batch"), symbolic=p.get("symbolic", False))

    def var(name, shape, dtype):
        return relax.Var(name, relax.TensorType(list(shape), dtype))

    if c.kind in ("conv2d", "depthwise"):
        groups = p["c"] if c.kind == "depthwise" else 1
        if p["layout"] == "NCHW":
            x = var("x", (1, p["c"], p["hw"], p["hw"]), p["a"])
            w = var("w", (p["oc"], p["c"] // groups, p["k"], p["k"]), p["b"])
            kernel_layout = "OIHW"
        else:
            x = var("x", (1, p["hw"], p["hw"], p["c"]), p["a"])
            w = var("w", (p["k"], p["k"], p["c"] // groups, p["oc"]), p["b"])
            kernel_layout = "HWIO"
        return _relax_primfunc(lambda: ([x, w], relax.op.nn.conv2d(
            x, w, strides=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=groups,
            data_layout=p["layout"], kernel_layout=kernel_layout, out_dtype=p["c_dtype"])))
    if c.kind == "pool":
        x = var("x", (1, p["c"], p["hw"], p["hw"]), p["dtype"])
        op = relax.op.nn.max_pool2d if p["op"] == "max" else relax.op.nn.avg_pool2d
        return _relax_primfunc(lambda: ([x], op(x, pool_size=p["k"], strides=p["k"])))
    x = var("x", p["shape"], p["dtype"])
    if c.kind == "elementwise":
        y = var("y", p["shape"], p["dtype"])
        return _relax_primfunc(lambda: ([x, y], getattr(relax.op, p["op"])(x, y)))
    return _relax_primfunc(lambda: ([x], relax.op.sum(x, axis=[1])))


# ----------------------------------------------------------------------- run
def categorize(reason) -> str:
    """A short class of why a block stayed, from the records (a `Mismatch` or a block's
    outcome), never from the wording of a message."""
    if isinstance(reason, BlockOutcome):
        if reason.refused:
            return "rewrite refused"
        reason = reason.mismatch
    if not isinstance(reason, Mismatch):
        return "other"
    if reason.stage is MatchStage.DTYPE:
        return "dtype"
    if reason.stage in (MatchStage.OPERATION, MatchStage.STRUCTURE):
        return "not multiply-add"
    if reason.stage is MatchStage.ITERATORS:
        return "no GEMM axis (GEMV, depthwise)" if reason.iterator else "iterators"
    if reason.stage is MatchStage.EXTENT:
        return "padding forbidden" if (reason.expected or "").startswith("a multiple") else "symbolic extent"
    return reason.stage.name.lower()


def run_case(c: Case, *, check_seed: int = 12345) -> Outcome:
    """Offload without tirbyoc's verification, then compare the result with TVM's build of
    the untouched function on inputs of our own."""

    t0 = time.perf_counter()
    try:
        func = workload(c)
    except Exception as err:  # the generator's own bug, not tirbyoc's: still a failure to fix
        return Outcome(c, "failure", "workload generator", f"{type(err).__name__}: {err}",
                       time.perf_counter() - t0)
    try:
        out = offload(func, c.template, verify=False)
    except Exception as err:
        return Outcome(c, "failure", "exception in offload",
                       f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}",
                       time.perf_counter() - t0)
    if not out.offloaded:
        kept = [b for b in out.blocks if b.reason]
        if not kept:
            return Outcome(c, "fallback", "other", "no block matched", time.perf_counter() - t0)
        main = max(kept, key=lambda b: (b.refused, b.mismatch.stage if b.mismatch else -1, len(b.reason)))
        return Outcome(c, "fallback", categorize(main), main.reason, time.perf_counter() - t0)
    try:
        check = verify(func, out.func, out_target(c.template), seed=check_seed)
    except Exception as err:
        return Outcome(c, "failure", "rewritten function does not build",
                       f"{type(err).__name__}: {err}", time.perf_counter() - t0)
    if check.passed is None:
        return Outcome(c, "fallback", "cannot run here", check.reason or "", time.perf_counter() - t0)
    if not check.passed:
        return Outcome(c, "failure", "wrong result", check.describe(), time.perf_counter() - t0)
    used = sorted({re.sub(r"\d+x\d+(x\d+)*", "*", b.intrinsic) for b in out.offloaded})
    return Outcome(c, "verified", ", ".join(used), "", time.perf_counter() - t0)


def out_target(template: str):

    return dict(get_template(template).target)


def runnable_templates() -> list[str]:
    """The templates whose code runs here: on this CPU, natively or (Hexagon) emulated."""
    return [t.name for t in templates() if t.runs_here() and device_of(dict(t.target)).on_this_cpu]


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict:
        out = {"cases": len(self.outcomes)}
        for o in self.outcomes:
            out[o.outcome] = out.get(o.outcome, 0) + 1
        return out

    def by(self, outcome: str) -> dict[str, int]:
        tally: dict[str, int] = {}
        for o in self.outcomes:
            if o.outcome == outcome:
                tally[o.category] = tally.get(o.category, 0) + 1
        return dict(sorted(tally.items(), key=lambda kv: -kv[1]))

    def table(self) -> str:

        rows = []
        for outcome in ("verified", "fallback", "failure"):
            for category, n in self.by(outcome).items():
                rows.append((outcome, category, str(n)))
        c = self.counts()
        head = (f"{c['cases']} cases: {c.get('verified', 0)} verified, {c.get('fallback', 0)} "
                f"clean fallbacks, {c.get('failure', 0)} failures")
        return head + "\n\n" + render(("outcome", "intrinsic / reason", "cases"), rows)

    def to_json(self) -> dict:
        return {"counts": self.counts(), "verified": self.by("verified"), "fallback": self.by("fallback"),
                "failure": self.by("failure"),
                "failures": [{"case": asdict(o.case), "category": o.category, "detail": o.detail[:2000]}
                             for o in self.outcomes if o.outcome == "failure"]}


def run(cases: int, seed: int = 0, templates=None, progress=None, start: int = 0) -> Summary:
    templates = list(templates or runnable_templates())
    summary = Summary()
    t0 = time.perf_counter()
    for i in range(start, start + cases):
        o = run_case(case(seed, i, templates))
        summary.outcomes.append(o)
        if progress is not None:
            progress(i - start + 1, cases, o, time.perf_counter() - t0)
    return summary


def _progress(done, total, o, elapsed):
    tty = sys.stderr.isatty()
    if tty or done == total or done % 100 == 0:
        line = f"tirbyoc fuzz: {done}/{total} cases, {elapsed:.0f} s"
        sys.stderr.write("\r" + line if tty else line + "\n")
    if o.outcome == "failure":
        sys.stderr.write(f"\n  FAILURE {o.case.describe()}: {o.category}: {o.detail.splitlines()[0][:200]}\n")
    if done == total and tty:
        sys.stderr.write("\n")
    sys.stderr.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tirbyoc.testing.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first case index (to split a run)")
    parser.add_argument("--templates", help="comma-separated (default: every template that runs here)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--save-failures", metavar="FILE",
                        help="append failing cases to this JSON file (tests replay tests/fuzz/regressions.json)")
    args = parser.parse_args(argv)
    templates = args.templates.split(",") if args.templates else None
    summary = run(args.cases, args.seed, templates, progress=_progress, start=args.start)
    print(dumps(summary.to_json()) if args.json else summary.table())
    if args.save_failures:

        path = Path(args.save_failures)
        saved = json.loads(path.read_text()) if path.exists() else []
        saved += [asdict(o.case) for o in summary.outcomes if o.outcome == "failure"]
        path.write_text(json.dumps(finite(saved), indent=1, allow_nan=False))
    return 1 if summary.counts().get("failure") else 0


if __name__ == "__main__":
    sys.exit(main())
