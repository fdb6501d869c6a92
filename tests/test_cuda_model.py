"""A whole model on the GPU: BERT in float16 offloaded to cuda_mma, the rest on TVM's default
CUDA pipeline (dlight).

Without a GPU the model is offloaded and built (CUDA C from TVM's codegen, compiled on to
machine code where a CUDA compiler is here); with one, `tirbyoc.run_model` runs both builds
there and compares them (``-m gpu``).
"""

import pytest
from tvm import relax

import tirbyoc
from tirbyoc._tvm import build, cuda_source, tirx, tvm
from tirbyoc.app.model_in.models import bert_base_fp16
from tirbyoc.offloading import cuda_toolchain
from tirbyoc.offloading.devices import compile_func, device_of
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.relax.bridge import offload_module


@pytest.fixture(scope="module")
def target():
    return tirbyoc.get_template("cuda_mma").tvm_target()


@pytest.fixture(scope="module")
def bert():
    """One BERT-base layer in float16 at seq 32, legalized, and offloaded to cuda_mma."""
    mod = relax.transform.LegalizeOps()(bert_base_fp16(batch=2, seq=32, layers=1))
    new, report = offload_module(mod, ["cuda_mma"], verify=False)
    return mod, new, report


def test_every_matmul_of_bert_fp16_takes_the_tensor_core_kernel(bert):
    mod, new, report = bert
    matmuls = [f for f in report.functions if f.macs]
    assert len(matmuls) == 6 and report.coverage == 1.0  # 4 projections, q.k^T, p.v
    for f in matmuls:
        assert f.template == "cuda_mma" and "mma_f16f16f32" in f.intrinsics[0], (f.name, f.intrinsics)
        func = new[f.name]
        # scheduled: TVM's GPU pipeline (dlight) must leave it as it is
        assert func.attrs["tirx.is_scheduled"] and "mma_sync" not in func.script()


def test_the_offloaded_model_builds_for_cuda_with_the_rest_on_dlight(bert, target):
    _, new, _ = bert
    exe = build(new, target, PIPELINE)
    assert "cuda_graph" in exe.as_text()  # the launches captured once and replayed (CUDA_PASS_CONFIG)
    source = cuda_source(exe)
    assert source.count("mma.sync.aligned.m16n8k16") >= 6 and "cp.async" in source
    assert "nvcuda::wmma" not in source  # no function fell back to the one-warp schedule
    if cuda_toolchain.toolchain() is not None:
        note = cuda_toolchain.machine_code_note(source, tvm.target.Target(target))
        assert "sm_80 machine code" in note, note


def test_a_gpu_device_times_functions_as_its_default_pipeline_builds_them(bert, target):
    mod, _, _ = bert
    cuda = device_of(target)
    assert cuda.runtime_device().dlpack_device_type() == tvm.cuda(0).dlpack_device_type()
    assert device_of({"kind": "llvm"}).runtime_device().dlpack_device_type() == tvm.cpu().dlpack_device_type()
    scheduled = cuda.as_default_built(mod["layer_norm"], target)
    assert scheduled.attrs["tirx.is_scheduled"]
    assert "threadIdx" in scheduled.script()
    compile_func(scheduled, target, "timed")  # unscheduled, it would not build for a GPU
    untouched = mod["layer_norm"]
    assert device_of({"kind": "llvm"}).as_default_built(untouched, {"kind": "llvm"}).same_as(untouched)


@pytest.mark.gpu
def test_bert_fp16_runs_on_the_gpu_and_agrees_with_tvms_build(tmp_path):
    if not tirbyoc.get_template("cuda_mma").runs_here():
        pytest.skip(tirbyoc.get_template("cuda_mma").unavailable_reason())
    from tirbyoc.app.running.run import run_model

    model = tmp_path / "bert.py"
    model.write_text("from tirbyoc.app.model_in.models import bert_base_fp16\n"
                     "bert = bert_base_fp16(batch=2, seq=32, layers=2)\n")
    result = run_model(str(model), ["cuda_mma"], repeat=2)
    assert result.report.coverage == 1.0
    assert result.verified, result.outcome()
    assert all(f.verified for f in result.report.functions if f.macs)


def test_no_function_is_offloaded_twice_by_the_default_pipeline(bert):
    # the offloaded functions are opaque to fusion: FuseOps leaves their calls alone
    _, new, report = bert
    fused = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(new)))
    names = {gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tirx.PrimFunc)}
    assert {f.name for f in report.functions if f.macs} <= names



@pytest.fixture(scope="module")
def resnet():
    """ResNet-50 in float16 at 64x64 in NHWC (as `tirbyoc run` lays a model out for cuda_mma),
    legalized and offloaded."""
    from tirbyoc.app.model_in.convnets import resnet50_fp16
    from tirbyoc.relax.layout import channels_last

    mod = relax.transform.LegalizeOps()(channels_last(resnet50_fp16(image=64), None, 16)[0])
    return offload_module(mod, ["cuda_mma"], verify=False)


def test_resnet50_fp16_convolutions_run_as_implicit_gemms_on_the_tensor_core_kernel(resnet, target):
    new, report = resnet
    convs = [f for f in report.functions if f.name.startswith("conv2d")]
    stem = next(f for f in convs if f.name == "conv2d")  # 3 input channels: 6 bytes per pixel
    assert stem.template is None and stem.reason
    taken = [f for f in convs if f is not stem]
    assert len(taken) == 22
    for f in taken:
        assert f.template == "cuda_mma" and "mma_f16f16f32" in f.intrinsics[0], (f.name, f.intrinsics)
    source = cuda_source(build(new, target, PIPELINE))
    assert "nvcuda::wmma" not in source  # none fell back to the one-warp schedule
    # the 3x3 windows and the padding read from the activation itself, zero-filled past its edges
    assert "ptx_cp_async_legacy_pred" in source


@pytest.mark.gpu
def test_resnet50_fp16_runs_on_the_gpu_and_agrees_with_tvms_build(tmp_path):
    if not tirbyoc.get_template("cuda_mma").runs_here():
        pytest.skip(tirbyoc.get_template("cuda_mma").unavailable_reason())
    from tirbyoc.app.running.run import run_model

    model = tmp_path / "resnet.py"
    model.write_text("from tirbyoc.app.model_in.convnets import resnet50_fp16\nresnet = resnet50_fp16(image=64)\n")
    result = run_model(str(model), ["cuda_mma"], repeat=2)
    assert result.verified and result.report.coverage > 0.9


def test_a_fused_models_epilogue_runs_in_the_kernels_write_back(target):
    """BERT fused as `tirbyoc run` fuses it for cuda_mma (``fuses_epilogues``): each matmul's
    float32 -> float16 cast and bias add run on the tile on its way out of the kernel, so the
    function is one kernel that writes C once, in float16."""
    import re

    from tirbyoc.relax.bridge import fuse

    assert tirbyoc.get_template("cuda_mma").fuses_epilogues
    mod = fuse(relax.transform.LegalizeOps()(bert_base_fp16(batch=2, seq=32, layers=1)))
    out = tirbyoc.offload(mod["fused_matmul_cast_add"], "cuda_mma", verify=False)
    steps = [str(s) for b in out.blocks for s in b.steps]
    assert "T_add fused into C's write to global" in steps, steps
    source = cuda_source(build(out.func.with_attr("global_symbol", "main"), target))
    assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1
    assert "half4" in source  # the write-back stores float16, four at a time
