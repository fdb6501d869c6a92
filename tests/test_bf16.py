"""bf16: float models with --precision bf16, on AMX-BF16 (tdpbf16ps) and AVX512_BF16 (vdpbf16ps).

The conversion (`tirbyoc.relax.bf16`) is checked on real Relax modules; every offload is
verified against TVM's build of the same bfloat16 function (float32 sums: agreement to float32
rounding) natively where the CPU has the instructions and everywhere through
``x86_amx_bf16_emulated``; the kernels' machine code holds the instructions they promise.
"""

import shutil
import subprocess

import numpy as np
import pytest
from cpu_templates import runnable
from tvm import relax
from tvm.script import relax as R

import tirbyoc
from tirbyoc.offloading.verification import compare_arrays, tolerance
from tirbyoc.relax.bf16 import Bf16Report, bf16_of
from tirbyoc.testing.workloads import conv2d, matmul

TEMPLATES = ["x86_amx_bf16", "x86_avx512_bf16", "x86_amx_bf16_emulated"]
BF = dict(a="bfloat16", b="bfloat16", c="float32")

WORKLOADS = {
    "matmul": lambda: matmul(128, 256, 512, **BF),
    "weights [N, K], odd rows": lambda: matmul(100, 48, 300, **BF, trans_b=True),
    "rows under a tile, K not a multiple of 32": lambda: matmul(5, 32, 70, **BF),
    "odd K (a 7x7 RGB stem's 147)": lambda: matmul(64, 64, 147, **BF),
    "conv NHWC 3x3": lambda: conv2d(1, 64, 14, 14, 64, 3, 3, layout="NHWC", dtype="bfloat16", acc="float32"),
    "a 7x7 RGB stem, its rows padded 147 -> 148": lambda: conv2d(1, 3, 37, 37, 64, 7, 7, layout="NHWC", stride=2,
                                                                 dtype="bfloat16", acc="float32"),
}


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_offloaded_whole_and_verified(name, workload):
    runnable(name)
    out = tirbyoc.offload(WORKLOADS[workload](), name)
    assert out.coverage == 1.0, [b.reason for b in out.blocks]
    assert out.verification.passed, out.verification.describe()
    (core,) = out.offloaded
    assert core.intrinsic.startswith(f"{name}.gemm_") and "bf16bf16f32" in core.intrinsic
    assert any("pack" in str(s) and "16x2" in str(s) for s in core.steps), [str(s) for s in core.steps]


