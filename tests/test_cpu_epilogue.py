"""Epilogues fused into a CPU core's register-block write-back (x86_vnni, or its emulation)."""

import numpy as np
from tvm import relax
from tvm.script import tirx as T
from vnni import NAME, VNNI

import tirbyoc
from tirbyoc._tvm import iter_blocks, tirx, tvm, tvm_ffi, vector_bytes
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.relax.bridge import fuse
from tirbyoc.rewrite.cpu.register_blocks import WRITEBACK_ATTR
from tirbyoc.rewrite.foundation.steps import StepKind


def requantized_matmul(m=48, k=64, n=32):
    """A fused PrimFunc as LegalizeOps + FuseOps make one of a QDQ layer: a u8 x i8 matmul,
    then ``round((acc * scale + bias) / s_y) + z_y`` clipped and cast to uint8."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([m, k], "uint8"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = bb.emit(op.matmul(x, relax.const(rng.integers(-128, 128, (k, n)).astype("int8")), out_dtype="int32"))
            real = bb.emit(op.multiply(op.astype(acc, "float32"), relax.const(rng.uniform(1e-4, 1e-3, n).astype("float32"))))
            real = bb.emit(op.add(real, relax.const(rng.uniform(-2, 2, n).astype("float32"))))
            q = bb.emit(op.add(op.round(op.divide(real, relax.const(0.03, "float32"))), relax.const(100.0, "float32")))
            q = bb.emit(op.astype(op.maximum(op.minimum(q, relax.const(255.0)), relax.const(0.0)), "uint8"))
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    mod = fuse(relax.transform.LegalizeOps()(bb.get()))
    (func,) = [f for f in mod.functions.values() if not isinstance(f, relax.Function)]
    return func.with_attr("global_symbol", "main")


def test_the_requantization_runs_in_the_write_back_and_stores_uint8():
    """The bias, requantization and narrowing cast become the register block's write-back:
    no int32 tensor goes to memory, the step says what was fused, and the result is TVM's
    bit for bit (tolerance 0 for an integer output)."""
    func = requantized_matmul()
    out = tirbyoc.offload(func, NAME)
    (core,) = out.offloaded
    fused = [s for s in core.steps if s.kind is StepKind.EPILOGUE]
    assert fused and "stores uint8" in fused[0] and not any(s.kind is StepKind.EPILOGUE_LEFT for s in core.steps)
    assert out.verification.passed and out.verification.max_abs_err == 0
    writebacks = [b for b in iter_blocks(out.func.body) if WRITEBACK_ATTR in b.annotations]
    assert len(writebacks) == 1 and str(writebacks[0].writes[0].source.dtype) == "uint8"
    big_int32 = [b for blk in iter_blocks(out.func.body) for b in blk.alloc_buffers
                 if str(b.dtype) == "int32" and np.prod([int(d) for d in b.shape]) >= 48 * 32]
    assert len(big_int32) <= 1  # the accumulator the schedule keeps per register block only


def test_the_fused_products_are_rounded_before_they_are_added():
    """``acc * scale + bias`` inlined into one expression would be one fused multiply-add
    (TVM builds with FP-op fusion on), rounding once where TVM's build of the separate blocks
    rounds twice: tirbyoc's pipeline puts each product behind an arithmetic fence, in vectors."""
    out = tirbyoc.offload(requantized_matmul(), NAME)
    exe = tvm.compile(out.func, target=tvm.target.Target(dict(tirbyoc.get_template(NAME).target)), tir_pipeline=PIPELINE)
    llvm_ir = exe.mod.inspect_source("ll")
    assert "@llvm.arithmetic.fence.v" in llvm_ir  # vector lanes: the write-back stays vectorized
    assert "fmuladd" not in llvm_ir
    # the only fused multiply-adds are round(x / s_y)'s, computed without a division to the
    # same bits (tirbyoc.rewrite.cpu.exact_division): two per quotient, none elsewhere
    assert "fdiv" not in llvm_ir and "@llvm.fma.v" in llvm_ir


@T.prim_func(s_tir=True)
def matmul_then_row_sums(A: T.Buffer((32, 64), "uint8"), B: T.Buffer((32, 64), "int8"), O: T.Buffer((32,), "int32")):
    C = T.sblock_alloc_buffer((32, 32), "int32")
    D = T.sblock_alloc_buffer((32, 32), "int32")
    for i, j, k in T.grid(32, 32, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = 0
            C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vj, vk])
    for i, j in T.grid(32, 32):
        with T.sblock("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] + 7
    for i, j in T.grid(32, 32):
        with T.sblock("O"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                O[vi] = 0
            O[vi] = O[vi] + D[vi, vj]


def test_a_chain_stops_at_a_reduction_and_says_so():
    out = tirbyoc.offload(matmul_then_row_sums, NAME)
    core = next(b for b in out.offloaded if b.block == "C")
    assert any(s.kind is StepKind.EPILOGUE and "D" in s for s in core.steps)
    (left,) = [s for s in core.steps if s.kind is StepKind.EPILOGUE_LEFT]
    assert "O reduces" in left
    assert out.verification.passed


def vector_extents(func) -> set:
    loops = []
    tvm_ffi.structural_walk(func.body, (tirx.For, loops.append), order="pre")
    return {int(l.extent) for l in loops if l.kind == tirx.ForKind.VECTORIZED}


def test_an_output_padded_to_the_cores_lanes_has_its_epilogue_fused_on_the_valid_lanes():
    """24 output channels: the core computes a tile of 32 and a crop keeps 24. The crop is
    inlined into the write-back (its padded lanes guarded by a predicate) and the chain after
    it follows: nothing is left to TVM, and the values are TVM's bit for bit."""
    out = tirbyoc.offload(requantized_matmul(m=40, k=64, n=24), NAME)
    (core,) = out.offloaded
    assert any(s.kind is StepKind.EPILOGUE for s in core.steps), core.steps
    assert not any(s.kind is StepKind.EPILOGUE_LEFT for s in core.steps), core.steps
    assert out.verification.passed and out.verification.max_abs_err == 0
    # in vectors that divide 24 (8 of a zmm's 16 lanes; an SSE register's 4 on the emulated
    # template's generic target): a predicate that varies across one vector's lanes would make
    # TVM's vectorizer fall back to scalars
    lanes = max(d for d in (4, 8, 16) if d <= vector_bytes(VNNI.target) // 4 and 24 % d == 0)
    vectors = vector_extents(out.func)
    assert lanes in vectors and 32 not in vectors, vectors


def test_the_write_back_runs_in_vectors_of_one_register():
    """A register block 3 tiles wide (48 output channels): its write-back in 16-lane vectors
    (one zmm of 32-bit values), not one 48-lane vector that LLVM assembles element by element."""
    out = tirbyoc.offload(requantized_matmul(m=32, k=64, n=48), NAME)
    assert out.verification.passed and out.verification.max_abs_err == 0
    vectors = vector_extents(out.func)
    assert vectors and max(vectors) <= 16, vectors
