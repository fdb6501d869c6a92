"""The fp32 fused multiply-add templates (x86_fp32_avx512: zmm, x86_fp32_avx2: ymm):
convolutions read in place and matmuls offloaded as register-blocked micro-kernels, verified
against TVM's build, their bias and activation fused into the write-back."""

from dataclasses import replace

import numpy as np
import pytest
from tvm import relax
from cpu_templates import assert_intrinsics_check, runnable

import tirbyoc
from tirbyoc.relax.bridge import fuse
from tirbyoc.rewrite.foundation.steps import StepKind
from tirbyoc.testing.workloads import conv2d, matmul

TEMPLATES = ["x86_fp32_avx512", "x86_fp32_avx2"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_self_check(name):
    assert_intrinsics_check(name)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("workload", ["matmul", "conv_nhwc", "conv_nchw_strided"])
def test_offloaded_whole_and_verified(name, workload):
    """Every MAC on the core, register-blocked, and the result TVM's within float32 rounding."""
    runnable(name)
    func = {"matmul": lambda: matmul(48, 40, 36),
            "conv_nhwc": lambda: conv2d(1, 8, 9, 9, 32, 3, 3, layout="NHWC"),
            "conv_nchw_strided": lambda: conv2d(1, 8, 9, 9, 16, 3, 3, stride=2)}[workload]()
    out = tirbyoc.offload(func, name)
    assert out.coverage == 1.0 and out.verification.passed, [b.reason for b in out.blocks]
    (core,) = out.offloaded
    assert any(s.kind is StepKind.SCHEDULE and "register-blocked" in s for s in core.steps)


def one_layer(shape, layer, seed: int):
    """The one PrimFunc of a one-layer Relax model - ``layer(x, const) -> output``, where
    ``const(shape)`` is a random float32 constant - legalized and fused as a model's layer."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(layer(x, lambda s: relax.const(rng.standard_normal(s).astype("float32")), bb))
        bb.emit_func_output(out)
    mod = fuse(relax.transform.LegalizeOps()(bb.get()))
    (func,) = [f for f in mod.functions.values() if not isinstance(f, relax.Function)]
    return func.with_attr("global_symbol", "main")


def biased_relu_conv():
    """conv2d NHWC + bias + ReLU, legalized and fused as a float model's layer."""
    op = relax.op

    def layer(x, const, bb):
        y = bb.emit(op.nn.conv2d(x, const((32, 3, 3, 16)), data_layout="NHWC", kernel_layout="OHWI"))
        return op.nn.relu(bb.emit(op.add(y, const(32))))

    return one_layer([1, 10, 10, 16], layer, seed=0)


@pytest.mark.parametrize("name", TEMPLATES)
def test_bias_and_relu_run_in_the_write_back(name):
    runnable(name)
    out = tirbyoc.offload(biased_relu_conv(), name)
    (core,) = out.offloaded
    assert [s for s in core.steps if s.kind is StepKind.EPILOGUE], core.steps
    assert out.verification.passed


def gelu_matmul():
    """matmul + bias + GELU (erf), legalized and fused as BERT's FFN1: the bias-added value is
    read on two paths (x * 0.5 and erf(x / sqrt 2)) that join in the last multiply."""
    op = relax.op

    def layer(x, const, bb):
        y = bb.emit(op.matmul(x, const((64, 96))))
        return op.nn.gelu(bb.emit(op.add(y, const(96))))

    return one_layer([32, 64], layer, seed=1)


@pytest.mark.parametrize("name", TEMPLATES)
def test_gelu_joins_the_write_back_with_a_vector_erf(name):
    """The GELU's two paths are joined into one block and fused into the write-back, its erf
    as vector arithmetic instead of libm's scalar erff; verified against TVM's build (libm)."""
    runnable(name)
    out = tirbyoc.offload(gelu_matmul(), name)
    assert out.coverage == 1.0 and out.verification.passed
    (core,) = out.offloaded
    assert [s for s in core.steps if s.kind is StepKind.VECTOR_MATH], core.steps
    assert [s for s in core.steps if s.kind is StepKind.EPILOGUE] and \
        not [s for s in core.steps if s.kind is StepKind.EPILOGUE_LEFT], core.steps


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_staged_weight_is_laid_out_tile_by_tile(name):
    """A [N, K] weight is staged for the core (N innermost, as an OHWI convolution weight is);
    with more weight than input, the staged copy runs panel by panel, [N/width, K, width], so
    that a tile's reduction steps are one contiguous run (256 fp32 channels put 1 KB between
    them, and cache sets conflict)."""
    runnable(name)
    out = tirbyoc.offload(matmul(16, 256, 128, trans_b=True), name)
    assert out.coverage == 1.0 and out.verification.passed
    (core,) = out.offloaded
    (note,) = [s for s in core.steps if s.kind is StepKind.SCHEDULE]
    assert "output-channel tiles outermost" in note and "laid out panel by panel" in note


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_constant_weight_read_in_place_is_staged_only_when_layout_free(name):
    """A matmul's [K, N] weight read in place (ONNX's MatMul) steps N elements per reduction
    step; when every caller passes it as a constant (TVM's ``layout_free_buffers``, which the
    Relax bridge sets) the schedule stages it panel by panel, a copy prepacking runs once. A
    weight that may change per call stays in place: copying it each call costs a pass over it."""
    from tirbyoc.relax.prepack import weight_copies

    runnable(name)
    func = matmul(16, 256, 128)
    kept = tirbyoc.offload(func, name)
    staged = tirbyoc.offload(func.with_attr("layout_free_buffers", [1]), name)
    for out in (kept, staged):
        assert out.coverage == 1.0 and out.verification.passed
    notes = [str(s) for out in (kept, staged) for s in out.offloaded[0].steps if s.kind is StepKind.SCHEDULE]
    assert "laid out tile by tile" not in notes[0] and "laid out panel by panel" in notes[1], notes
    assert not weight_copies(kept.func, {1}) and len(weight_copies(staged.func, {1})) == 1


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_staged_weight_follows_the_reduction_loops(name):
    """The reduction of this conv runs C, kh, kw (outer to inner): its HWIO weight is staged
    [N/width, C, kh, kw, width], each step the register block's nr tiles of lanes side by side
    (width = nr x lanes; the zmm core, which prefetches tile by tile, width = lanes), the next
    contiguous run."""
    import re

    from tirbyoc._tvm import root_block

    runnable(name)
    lanes = 16 if name.endswith("512") else 8
    func = conv2d(1, 32, 8, 8, 32, 3, 3, layout="NHWC").with_attr("layout_free_buffers", [1])
    out = tirbyoc.offload(func, replace(tirbyoc.get_template(name), winograd=0))  # the direct sum's staging
    assert out.coverage == 1.0 and out.verification.passed
    (note,) = [str(s) for s in out.offloaded[0].steps if s.kind is StepKind.SCHEDULE]
    nr = int(re.search(r"register-blocked \d+x(\d+)", note).group(1))
    # a zmm tile is a whole cache line a step: that core prefetches tile by tile, no panels
    width = lanes if lanes == 16 else lanes * nr
    shapes = [tuple(int(d) for d in b.shape) for b in root_block(out.func).alloc_buffers if len(b.shape) == 5]
    assert (lanes == 16 or width > lanes) and shapes == [(32 // width, 32, 3, 3, width)], (shapes, note)


def test_register_blocks_past_one_kib_stay_in_registers():
    """A 24-accumulator block (1.5 KB of zmm) is kept on the stack, so in registers: TVM moves
    a buffer of 1 KiB or more to the heap (TVMBackendAllocWorkspace) unless told not to."""
    from tirbyoc.offloading.verification import compile_func

    target = {"kind": "llvm", "mcpu": "skylake-avx512"}
    out = tirbyoc.offload(matmul(64, 96, 64), "x86_fp32_avx512", target=target, verify=False)
    (note,) = [s for s in out.offloaded[0].steps if s.kind is StepKind.SCHEDULE]
    assert "(1536 B)" in note, note
    source = compile_func(out.func, target, "offloaded").mod.inspect_source("ll")
    assert "TVMBackendAllocWorkspace" not in source
