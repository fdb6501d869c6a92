"""A matmul of two run-time operands offloaded to a CPU core keeps its own loops for calls with
few rows (`tirbyoc.offloading.few_rows`): both paths in one function, chosen by the row count
when it runs, each computing TVM's values; a weight's matmul and a static row count keep the
core alone."""

import numpy as np
import pytest
from tvm import relax, te

import tirbyoc
from tirbyoc._tvm import iter_blocks, tirx
from tirbyoc.app.running.run import FLOAT_TEMPLATES
from tirbyoc.offloading.few_rows import FEW_ROWS, FEW_ROWS_BLOCK, MANY_ROWS_BLOCK, row_count
from tirbyoc.offloading.verification import compile_func
from tirbyoc.relax.transposed_operands import matmul_in_place

from cpu_templates import run_built


def _float_core():
    for name in FLOAT_TEMPLATES:
        if name != "blas" and tirbyoc.get_template(name).runs_here():
            return tirbyoc.get_template(name)
    pytest.skip("no fp32 CPU core runs here (needs AVX2 and FMA)")


def scores(rows=None):
    """``q . k^T`` per head, the keys read where they lie (`matmul_in_place`): ``q`` of
    ``[2, s, 32]`` (``s`` run-time, or ``rows``), keys of ``[2, t, 32]``."""
    i64 = lambda n: tirx.IntImm("int64", n)  # noqa: E731 - Relax's index type, as legalized functions have
    s = i64(rows) if rows is not None else tirx.Var("s", "int64")
    q = te.placeholder([i64(2), s, i64(32)], "float32", "q")
    k = te.placeholder([i64(2), tirx.Var("t", "int64"), i64(32)], "float32", "k")
    return te.create_prim_func([q, k, matmul_in_place(q, k, None, (0, 2, 1), "float32")])


def _block_names(func) -> set:
    return {str(b.name_hint) for b in iter_blocks(func.body)}


def test_run_time_rows_keep_their_own_loops_below_few_rows_and_compute_tvms_values():
    core = _float_core()
    func = scores()
    off = tirbyoc.offload(func, core)
    assert off.verification is not None and off.verification.passed, off.verification
    assert {FEW_ROWS_BLOCK, MANY_ROWS_BLOCK} <= _block_names(off.func)
    (steps,) = [b.steps for b in off.blocks if b.offloaded]
    assert any(f"fewer than {FEW_ROWS} rows" in str(s) for s in steps)
    rng = np.random.default_rng(0)
    for s, t in ((1, 5), (FEW_ROWS - 1, 17), (FEW_ROWS, 17), (13, 40)):  # both branches
        q = rng.standard_normal((2, s, 32)).astype("float32")
        k = rng.standard_normal((2, t, 32)).astype("float32")
        out = np.zeros((2, s, t), "float32")
        want = run_built(func, core.target, [q, k, out.copy()])  # TVM's build for the same CPU
        got = run_built(off.func, core.target, [q, k, out.copy()])
        if s < FEW_ROWS:  # TVM's loops, scheduled: the same sums in the same order, bit for bit
            assert np.array_equal(got, want)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_row_count_is_the_output_rows_extent_where_known_only_at_run_time():
    assert str(row_count(scores(), "matmul")) == "s"
    assert row_count(scores(rows=8), "matmul") is None  # static rows: the core alone
    assert row_count(scores(), "no_such_block") is None


def test_static_rows_and_a_weights_matmul_keep_the_core_alone():
    core = _float_core()
    static = tirbyoc.offload(scores(rows=8), core)
    assert static.rewrites and FEW_ROWS_BLOCK not in _block_names(static.func)
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([s, 64], "float32"))
    w = np.random.default_rng(1).standard_normal((64, 48)).astype("float32")

    def build(bb):
        with bb.function("main", [x]):
            bb.emit_func_output(bb.emit(relax.op.matmul(x, relax.const(w))))

    bb = relax.BlockBuilder()
    build(bb)
    mod = tirbyoc.relax.OffloadTIR([core])(relax.transform.LegalizeOps()(bb.get()))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert "tirbyoc.template" in func.attrs and FEW_ROWS_BLOCK not in _block_names(func)
    compile_func(func, core.target, "weights")  # and it builds
