"""Columns known only at run time (an attention's q . k^T over a run-time seq): the
write-back stores whole vectors where every lane is real, and its staging copies keep no
division by a run-time size on every element."""

import numpy as np
import pytest

import tirbyoc
from tirbyoc._tvm import tirx, tvm_ffi
from tirbyoc.testing.workloads import parse

# q . k^T of one head, scaled: seq x seq scores over a reduction of 32, seq known at run time
SCORES = """
@T.prim_func(s_tir=True)
def main(q: T.handle, k: T.handle, s: T.handle):
    seq = T.int32()
    Q = T.match_buffer(q, (seq, 32), "float32")
    K = T.match_buffer(k, (seq, 32), "float32")
    S = T.match_buffer(s, (seq, seq), "float32")
    acc = T.sblock_alloc_buffer((seq, seq), "float32")
    for i, j, r in T.grid(seq, seq, 32):
        with T.sblock("qk"):
            vi, vj, vr = T.axis.remap("SSR", [i, j, r])
            with T.init():
                acc[vi, vj] = T.float32(0)
            acc[vi, vj] = acc[vi, vj] + Q[vi, vr] * K[vj, vr]
    for i, j in T.grid(seq, seq):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            S[vi, vj] = acc[vi, vj] * T.float32(0.125)
"""


@pytest.fixture(scope="module")
def scores():
    out = tirbyoc.offload(parse(SCORES), "x86_fp32_avx2")
    assert out.offloaded and out.verification.passed, out.table()
    return out


def _binds(func, name):
    from tirbyoc.rewrite.cpu.vector_tails import split_predicated_vectors

    found = []
    tvm_ffi.structural_walk(split_predicated_vectors(func).body, (tirx.Bind, found.append), order="pre")
    return [b for b in found if b.var.name == name]


def test_a_write_back_padded_at_run_time_gets_a_whole_vector_version(scores):
    """The write-back is predicated on the real columns (seq padded to the tile's lanes): the
    pass gives its vector loop a version without the predicate, taken where every lane is real."""
    assert "epilogue fused into the write-back" in " ".join(scores.rewrites[0].steps)
    assert _binds(scores.func, "all_lanes_real"), scores.func.script()


def test_a_predicate_not_linear_in_the_lane_is_left_alone():
    from tirbyoc.rewrite.cpu.vector_tails import split_predicated_vectors

    func = parse("""
@T.prim_func(s_tir=True)
def main(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in T.vectorized(64):
        with T.sblock("copy"):
            vi = T.axis.spatial(64, i)
            T.where(i * i < 50)
            b[vi] = a[vi]
""")
    assert split_predicated_vectors(func).same_as(func)


@pytest.mark.parametrize("seq", [1, 7, 8, 9, 16, 17, 23, 40])
def test_every_column_count_stores_the_real_columns_only(scores, seq):
    """Both versions run (whole vectors inside, the predicated one at the edge) and agree with
    numpy, the output's padding never written over: built through tirbyoc's pipeline."""
    import tvm

    from tirbyoc._tvm import make_target

    lib = tvm.compile(tvm.IRModule({"main": scores.func}), target=make_target({"kind": "llvm"}),
                      tir_pipeline=tirbyoc.PIPELINE)
    rng = np.random.default_rng(seq)
    q, k = (rng.standard_normal((seq, 32)).astype("float32") for _ in range(2))
    s = tvm.runtime.tensor(np.full((seq, seq), np.nan, "float32"))
    lib["main"](tvm.runtime.tensor(q), tvm.runtime.tensor(k), s)
    np.testing.assert_allclose(s.numpy(), (q @ k.T) * 0.125, rtol=1e-5, atol=1e-5)
