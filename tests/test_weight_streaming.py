"""CPU cores whose weights outweigh their input: output-channel tiles outermost, the next
tiles' weights prefetched (`tirbyoc.rewrite.cpu.prefetch`)."""

import pytest
from vnni import NAME
from workloads import conv2d, matmul

import tirbyoc
from tirbyoc._tvm import tvm
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.rewrite.foundation.steps import StepKind


def _offloaded(func):
    out = tirbyoc.offload(func, NAME)
    assert out.verification.passed and out.verification.max_abs_err == 0
    (core,) = out.offloaded
    (note,) = [s for s in core.steps if s.kind is StepKind.SCHEDULE]
    return out, note


def _llvm_ir(func) -> str:
    target = tvm.target.Target(dict(tirbyoc.get_template(NAME).target))
    return tvm.compile(func, target=target, tir_pipeline=PIPELINE).mod.inspect_source("ll")


def test_a_layer_with_more_weight_than_input_streams_each_weight_once_and_prefetches_the_next():
    """ResNet's last layers in small: 7x7 output rows, 3x3 x 64 -> 128 weights (72 KB) against
    a 2.5 KB input. The prefetch is one cache line per tile and step, issued by the first row
    of each register block only."""
    func = conv2d(1, 64, 9, 9, 128, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32")
    out, note = _offloaded(func)
    assert "output-channel tiles outermost" in note and "prefetched" in note
    ir = _llvm_ir(out.func)
    assert "call void @llvm.prefetch" in ir


def test_the_next_tiles_are_prefetched_once_each_spread_over_the_row_blocks():
    """The seven output rows that share a weight tile prefetch the next tiles in turn: row r
    the reduction steps r, r + 7, ... - every step once, by the first row of the register
    block (ResNet-18's fp32 res5 3x3 layer, its 9.4 MB of weights streamed from memory: 1.03 ->
    0.83 ms a call on Zen 5, one thread)."""
    import tvm_ffi

    from tirbyoc._tvm import REDUCE, expr_dtype, s_tir, sym, tirx
    from tirbyoc.rewrite.cpu.prefetch import insert_weight_prefetches

    out, _ = _offloaded(conv2d(1, 64, 9, 9, 128, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32"))
    blocks = []
    tvm_ffi.structural_walk(insert_weight_prefetches(out.func), (s_tir.SBlock, blocks.append), order="pre")
    guarded = [b for b in blocks if isinstance(b.body, tirx.SeqStmt) and isinstance(b.body[-1], tirx.IfThenElse)]
    assert guarded
    block = guarded[0]
    cond = block.body[-1].condition
    spatial = [iv for iv in block.iter_vars if int(iv.iter_type) != REDUCE]
    steps = [iv for iv in block.iter_vars if int(iv.iter_type) == REDUCE]
    (oh,) = [iv for iv in spatial if int(iv.dom.extent) == 7 and iv.var.name.startswith("v0")]
    fetched = {}
    for row in range(7):
        for index in range(9 * 16):  # 3 x 3 taps x 16 steps of 4 channels
            values = {oh.var: row}
            rest = index
            for iv in reversed(steps):
                values[iv.var] = rest % int(iv.dom.extent)
                rest //= int(iv.dom.extent)
            values |= {iv.var: 0 for iv in spatial if iv.var not in values}  # the block's first row
            analyzer = sym.Analyzer()
            for var, value in values.items():
                analyzer.bind(var, tirx.const(value, expr_dtype(var)))
            if int(analyzer.simplify(cond)):
                fetched.setdefault(index, []).append(row)
    assert sorted(fetched) == list(range(9 * 16)) and all(rows == [i % 7] for i, rows in fetched.items())


def test_a_layer_with_more_input_than_weight_keeps_rows_outermost_without_prefetches():
    """A 64x64 matmul of 256 rows: the rows are the large operand, as before."""
    out, note = _offloaded(matmul(256, 64, 64, "uint8", "int8", "int32"))
    assert "outermost" not in note
    assert "llvm.prefetch" not in _llvm_ir(out.func)


def test_a_core_whose_weight_tile_is_smaller_than_a_line_keeps_the_order_without_prefetches():
    """x86_avx2's tile is 16 bytes: a prefetch per step would fetch each line four times."""
    avx2 = tirbyoc.get_template("x86_avx2")
    if not avx2.runs_here():
        pytest.skip(avx2.unavailable_reason())
    func = conv2d(1, 64, 9, 9, 128, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32")
    out = tirbyoc.offload(func, "x86_avx2")
    assert out.verification.passed and out.verification.max_abs_err == 0
    (core,) = out.offloaded
    (note,) = [s for s in core.steps if s.kind is StepKind.SCHEDULE]
    assert "output-channel tiles outermost" in note and "prefetched" not in note
    target = tvm.target.Target(dict(avx2.target))
    assert "llvm.prefetch" not in tvm.compile(out.func, target=target, tir_pipeline=PIPELINE).mod.inspect_source("ll")
