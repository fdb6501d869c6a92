"""Helpers the CPU templates' tests share: skip where a template cannot run, self-check its
intrinsics, build and run a function."""

import pytest
import tvm

import tirbyoc
from tirbyoc.offloading.selfcheck import self_check
from tirbyoc.offloading.verification import compile_func


def runnable(name):
    """The template ``name``, or a skip saying why this CPU cannot run it."""
    t = tirbyoc.get_template(name)
    if not t.runs_here():
        pytest.skip(f"{name}: {t.unavailable_reason()}")
    return t


def assert_intrinsics_check(name):
    """Every intrinsic of ``name`` tensorizes its own description and computes it."""
    t = runnable(name)
    for intrin in t.intrinsics():
        result = self_check(intrin, dict(t.target))
        assert result.passed, result.detail


def run_built(func, target, arrays):
    """``func`` built for ``target`` and run on ``arrays`` (its parameters, the output last):
    the output it wrote."""
    exe = compile_func(func, target, "test")
    args = [tvm.runtime.tensor(a) for a in arrays]
    exe.mod["main"](*args)
    return args[-1].numpy()
