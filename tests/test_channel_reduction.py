"""Channel-wise reductions (depthwise convolutions, NHWC pooling) in channel vectors, with
register blocks of output columns, the weight copied channel-last (once, at compile time, for
a constant) and an integer accumulator's epilogue fused: the same values as TVM's build."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from tirbyoc._tvm import make_target, relax_vm, s_tir, tirx
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.relax.bridge import fuse
from tirbyoc.relax.rest import schedule_rest_of
from tirbyoc.rewrite.cpu.register_blocks import WRITEBACK_ATTR
from tirbyoc.rewrite.rest_schedule.nests import schedule_rest

TARGET = make_target({"kind": "llvm"})
AVX2, AVX512 = 32, 64  # bytes per vector


def fused_module(build, inputs):
    """``build(*vars)`` on inputs of (shape, dtype), legalized and fused as a model is."""
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(shape, dtype)) for i, (shape, dtype) in enumerate(inputs)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(build(*xs))
        bb.emit_func_output(out)
    return fuse(relax.transform.LegalizeOps()(bb.get()))


def prim_func(mod):
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1, [str(g) for g in mod.functions]
    return funcs[0]


def depthwise(x, w, channels, *, out_dtype="int32"):
    return relax.op.nn.conv2d(x, w, padding=(1, 1), groups=channels, data_layout="NHWC",
                              kernel_layout="OHWI", out_dtype=out_dtype)


def requantized(acc, scale=0.0123):
    y = relax.op.round(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale, "float32")))
    return relax.op.astype(relax.op.clip(relax.op.add(y, relax.const(3.0, "float32")), 0, 255), "uint8")


def run(func, arrays):
    exe = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET,
                      tir_pipeline=PIPELINE)
    out = tvm.runtime.empty([int(d) for d in func.params[-1].shape], str(func.params[-1].dtype))
    exe(*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


def int8_data(shape_x, shape_w, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape_x).astype("uint8"), rng.integers(-128, 128, shape_w).astype("int8")]


def loop_kinds(func):
    found = []
    tvm_ffi.structural_walk(func, (tirx.For, found.append), order="pre")
    return {(int(l.kind), int(l.extent)) for l in found}


PARALLEL, VECTORIZED = 1, 2


def test_an_int8_depthwise_conv_runs_in_channel_vectors_with_its_requantization_fused():
    x, w = ((1, 14, 14, 64), "uint8"), ((64, 3, 3, 1), "int8")
    func = prim_func(fused_module(lambda a, b: requantized(depthwise(a, b, 64)), [x, w]))
    new, nests = schedule_rest(func, AVX512)
    # the pad read through bounds checks; the requantization's steps, inlined into one, then fused
    assert [n.block for n in nests if not n.inlined] == ["group_conv2d_nhwc"] and "pad_temp" not in new.script()
    nest = nests[0]
    assert (nest.lanes, nest.packed) == (16, (str(func.params[1].name),))
    assert "7x16 accumulator blocks" in nest.note and "epilogue fused into the write-back" in nest.note
    assert (VECTORIZED, 16) in loop_kinds(new) and any(k == PARALLEL for k, _ in loop_kinds(new))
    data = int8_data(x[0], w[0])
    assert np.array_equal(run(new, data), run(func, data))


def test_the_register_block_fits_an_avx2_cpus_registers_and_extremes_stay_exact():
    x, w = ((1, 12, 12, 32), "uint8"), ((32, 3, 3, 1), "int8")
    func = prim_func(fused_module(lambda a, b: requantized(depthwise(a, b, 32), 0.0003), [x, w]))
    new, nests = schedule_rest(func, AVX2, registers=16)
    assert nests[0].lanes == 8 and "4x8 accumulator blocks" in nests[0].note, nests
    extremes = [np.full(x[0], 255, "uint8"), np.full(w[0], -128, "int8")]
    for data in (extremes, int8_data(x[0], w[0], seed=1)):
        assert np.array_equal(run(new, data), run(func, data))


def test_a_float_depthwise_conv_keeps_every_bit_and_its_products_unfenced():
    x, w = ((1, 10, 10, 48), "float32"), ((48, 3, 3, 1), "float32")
    func = prim_func(fused_module(lambda a, b: relax.op.nn.relu(depthwise(a, b, 48, out_dtype="float32")), [x, w]))
    new, nests = schedule_rest(func, AVX512)
    channel = [n for n in nests if n.note]
    assert len(channel) == 1 and "epilogue" not in channel[0].note  # float: the chain is scheduled on its own
    assert WRITEBACK_ATTR not in str(new)
    rng = np.random.default_rng(2)
    data = [rng.standard_normal(x[0]).astype("float32"), rng.standard_normal(w[0]).astype("float32")]
    assert np.array_equal(run(new, data), run(func, data))


def test_an_nhwc_max_pool_is_a_channel_reduction_that_reads_its_pad_through_bounds_checks():
    """The pool's pad (the input and a border of its lowest value) is inlined: one nest, each
    window load checking its bounds, no pass over the whole input first; every value TVM's,
    the borders included (all-negative inputs, the int8 minimum itself)."""
    for dtype, lanes in (("float32", 16), ("int8", 64)):
        x = ((1, 15, 15, 32 if dtype == "float32" else 64), dtype)
        func = prim_func(fused_module(lambda a: relax.op.nn.max_pool2d(a, (3, 3), (2, 2), (1, 1), layout="NHWC"),
                                      [x]))
        new, nests = schedule_rest(func, AVX512)
        pooled = [n for n in nests if n.note]
        assert len(pooled) == 1 and pooled[0].lanes == lanes and pooled[0].packed == ()
        sch = s_tir.Schedule(new)
        names = [str(sch.get(b).name_hint) for b in sch.get_child_blocks(sch.get_sblock("root"))]
        assert names and all(n.startswith("pool_max") for n in names), names  # no pad block left
        assert "if_then_else" in new.script()
        rng = np.random.default_rng(3)
        data = (-np.abs(rng.standard_normal(x[0])).astype(dtype) if dtype == "float32" else
                rng.integers(-128, -100, x[0]).astype(dtype))
        assert np.array_equal(run(new, [data]), run(func, [data])), dtype


def test_an_nchw_depthwise_conv_is_not_a_channel_reduction():
    x, w = ((1, 32, 10, 10), "float32"), ((32, 1, 3, 3), "float32")
    func = prim_func(fused_module(lambda a, b: relax.op.nn.conv2d(a, b, padding=(1, 1), groups=32), [x, w]))
    _, nests = schedule_rest(func, AVX512)
    assert nests and not any(n.note for n in nests)  # the channel is not the output's last index


def test_a_constant_depthwise_weight_is_laid_out_channel_last_once_at_compile_time():
    shape_x = (1, 14, 14, 32)
    weight = np.random.default_rng(4).integers(-128, 128, (32, 3, 3, 1)).astype("int8")
    mod = fused_module(lambda a: requantized(depthwise(a, relax.const(weight), 32)), [(shape_x, "uint8")])
    new, report = schedule_rest_of(mod, TARGET)
    assert report.channel_reductions == 1 and report.packed.tensors == 1
    assert "channel-wise reduction" in report.summary() and report.to_json()["packed_weights"] == 1
    (name,) = report.packed.functions
    assert tuple(int(d) for d in new[name].params[1].shape) == (3, 3, 1, 32)  # the packed weight
    x = np.random.default_rng(5).integers(0, 256, shape_x).astype("uint8")

    def out(m):
        vm = relax_vm(tvm.compile(m, target=TARGET, tir_pipeline=PIPELINE), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    assert np.array_equal(out(new), out(mod))


def test_a_layer_norm_is_a_row_reduction_not_a_channel_wise_one():
    """Its variance reads the row's mean at the row index (contiguous across rows) and the
    input across the row: no channel-wise reduction, and no copy of the input per call."""
    x = ((1, 16, 64), "float32")
    func = prim_func(fused_module(lambda a: relax.op.nn.layer_norm(
        a, relax.const(np.ones(64, "float32")), relax.const(np.zeros(64, "float32")), axes=[-1]), [x]))
    _, nests = schedule_rest(func, AVX512)
    assert nests and not any(n.note or n.packed for n in nests), nests


def test_a_float_depthwise_conv_is_left_to_channel_vectors_not_a_vector_core():
    """x86_fp32's C[16] += A[0] * B[16] matches a depthwise conv with 16 output columns of one
    channel as its lanes, after copying the input and output into that layout: 15-20x slower
    than channel vectors in place. A host CPU's vector template leaves it and says why;
    a library or an accelerator still takes it."""
    import tirbyoc

    x, w = ((1, 12, 12, 32), "float32"), ((32, 3, 3, 1), "float32")
    func = prim_func(fused_module(lambda a, b: depthwise(a, b, 32, out_dtype="float32"), [x, w]))
    out = tirbyoc.offload(func, "x86_fp32_avx2", verify=False)
    conv = [b for b in out.blocks if b.block.startswith("group_conv2d")]
    assert len(conv) == 1 and not conv[0].offloaded and "channel-wise reduction" in conv[0].reason, conv
    assert tirbyoc.offload(func, "blas", verify=False).offloaded  # a library (or an accelerator) still takes it


def _sums(x):
    """An int8 attention operand's zero-point sums as `QuantizedToInteger` writes them: the
    8-bit values widened, summed over one axis."""
    return relax.op.sum(relax.op.astype(x, "int32"), axis=[2], keepdims=True)


def test_sums_of_run_time_extents_run_in_channel_vectors_their_widening_inlined():
    """k^T's sums over its 64 rows (``seq`` channels, known at run time) and v's over ``seq``
    (64 channels): channel vectors (the last predicated where ``seq`` is no multiple), the
    cast read in place rather than widened into a copy first, the parallel loop fused only as
    far as no index divides by ``seq``; TVM's values at every size."""
    n, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    for shape, runs in [((n, 12, 64, s), [(1, 12, 64, 5), (2, 12, 64, 37)]),
                        ((n, 12, s, 64), [(1, 12, 3, 64), (2, 12, 40, 64)])]:
        func = prim_func(fused_module(_sums, [(shape, "int8")]))
        new, nests = schedule_rest(func, AVX512)
        assert len(nests) == 1 and "channel vectors of 16" in nests[0].note, nests
        text = new.script()
        assert "compute" not in text, text  # no widened copy
        loops = []
        tvm_ffi.structural_walk(new, (tirx.For, loops.append), order="pre")
        parallel = [l for l in loops if int(l.kind) == PARALLEL]
        assert len(parallel) == 1 and "seq" not in str(parallel[0].extent), parallel  # no division by seq
        assert any(int(l.kind) == VECTORIZED for l in loops)
        rng = np.random.default_rng(0)
        for size in runs:
            x = rng.integers(-128, 128, size).astype("int8")
            out = [*size[:2], 1, size[3]] if shape[2] == 64 else [*size[:2], 1, 64]
            expected = x.astype("int64").sum(axis=2, keepdims=True).astype("int32")
            np.testing.assert_array_equal(_run_sized(new, x, out), expected)
            np.testing.assert_array_equal(_run_sized(func, x, out), expected)


def _run_sized(func, x, out_shape):
    """``func`` (of run-time extents) on ``x``, its output of ``out_shape``."""
    exe = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET,
                      tir_pipeline=PIPELINE)
    out = tvm.runtime.empty(out_shape, "int32")
    exe(tvm.runtime.tensor(x), out)
    return out.numpy()
