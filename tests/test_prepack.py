"""Constant weights packed once at compile time (`tirbyoc.relax.prepack`): the copy an offloaded
PrimFunc makes of a constant weight runs once, the PrimFunc takes the packed array, and the
model still gives TVM's output."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tirbyoc
from tirbyoc._tvm import structural_equal
from tirbyoc.app.running.model_call import ModelCall
from tirbyoc.app.running.run import build_and_time, run_model
from tirbyoc.relax.bridge import offload_module
from tirbyoc.dtypes import numpy_dtype
from tirbyoc.relax.prepack import PackConstantWeights, PackedWeights, pack_constant_weights

from cpu_templates import runnable

TARGET = tvm.target.Target({"kind": "llvm"})


def conv_model(weight_as_input: bool = False, second_conv_input: bool = False):
    """x (1, 8, 10, 10) -> conv 3x3 (16 channels, constant weight unless ``weight_as_input``)
    -> relu [-> the same conv again, its weight an input: ``second_conv_input``]. The weight is
    HWIO: blas's GEMM reads it as [O, C*kh*kw], a transpose (an OIHW weight already is that
    and is read in place, `tirbyoc.rewrite.functions.in_place`: nothing to pack)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((3, 3, 8, 16)) / 8).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float32"))
    params = [x]
    if weight_as_input or second_conv_input:
        params.append(relax.Var("w", relax.TensorType((3, 3, 8, 16), "float32")))
    weight = params[1] if weight_as_input else relax.const(w)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, weight, padding=1, kernel_layout="HWIO")))
            if second_conv_input:
                y = bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.strided_slice(y, [1], [0], [8])),
                                               params[1], padding=1, kernel_layout="HWIO"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get()), w


def inputs(mod):
    rng = np.random.default_rng(1)
    return [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in mod["main"].params]


def test_a_constant_conv_weight_is_packed_once_and_the_model_still_agrees():
    mod, w = conv_model()
    offloaded, report = offload_module(mod, ["blas"])
    assert report.offloaded_macs == report.total_macs > 0
    packed, done = pack_constant_weights(offloaded)
    (name,) = done.functions
    assert len(done.functions[name]) == 1  # the weight, by its PrimFunc parameter's name
    func = packed[name]
    # the PrimFunc now takes the weight as blas's GEMM reads it: [O, C*kh*kw] (an NCHW
    # convolution is channels x pixels)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    assert [16, 72] in shapes and [3, 3, 8, 16] not in shapes
    assert done.bytes_per_call[name] == 72 * 16 * 4
    arrays = inputs(mod)
    ref, _, _ = build_and_time(ModelCall(mod, TARGET, "main", arrays), 1, timed=False)
    before, _, _ = build_and_time(ModelCall(offloaded, TARGET, "main", arrays), 1, timed=False)
    after, _, _ = build_and_time(ModelCall(packed, TARGET, "main", arrays), 1, timed=False)
    np.testing.assert_array_equal(after, before)  # the same GEMM on the same packed numbers
    np.testing.assert_allclose(after, ref, rtol=1e-5, atol=1e-5)


def test_the_packed_constant_is_the_weight_in_the_intrinsics_layout():
    """x86_vnni's vpdpbusd reads B as [N/16, K/4, 16, 4]: the packing runs here (a plain copy
    built for this CPU) whether or not this CPU has VNNI."""
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, size=(64, 32)).astype("int8")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w), out_dtype="int32")))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    offloaded, report = offload_module(mod, ["x86_vnni"], verify=False)
    assert report.offloaded_macs == 16 * 64 * 32
    packed, done = pack_constant_weights(offloaded)
    assert done.bytes_per_call == {"matmul": 64 * 32}
    (const,) = [a for a in packed["main"].body.blocks[0].bindings[0].value.args[1].fields
                if isinstance(a, tvm.ir.expr.GenericConst)]
    expected = w.reshape(16, 4, 2, 16).transpose(2, 0, 3, 1)  # [n/16, k/4, n%16, k%4]
    np.testing.assert_array_equal(const.value.numpy(), expected)


def test_a_weight_given_as_an_input_is_not_packed():
    mod, _ = conv_model(weight_as_input=True)
    offloaded, _ = offload_module(mod, ["blas"])
    packed, done = pack_constant_weights(offloaded)
    assert done.tensors == 0 and packed is offloaded


def test_a_function_called_with_a_constant_and_with_an_input_is_not_packed():
    mod, _ = conv_model(second_conv_input=True)
    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum(n.startswith("conv2d") for n in names) == 1  # one PrimFunc, two call sites
    offloaded, _ = offload_module(mod, ["blas"])
    _, done = pack_constant_weights(offloaded)
    assert done.tensors == 0


def test_the_pass_form_collects_what_it_packed():
    mod, _ = conv_model()
    offloaded, _ = offload_module(mod, ["blas"])
    report = PackedWeights()
    packed = PackConstantWeights(report=report)(offloaded)
    assert report.tensors == 1
    assert structural_equal(packed, pack_constant_weights(offloaded)[0])


def test_run_binds_a_built_in_models_weights_and_copies_none_of_them_per_call():
    """builtin:cnn's OIHW weights are what blas's GEMM reads ([O, C*kh*kw]): bound as
    constants, each is read in place, so nothing is left to pack and nothing is copied."""
    result = run_model("builtin:cnn", ["blas"], repeat=1)
    assert result.verified is True
    assert result.report.packed.tensors == 0 == result.to_json()["packed_weights"]["tensors"]
    assert "packed once at compile time" not in result.table()


def test_x86_vnni_with_packed_weights_agrees_with_tvm():
    from vnni import VNNI

    result = run_model("builtin:mlp_int8", [VNNI], repeat=1)
    assert result.verified is True and result.report.packed.tensors >= 1


def test_a_chain_of_weight_copies_is_packed_copy_by_copy():
    """A bf16 weight widened to float32 by the fp32 template's staging, then re-laid-out and
    padded: each copy reads the previous one's buffer, so the first round packs the widening
    and the next the layout; the PrimFunc ends up taking the weight as its core reads it (the
    bf16 ResNet-50's classifier: 0.87 -> 0.31 ms a call on an Emerald Rapids Xeon)."""
    runnable("x86_fp32_avx2")
    w = (np.random.default_rng(0).standard_normal((64, 100)) / 8).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = bb.emit(relax.op.astype(relax.const(w), "bfloat16"))
            out = bb.emit_output(bb.emit(relax.op.matmul(x, weight, out_dtype="float32")))
        bb.emit_func_output(out)
    mod = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(bb.get()))
    offloaded, report = offload_module(mod, ["x86_fp32_avx2"])
    assert report.offloaded_macs == report.total_macs == 6400
    packed, done = pack_constant_weights(offloaded)
    (name,) = done.functions
    assert len(done.functions[name]) == 2  # the bf16 weight, then its float32 copy
    assert not any(str(p.dtype) == "bfloat16" and [int(d) for d in p.shape] == [64, 100]
                   for p in packed[name].params)
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(numpy_dtype("bfloat16"))
    before, _, _ = build_and_time(ModelCall(offloaded, TARGET, "main", [x]), 1, timed=False)
    after, _, _ = build_and_time(ModelCall(packed, TARGET, "main", [x]), 1, timed=False)
    np.testing.assert_array_equal(after, before)  # the same products of the same numbers
