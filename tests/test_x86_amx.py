"""x86_amx: Intel AMX tiles (tdpbusd) as a GEMM kernel on weights packed once.

Every offload is verified against TVM's build of the untouched function: natively where the
CPU has AMX and Linux grants the tile state, and everywhere through ``x86_amx_emulated`` (the
same rewrite, the kernel as portable C with the same 32-bit sums). The kernel's machine code
must hold the AMX instructions the template promises, whichever CPU builds it.
"""

import shutil
import subprocess

import numpy as np
import pytest
from cpu_templates import runnable

import tirbyoc
from tirbyoc.testing.workloads import conv2d, matmul

TEMPLATES = ["x86_amx", "x86_amx_emulated"]

WORKLOADS = {
    "matmul": lambda: matmul(128, 256, 512, "uint8", "int8", "int32"),
    "weights [N, K], odd rows and K": lambda: matmul(100, 48, 300, "uint8", "int8", "int32", trans_b=True),
    "rows under a tile": lambda: matmul(5, 32, 200, "uint8", "int8", "int32"),
    "conv NHWC 3x3": lambda: conv2d(1, 64, 14, 14, 64, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8",
                                    acc="int32"),
    "conv NHWC 3x3 stride 2": lambda: conv2d(1, 32, 15, 15, 48, 3, 3, layout="NHWC", stride=2, dtype="uint8",
                                             wdtype="int8", acc="int32"),
}


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_offloaded_whole_and_bit_exact(name, workload):
    runnable(name)
    out = tirbyoc.offload(WORKLOADS[workload](), name)
    assert out.coverage == 1.0, [b.reason for b in out.blocks]
    assert out.verification.passed, out.verification.describe()
    (core,) = out.offloaded
    assert core.intrinsic.startswith(f"{name}.gemm_")
    # the weight is packed in the [N/16, K/4, 16, 4] layout tdpbusd reads, not read in place
    assert any("pack" in str(s) and "16x4" in str(s) for s in core.steps), [str(s) for s in core.steps]


def test_a_convolution_reduces_over_its_whole_window_in_one_call():
    """kh, kw and the channels fused into one reduction: the accumulators stay in the tile
    registers over 9 x 64, not over 64 channels nine times; one call covers 32 rows and all
    64 output channels (their zeroing too)."""
    out = tirbyoc.offload(WORKLOADS["conv NHWC 3x3"](), "x86_amx_emulated", verify=False)
    (core,) = out.offloaded
    assert "gemm_32x64x576_u8i8i32" in core.intrinsic and "zero_32x64_int32" in core.intrinsic, core.intrinsic


def _blocks_by_place(func) -> dict:
    """Each block's name -> whether it runs inside a parallel loop."""
    from tirbyoc._tvm import iter_blocks, tirx, tvm_ffi

    inside = set()

    def visit(loop):
        if loop.kind == tirx.ForKind.PARALLEL:
            inside.update(b.name_hint for b in iter_blocks(loop.body))

    tvm_ffi.structural_walk(func.body, (tirx.For, visit))
    return {b.name_hint: b.name_hint in inside for b in iter_blocks(func.body)}


def test_the_rows_staging_is_copied_block_by_block_and_a_1x1_input_read_in_place():
    """The im2col of a 3x3 convolution and the zero rows that pad a GEMM's 100 rows to 128 are
    computed inside the parallel loop over 32-row blocks, each block's rows right before its
    call; a 1x1 convolution over an NHWC input reads it in place (its staging an identity: a
    view of the parameter, which no block copies)."""
    from tirbyoc.rewrite.foundation.steps import StepKind

    for workload, copy in ((conv2d(1, 64, 14, 14, 64, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8",
                                   acc="int32"), "D_global_pad"),
                           (matmul(100, 64, 256, "uint8", "int8", "int32"), "A_global_pad")):
        out = tirbyoc.offload(workload, "x86_amx_emulated")
        assert out.verification.passed, out.verification.describe()
        (core,) = out.offloaded
        assert any("rows' staging per row block" in str(s) for s in core.steps), [str(s) for s in core.steps]
        placed = _blocks_by_place(out.func)
        assert placed.get(copy) is True, placed
    one = tirbyoc.offload(conv2d(1, 256, 16, 16, 64, 1, 1, layout="NHWC", dtype="uint8", wdtype="int8",
                                 acc="int32"), "x86_amx_emulated")
    assert one.verification.passed, one.verification.describe()
    (core,) = one.offloaded
    (note,) = [str(s) for s in core.steps if s.kind is StepKind.IN_PLACE]
    assert "D as [256, 256]" in note, note
    assert not [name for name in _blocks_by_place(one.func) if name.startswith("D_")], note