def test_a_wrong_kernel_would_be_caught():
    """The float32 tolerance the functions are verified at is far below a bf16 operand error:
    a kernel that rounded its sums to bfloat16, or dropped one product, would fail."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (64, 300)), rng.uniform(-1, 1, (300, 48))
    ref = (a @ b).astype("float32")
    one_product_lost = ref - (a[:, :1] @ b[:1, :]).astype("float32")
    assert compare_arrays(ref, one_product_lost, "float32", 300).passed is False
    rounded = ref.astype(tirbyoc.dtypes.numpy_dtype("bfloat16")).astype("float32")
    assert compare_arrays(ref, rounded, "float32", 300).passed is False
    # a bfloat16 output may be one rounding step apart, four at most
    assert tolerance("bfloat16", 1, 1.0) == pytest.approx(4 * 2.0 ** -7 + tolerance("float32", 1, 1.0))


@R.function
def _conv_matmul(x: R.Tensor((1, 8, 6, 6), "float32"), w: R.Tensor((16, 8, 3, 3), "float32"),
                 m: R.Tensor((16, 4), "float32"), i: R.Tensor((4, 4), "int32")):
    with R.dataflow():
        y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
        z = R.matmul(R.permute_dims(R.mean(y, axis=[2, 3]), [0, 1]), m)
        k = R.matmul(i, i)  # integers are left as they are
        R.output(z, k)
    return z, k


def test_conversion_reads_bf16_and_accumulates_in_float32():
    mod, report = bf16_of(tvm_module(_conv_matmul))
    assert dict(report.converted) == {"conv2d": 1, "matmul": 1} and dict(report.kept) == {"matmul": 1}
    legal = relax.transform.LegalizeOps()(mod)
    scripts = [f.script() for gv, f in legal.functions.items() if "conv2d" in gv.name_hint or "matmul" in gv.name_hint]
    assert any('T.Cast("float32", ' in s and '"bfloat16"' in s for s in scripts)
    assert "bf16: 1 conv2d, 1 matmul read bfloat16" in report.describe()


@R.function
def _conv_pool_conv(x: R.Tensor((1, 8, 9, 9), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                    v: R.Tensor((4, 8, 1, 1), "float32")):
    with R.dataflow():
        y = R.nn.relu(R.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
        p = R.nn.max_pool2d(y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
        z = R.nn.conv2d(p, v) + R.nn.conv2d(p, v * R.const(0.5, "float32"))  # two readers: one pool
        R.output(z)
    return z


def test_a_pooled_input_is_pooled_on_bf16_with_the_same_values():
    """Rounding to bfloat16 is non-decreasing, so it commutes with a maximum: the pool runs on
    the narrowed values (the layer before it then stores bfloat16) and the convolution after
    it reads exactly what it read before; no float32 pool is left."""
    import tvm

    from tirbyoc._tvm import relax_vm

    mod, report = bf16_of(tvm_module(_conv_pool_conv))
    assert report.pools == 1 and "1 max pool on bfloat16" in report.describe()
    text = mod.script()
    assert text.count("R.nn.max_pool2d") == 1 and text.count('R.astype(y, dtype="bfloat16")') == 1, text

    @R.function
    def cast_after(x: R.Tensor((1, 8, 9, 9), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                   v: R.Tensor((4, 8, 1, 1), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.nn.conv2d(R.astype(x, "bfloat16"), R.astype(w, "bfloat16"), padding=[1, 1, 1, 1],
                                      out_dtype="float32"))
            p = R.nn.max_pool2d(y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
            pb = R.astype(p, "bfloat16")
            z = R.nn.conv2d(pb, R.astype(v, "bfloat16"), out_dtype="float32") + R.nn.conv2d(
                pb, R.astype(v * R.const(0.5, "float32"), "bfloat16"), out_dtype="float32")
            R.output(z)
        return z

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in ((1, 8, 9, 9), (8, 8, 3, 3), (4, 8, 1, 1))]
    outs = []
    for m in (mod, tvm_module(cast_after)):
        m = tvm.IRModule({"main": m["main"].with_attr("global_symbol", "main")})
        exe = tvm.compile(relax.transform.LegalizeOps()(m), target=tvm.target.Target({"kind": "llvm"}))
        outs.append(relax_vm(exe, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    np.testing.assert_array_equal(*outs)


def test_accuracy_is_measured_against_float32():
    report = Bf16Report()
    ref = np.array([[0.1, 0.9, 0.3], [0.5, 0.2, 0.4]], "float32")
    report.measure(ref + np.array([[0.0, 0.0, 0.0], [-0.2, 0.0, 0.0]], "float32"), ref)
    assert report.max_rel_err == pytest.approx(0.2 / 0.9)
    assert report.argmax_agreement == 0.5 and report.rows == 2


def tvm_module(func):
    import tvm

    return tvm.IRModule({"main": func})


def test_a_float_model_runs_in_bf16_verified_and_its_accuracy_reported():
    from tirbyoc.app.running.run import run_model

    names = (["x86_amx_bf16", "x86_fp32_avx512"] if tirbyoc.get_template("x86_amx_bf16").runs_here()
             else ["x86_amx_bf16_emulated"])
    result = run_model("builtin:cnn", names, precision="bf16", repeat=1)
    assert result.verified, result.outcome()
    assert result.bf16 is not None and result.bf16.converted and result.bf16.max_rel_err is not None
    assert 0 < result.bf16.max_rel_err < 0.05  # bf16 changed values, a little
    kernels = [f.kernel() for f in result.report.functions if f.offloaded]
    assert any(k.startswith(names[0]) for k in kernels), kernels
    assert result.to_json()["precision"] == "bf16"


def test_precision_is_checked():
    from tirbyoc.app.running.run import run_model

    with pytest.raises(tirbyoc.TirbyocError, match="precision 'fp8'"):
        run_model("builtin:mlp", ["x86_amx_bf16_emulated"], precision="fp8", repeat=1)


@pytest.mark.parametrize("module, ops", [
    ("x86_amx", ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "vdpbf16ps")),
    ("x86_avx512_bf16", ("vdpbf16ps",)),
])
def test_the_kernels_are_bf16_machine_code(module, ops):
    """Built and read on any x86-64 machine; run only where the CPU has the instructions."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    import importlib

    path = importlib.import_module(f"tirbyoc_intrinsics.{module}").LIBRARY.build()
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                          check=True).stdout
    for op in ops:
        assert op in text, op


def test_the_command_line_takes_precision_bf16(tmp_path):
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tirbyoc", "run", "-q", "-m", "builtin:mlp", "-t",
                           "x86_amx_bf16_emulated", "--precision", "bf16", "--repeat", "1", "--json"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["precision"] == "bf16" and out["verified"] and out["bf16"]["converted"]["matmul"] >= 1
    assert out["bf16"]["max_rel_err"] is not None


def test_avx512_calls_take_rows_dividing_the_block_instead_of_padding_them():
    from tirbyoc_intrinsics.x86_amx import call_columns, call_rows

    # 32 where it divides; else a divisor from 16 to 64, whole 8-row register blocks first,
    # nearest 32 (ResNet's 28 x 28 = 784: 16; 14 x 14 = 196: 28); a block up to 64 rows as one
    # call (7 x 7 = 49); else 32 rows, padded
    assert [call_rows(m) for m in (128, 3136, 784, 196, 49, 144, 100, 5, 67)] == [32, 32, 16, 28, 49, 24, 25, 5, 32]
    assert call_columns(1024, 64) == 512 and call_columns(1024, 64, rows=64) == 256  # within 32 x 512 floats
    runnable("x86_avx512_bf16")
    out = tirbyoc.offload(conv2d(1, 256, 16, 16, 64, 3, 3, layout="NHWC", dtype="bfloat16", acc="float32"),
                          "x86_avx512_bf16")
    (core,) = out.offloaded
    rows = int(core.intrinsic.split(".gemm_")[1].split("x")[0])
    assert rows != 32 and 196 % rows == 0, core.intrinsic  # 196 rows in calls of 49 (two cores' 98), none padded
    assert out.verification.passed, out.verification.describe()


def test_a_padded_row_copy_is_split_at_its_largest_divisor():
    from tirbyoc.ir.tir_walk import divisor_split, padded_divisor_split

    # a 7 x 7 x 3 window's row (k // 21, k % 21 // 3, k % 3) padded 147 -> 148 for bf16 pairs
    assert divisor_split(148, {21, 3}) is None and padded_divisor_split(148, {21, 3}) == [8, 21]
    assert padded_divisor_split(147, {21, 3}) is None  # not padded: divisor_split's [7, 7, 3]
    assert padded_divisor_split(148, {21, 4}) is None  # no chain
