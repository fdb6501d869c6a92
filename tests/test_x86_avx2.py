"""The exact int8 templates for CPUs without VNNI (x86_avx2: vpmaddwd ymm; x86_avx512bw: zmm):
exact on full-range data, offloaded and verified like x86_vnni, register blocks sized to the
CPU's registers, and chosen by default where they are the fastest int8 core this CPU runs."""

import numpy as np
import pytest
import tvm
from cpu_templates import assert_intrinsics_check, run_built, runnable

import tirbyoc
from tirbyoc._tvm import vector_registers
from tirbyoc.app.running.run import FALLBACKS, FLOAT_TEMPLATES, INT8_TEMPLATES, default_templates
from tirbyoc.offloading.selfcheck import tensorize_exact
from tirbyoc.rewrite.cpu.register_blocks import register_block
from tirbyoc.testing.workloads import conv2d, matmul

AVX2_CODE = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}  # AVX2 only: 16 ymm, no AVX-512
TEMPLATES = ["x86_avx2", "x86_avx512bw"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_self_check(name):
    assert_intrinsics_check(name)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("a_value, b_value", [(255, -128), (255, 127), (0, -128), (1, -1)])
def test_dot_product_is_exact_at_the_extremes(name, a_value, b_value):
    """2 x 255 x -128 overflows int16 (where vpmaddubsw saturates): vpmaddwd on widened
    operands must give the exact sum."""
    t = runnable(name)
    intrin = t.groups[0].compute
    lanes, k = intrin.operand("B").shape
    mod = tvm.compile(tensorize_exact(intrin), target=t.tvm_target())
    c = tvm.runtime.tensor(np.full(lanes, 7, "int32"))
    mod["main"](tvm.runtime.tensor(np.full(k, a_value, "uint8")),
                tvm.runtime.tensor(np.full((lanes, k), b_value, "int8")), c)
    assert (c.numpy() == 7 + k * a_value * b_value).all()


@pytest.mark.parametrize("workload", ["matmul", "conv"])
def test_offload_verified_and_exact_on_full_range_data(workload):
    """Offloaded for AVX2 code (whatever this CPU also has), verified by tirbyoc, and equal
    to numpy on inputs at the ends of their ranges."""
    runnable("x86_avx2")
    if workload == "matmul":
        func = matmul(24, 40, 30, "uint8", "int8", "int32", trans_b=True)
        shapes = [(24, 30), (40, 30)]
    else:
        func = conv2d(1, 6, 7, 7, 16, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32")
        shapes = [tuple(int(x) for x in p.shape) for p in list(func.params)[:2]]
    off = tirbyoc.offload(func, "x86_avx2", target=AVX2_CODE)
    assert off.coverage == 1.0 and off.verification.passed and off.verification.max_abs_err == 0
    rng = np.random.default_rng(3)
    a = rng.choice(np.array([0, 1, 254, 255], "uint8"), shapes[0])
    b = rng.choice(np.array([-128, -127, 126, 127], "int8"), shapes[1])
    out_shape = tuple(int(x) for x in func.params[-1].shape)
    got = run_built(off.func, AVX2_CODE, [a, b, np.zeros(out_shape, "int32")])
    want = run_built(func, AVX2_CODE, [a, b, np.zeros(out_shape, "int32")])
    assert np.array_equal(got, want)


def test_register_budget_follows_the_cpu():
    assert vector_registers(AVX2_CODE) == 16
    assert vector_registers({"kind": "llvm", "mcpu": "cascadelake"}) == 32
    # 8-lane int32 tiles (32 B): a 4x4 block of ymm accumulators spills on 16 registers
    assert register_block(1024, 128, 32, registers=32) == (4, 4)
    assert register_block(1024, 128, 32, registers=16) == (4, 2)
    # 7 rows (ResNet's last stage): 7x2 reuses each load more than 1x16 does
    assert register_block(7, 64, 32, registers=32) == (7, 2)
    # x86_vnni's 64 B tiles: up to 24 accumulators; with the weight panel in L2 (ResNet-50's
    # 14x14 3x3 layer), rows before tiles: 2x8 reads four times the L2 lines of 7x2 per step
    assert register_block(1024, 64, 64) == (4, 4)
    assert register_block(14, 16, 64, panel_bytes=576 * 64, weight_tile_bytes=64) == (7, 2)
    # the weight panel shares L2 with the input: past half of L2 beside a large input (BERT's
    # K = 3072 matmul, 1.5 MB of input) it narrows the block; a small input leaves it more
    # (ResNet-50's 7x7 3x3 layer, fp32: 295 KB a tile beside 166 KB of input)
    assert register_block(128, 48, 64, panel_bytes=3072 * 64, weight_tile_bytes=64,
                          input_bytes=1536 * 1024) == (8, 2)
    assert register_block(7, 32, 64, panel_bytes=4608 * 64, weight_tile_bytes=64, input_bytes=166 * 1024) == (7, 2)
    assert register_block(7, 32, 64, panel_bytes=4608 * 64, weight_tile_bytes=64, input_bytes=900 * 1024) == (7, 1)
    # a ymm weight tile is half a line, the next step's the other half: ResNet's 14x14 3x3
    # fp32 layer (256 -> 256) on AVX2 ran 2x4 at 79-81 GFLOP/s, 14x1 (each line counted whole)
    # at 35-38 and 7x1 at 52-63 (Zen 4, one thread)
    assert register_block(14, 32, 32, registers=16, panel_bytes=2304 * 32, weight_tile_bytes=32,
                          input_bytes=256 * 1024) == (2, 4)


def test_offload_schedule_names_the_block_for_avx2_code():
    runnable("x86_avx2")
    off = tirbyoc.offload(matmul(64, 256, 64, "uint8", "int8", "int32", trans_b=True), "x86_avx2",
                          target=AVX2_CODE, verify=False)
    steps = [str(s) for s in off.blocks[0].steps]
    assert any("register-blocked 4x2 accumulator tiles" in s for s in steps), steps


def _best_float():
    return next(n for n in FLOAT_TEMPLATES if tirbyoc.get_template(n).runs_here())


def test_default_template_follows_the_model_and_the_cpu():
    assert default_templates("builtin:resnet18") == [_best_float()]
    best = next(n for n in INT8_TEMPLATES if tirbyoc.get_template(n).runs_here())
    # AMX's kernel refuses some blocks: VNNI takes those where it runs
    after = [FALLBACKS[best]] if best in FALLBACKS and tirbyoc.get_template(FALLBACKS[best]).runs_here() else []
    # and the fp32 core for the float matmuls an int8 model keeps (a dynamically quantized attention)
    assert default_templates("builtin:cnn_int8") == [best, *after, _best_float()]
    assert default_templates() == [best, *after, _best_float()]  # the default model is int8 for an int8 template


def test_float_onnx_model_defaults_to_a_float_template(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])), path)
    assert default_templates(str(path)) == [_best_float()]
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.UINT8, [], [0])
    q = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "g", [x], [y],
                          initializer=[scale, zero])
    onnx.save(helper.make_model(q), path)
    assert default_templates(str(path)) != [_best_float()] or not any(
        tirbyoc.get_template(n).runs_here() for n in INT8_TEMPLATES)


def test_int8_model_runs_verified_on_avx2_code():
    """The whole int8 path on AVX2 code: channels-last, the stem padded to the reduction tile
    (2 channels), epilogues fused into the write-back, weights packed once; bit-exact."""
    from tirbyoc.app.running.run import run_model

    runnable("x86_avx2")
    r = run_model("builtin:cnn_int8", ["x86_avx2"], target=AVX2_CODE, repeat=1)
    assert r.verified is True and r.max_abs_err == 0 and r.report.coverage == 1.0
    assert r.layout.convolutions == 3 and r.layout.padded_channels == 1  # the 3-channel stem: 4
    assert "epilogue on the accumulator tile" in r.table()