def test_a_call_covers_the_output_channels_its_panel_of_b_or_rows_of_a_keep_in_l1():
    from tirbyoc_intrinsics.x86_amx import call_columns

    assert [call_columns(n, 1024) for n in (40, 64, 256, 512, 1000, 2048)] == [48, 64, 256, 512, 336, 512]
    assert call_columns(256, 2304) == 32  # 32 rows x 2304 bytes of A would not stay in L1
    # a shallower reduction: the widest panel of B up to 32 KB (64 columns or more), reused from L1
    assert [call_columns(n, k) for n, k in ((512, 512), (1024, 256), (512, 128), (64, 576))] == [64, 128, 256, 64]
    # rows read in place (a 1x1 convolution, a GEMM) from K = 256 bytes: 64 columns, an 8 KB block
    # the write-back passes through L1 beside B's panel; shallower, the widths above
    assert [call_columns(n, k, rows_staged=False) for n, k in ((1024, 256), (256, 1024), (512, 128), (256, 2304))] \
        == [64, 64, 256, 32]
    out = tirbyoc.offload(matmul(64, 1024, 256, "uint8", "int8", "int32", trans_b=True), "x86_amx_emulated")
    (core,) = out.offloaded
    assert "gemm_32x64x256" in core.intrinsic and out.verification.passed, out.verification.describe()
    window = tirbyoc.offload(conv2d(1, 128, 8, 8, 256, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8",
                                    acc="int32"), "x86_amx_emulated")
    (core,) = window.offloaded  # K = 1152 bytes of staged rows: all 128 columns a call, not 64
    assert "gemm_32x128x1152" in core.intrinsic and window.verification.passed, window.verification.describe()


def test_outputs_are_padded_to_the_32x32_block_and_k_must_group_by_4():
    out = tirbyoc.offload(matmul(20, 40, 128, "uint8", "int8", "int32"), "x86_amx_emulated")
    assert out.coverage == 1.0 and out.verification.passed, [b.reason for b in out.blocks]
    assert any("pad" in str(s) for s in out.offloaded[0].steps)
    out = tirbyoc.offload(matmul(32, 32, 130, "uint8", "int8", "int32"), "x86_amx_emulated", verify=False)
    assert not out.offloaded
    assert "multiple of 4" in out.blocks[0].reason
    out = tirbyoc.offload(matmul(32, 32, 64, "uint8", "int8", "int32"), "x86_amx_emulated", verify=False)
    assert not out.offloaded and "VNNI" in out.blocks[0].reason  # too short for tiles


def test_an_int8_model_runs_on_amx_with_vnni_for_what_it_refuses():
    """The default template list on an AMX CPU; everywhere the emulated twin runs the model."""
    from tirbyoc.app.running.run import run_model

    names = ["x86_amx", "x86_vnni"] if tirbyoc.get_template("x86_amx").runs_here() else ["x86_amx_emulated"]
    result = run_model("builtin:mlp_int8", names, repeat=1)
    assert result.report.coverage == 1.0 and result.verified, result.outcome()
    kernels = [f.kernel() for f in result.report.functions if f.total_macs]
    assert kernels and all(k.startswith(names[0]) for k in kernels), kernels


def test_the_kernel_is_amx_machine_code(tmp_path):
    """The native kernel's machine code holds the tile configuration, loads, the dot product
    and the stores (built and read on any x86-64 machine; run only where AMX is)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    from tirbyoc_intrinsics import x86_amx

    path = x86_amx.LIBRARY.build()  # compiled here with the C compiler, never run here
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                          check=True).stdout
    for op in ("ldtilecfg", "tileloadd", "tdpbusd", "tilestored", "vpdpbusd"):
        assert op in text, op


def test_packed_description_is_what_tensorize_sees():
    """The description a user writes indexes the weight as declared, B[j, k]; TVM is given it
    re-laid-out to the packed buffer the implementation reads."""
    from tirbyoc.decl.packed_desc import packed_description
    from tirbyoc_intrinsics import x86_amx

    intrin = x86_amx.gemm(32, 32, 64)
    assert "B[vj, vk]" in intrin.desc.script()
    packed = packed_description(intrin.desc, intrin.operands).script()
    assert "(2, 16, 16, 4)" in packed and "B[vj // 16, vk // 4, vj % 16, vk % 4]" in packed


def test_layout_packed_is_checked():
    with pytest.raises(tirbyoc.IntrinsicError, match="does not divide"):
        tirbyoc.Operand("B", (24, 8), "int8", layout=tirbyoc.Layout.packed((16, 4)))
    assert tirbyoc.Layout.packed((16, 4)).packed_shape((32, 64)) == (2, 16, 16, 4)
    assert np.prod(tirbyoc.Layout.packed((16, 4)).packed_shape((32, 64))) == 32 * 64


def test_a_window_of_few_bytes_a_pixel_is_left_to_the_vector_template():
    """ResNet's stem (7x7 over 3 channels, padded to 4): AMX's rows would be gathered 4 bytes
    at a time; x86_vnni reads the pixels in place, 2.1-2.4x faster on an Emerald Rapids Xeon.
    The kernel's resize sees the window the matcher fused into K and refuses it, saying why."""
    stem = conv2d(1, 4, 37, 37, 64, 7, 7, layout="NHWC", stride=2, dtype="uint8", wdtype="int8", acc="int32")
    out = tirbyoc.offload(stem, "x86_amx_emulated", verify=False)
    assert not out.offloaded
    assert "a window of 4 bytes per pixel (7x7x4)" in out.blocks[0].reason, out.blocks[0].reason
    wide = conv2d(1, 64, 9, 9, 64, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32")
    assert tirbyoc.offload(wide, "x86_amx_emulated", verify=False).offloaded  # 64 bytes a pixel: AMX's


def test_bf16_keeps_the_stem_on_amx():
    """bf16's stem is not refused: on AVX512_BF16 it ran 3.1 ms a call against AMX's 0.78
    (bf16 ResNet-50, one thread, an Emerald Rapids Xeon)."""
    stem = conv2d(1, 4, 37, 37, 64, 7, 7, layout="NHWC", stride=2, dtype="bfloat16", wdtype="bfloat16",
                  acc="float32")
    assert tirbyoc.offload(stem, "x86_amx_bf16_emulated", verify=False).offloaded
