"""`tirbyoc.relax.fast_math`: float32 transcendental functions as TVM's vectorizable
approximations, within the bounds the report and ``--help`` state, in both builds of a run."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc._tvm import PrimCall, relax_vm, tirx
from tirbyoc.relax.fast_math import ERF_ABS, EXP_REL, TANH_ABS, FastMath, FastMathReport, fast_math_of

N = 4001
X = np.linspace(-20.0, 20.0, N).astype("float32")


@I.ir_module
class Activations:
    @R.function
    def main(x: R.Tensor((4001,), "float32"), s: R.Tensor((4, 8), "float32"), h: R.Tensor((8,), "float16")):
        with R.dataflow():
            a = R.erf(x)
            b = R.tanh(x)
            c = R.exp(R.clip(x, -80.0, 80.0))
            d = R.sigmoid(x)
            e = R.nn.silu(x)
            f = R.nn.gelu(x)
            g = R.nn.gelu_tanh(x)
            p = R.nn.softmax(s, axis=-1)
            k = R.erf(h)  # float16: TVM's approximation is float32's, so it stays exact
            out = (a, b, c, d, e, f, g, p, k)
            R.output(out)
        return out


def _run(mod, *args):
    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm")
    vm = relax_vm(exe, tvm.cpu())
    return [o.numpy() for o in vm["main"](*[tvm.runtime.tensor(a) for a in args])]


def _exact(x):
    x = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    sig = 1 / (1 + np.exp(-x))
    return [erf(x), np.tanh(x), np.exp(np.clip(x, -80, 80)), sig, x * sig, 0.5 * x * (1 + erf(x / math.sqrt(2))),
            0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))]


def _transcendental_calls(mod) -> set:
    """Names of the scalar libm-style calls (exp, erf, tanh) left in the module's PrimFuncs."""
    found = set()

    def visit(call):
        name = str(getattr(call.op, "name", ""))
        if name in ("tirx.exp", "tirx.erf", "tirx.tanh"):
            found.add(name.split(".")[1])

    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, (PrimCall, visit), order="pre")
    return found


def test_every_approximated_op_stays_within_the_stated_bounds():
    rng = np.random.default_rng(0)
    s = rng.normal(0, 4, (4, 8)).astype("float32")
    h = rng.normal(0, 1, 8).astype("float16")
    fast, report = fast_math_of(Activations)
    assert dict(report.replaced) == {"erf": 1, "tanh": 1, "exp": 1, "sigmoid": 1, "silu": 1, "gelu": 1,
                                     "gelu_tanh": 1, "softmax": 1}
    assert dict(report.kept) == {"erf": 1}
    got = _run(fast, X, s, h)
    ref = _exact(X)
    abs_bounds = {0: ERF_ABS, 1: TANH_ABS}
    for i, (g, r) in enumerate(zip(got[:7], ref)):
        err = np.abs(g.astype(np.float64) - r)
        if i in abs_bounds:
            assert err.max() <= abs_bounds[i], (i, err.max())
        else:  # exp and what is built on it: relative to the value (x times it for SiLU, GELU)
            assert (err <= EXP_REL * np.abs(r) + 4 * ERF_ABS * np.maximum(1, np.abs(X))).all(), i
    sm = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got[7], sm / sm.sum(-1, keepdims=True), rtol=4 * EXP_REL, atol=1e-7)
    np.testing.assert_array_equal(got[8], _run(Activations, X, s, h)[8])  # float16 kept exact


def test_approximations_leave_no_scalar_libm_calls():
    exact = relax.transform.LegalizeOps()(Activations)
    fast = relax.transform.LegalizeOps()(fast_math_of(Activations)[0])
    assert _transcendental_calls(exact) >= {"exp", "erf", "tanh"}
    assert _transcendental_calls(fast) == {"erf"}  # the float16 erf only


def test_the_approximations_differ_from_the_exact_functions():
    """Not TVM's exact lowering under another name: some values change."""
    s = np.zeros((4, 8), "float32")
    h = np.zeros(8, "float16")
    fast, exact = _run(fast_math_of(Activations)[0], X, s, h), _run(Activations, X, s, h)
    assert not np.array_equal(fast[0], exact[0])  # erf
    assert not np.array_equal(fast[2], exact[2])  # exp


def test_a_model_without_such_ops_comes_back_unchanged_and_says_so():
    @I.ir_module
    class Plain:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                y = R.nn.relu(R.add(x, x))
                R.output(y)
            return y

    new, report = fast_math_of(Plain)
    assert new is Plain
    assert not report.replaced
    assert "no erf, tanh, exp, softmax" in report.describe()


def test_pass_form_fills_the_report():
    report = FastMathReport()
    FastMath(report)(Activations)
    assert report.replaced["gelu"] == 1 and report.kept["erf"] == 1
    assert report.to_json()["bounds"] == {"erf_abs": ERF_ABS, "tanh_abs": TANH_ABS, "exp_rel": EXP_REL}


def test_run_with_fast_math_is_verified_against_a_tvm_build_that_approximates_alike(tmp_path):
    """A small BERT (GELU with Erf, softmax) through `tirbyoc run --fast-math`: the offload is
    exact against TVM's build of the same approximated model, and the output still agrees
    with ONNX Runtime's."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tirbyoc.testing.qdq import float_bert_base

    path = float_bert_base(tmp_path / "bert.onnx", seq=16, dim=64, heads=2, hidden=128, layers=2)
    cmd = [sys.executable, "-m", "tirbyoc", "run", "-m", str(path), "-t", "blas", "--fast-math", "--repeat", "1",
           "--reference", "onnxruntime", "--json", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["verified"] is True
    assert result["max_abs_err"] <= result["comparison"]["tolerance"]
    assert result["fast_math"]["replaced"] == {"erf": 2, "softmax": 2}
    assert result["reference"]["agree"] is True
