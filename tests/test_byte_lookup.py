"""A vector of lookups into a 256-entry byte table, lowered by tirbyoc's pipeline as two
``vpermi2b`` and a blend (`tirbyoc.rewrite.cpu.byte_lookup`) where the target has AVX-512
VBMI: the same bytes as TVM's byte-at-a-time lowering, without its extracts and inserts."""

import numpy as np
import pytest
from tvm.script import tirx as T

from tirbyoc._tvm import build, tvm
from tirbyoc.decl.host import host_cpu_features
from tirbyoc.offloading.lowering import PIPELINE

N = 1024
VBMI = {"kind": "llvm", "mcpu": "icelake-server"}  # AVX-512 VBMI


def lookups(lanes: int, index_dtype: str, table_dtype: str):
    """``out[i] = table[q[i]]`` in vectors of ``lanes``; an int8 ``q`` read by its bits as
    uint8, as `tirbyoc.relax.byte_tables` writes the lookup."""

    @T.prim_func(s_tir=True)
    def func(q: T.Buffer((N,), index_dtype), table: T.Buffer((256,), table_dtype), out: T.Buffer((N,), table_dtype)):
        T.func_attr({"global_symbol": "main"})
        for j in range(N // lanes):
            for i in T.vectorized(lanes):
                with T.sblock("lookup"):
                    vi = T.axis.spatial(N, j * lanes + i)
                    out[vi] = table[T.Cast("uint8", q[vi]) if index_dtype == "int8" else q[vi]]

    return func


def _run(exe, q, table):
    out = tvm.runtime.tensor(np.zeros(N, table.dtype))
    exe(tvm.runtime.tensor(q), tvm.runtime.tensor(table), out)
    return out.numpy()


@pytest.mark.parametrize("lanes,index_dtype,table_dtype", [(16, "uint8", "uint8"), (64, "uint8", "int8"),
                                                           (32, "int8", "uint8")])
def test_a_vector_of_byte_lookups_is_two_permutes_and_a_blend(lanes, index_dtype, table_dtype):
    func = lookups(lanes, index_dtype, table_dtype)
    asm = build(func, VBMI, PIPELINE).mod.inspect_source("asm")
    assert "vpermt2b" in asm or "vpermi2b" in asm, "no byte permute in the lookup"
    assert "vpinsrb" not in asm and "vpextrb" not in asm and "vpextrd" not in asm, "a byte at a time still"
    if "avx512vbmi" not in host_cpu_features():
        pytest.skip("this CPU has no AVX-512 VBMI: the machine code is checked above, not run")
    rng = np.random.default_rng(0)
    q = np.concatenate([np.arange(256), rng.integers(0, 256, N - 256)]).astype("uint8").view(index_dtype)
    table = rng.integers(0, 256, 256).astype("uint8").view(table_dtype)
    got = _run(build(func, VBMI, PIPELINE), q, table)
    np.testing.assert_array_equal(got, table[q.view("uint8")])
    np.testing.assert_array_equal(got, _run(build(func, VBMI, "default"), q, table))


def test_a_target_without_vbmi_keeps_tvms_lookups():
    """skylake-avx512 has AVX-512 but not VBMI: the lookup stays as TVM lowers it."""
    asm = build(lookups(16, "uint8", "uint8"), {"kind": "llvm", "mcpu": "skylake-avx512"}, PIPELINE).mod.inspect_source("asm")
    assert "vpermt2b" not in asm and "vpermi2b" not in asm
