"""Every shipped intrinsic: validated, tensorized at exactly its shape, built where TVM can,
and self-checked on full-range random data where its target runs here."""

import numpy as np
import pytest
import tvm

import tirbyoc
from tirbyoc.offloading.selfcheck import self_check, tensorize_exact

TEMPLATES = tirbyoc.template_names()
ALL = [(t, i.name) for t in TEMPLATES for i in tirbyoc.get_template(t).intrinsics()]


def test_five_templates_ship():
    assert set(TEMPLATES) >= {"x86_vnni", "blas", "hexagon_hvx", "cuda_mma", "vta"}


@pytest.mark.parametrize("template, name", ALL, ids=[n for _, n in ALL])
def test_validates_and_tensorizes_exact_shape(template, name):
    t = tirbyoc.get_template(template)
    intrin = t.intrinsic(name).validate()
    mod = tensorize_exact(intrin)
    text = mod.script()
    # The intrinsic's leaf block is gone: the implementation replaced it.
    assert "_o" in text
    if t.target["kind"] == "llvm":
        tvm.compile(mod, target=t.tvm_target())


def _runnable(name):
    t = tirbyoc.get_template(name)
    if not t.runs_here():
        pytest.skip(f"{name}: {t.unavailable_reason()}")
    t.prepare()
    return t


@pytest.mark.parametrize("template", ["x86_vnni", "x86_vnni_emulated", "blas", "hexagon_hvx", "x86_amx",
                                      "x86_amx_emulated"])
def test_self_check_shipped(template):
    t = _runnable(template)
    for intrin in t.intrinsics():
        result = self_check(intrin, dict(t.target))
        assert result.passed, result.detail


@pytest.mark.parametrize("m, n, k", [(2, 3, 2), (7, 13, 5), (15, 16, 17), (31, 2, 33), (63, 64, 65)])
@pytest.mark.parametrize("trans_b", [False, True])
def test_blas_generated_shapes(m, n, k, trans_b):
    from tirbyoc_intrinsics import blas

    t = _runnable("blas")
    result = self_check(blas.gemm(m, n, k, trans_b), dict(t.target))
    assert result.passed, result.detail
    tvm.compile(tensorize_exact(blas.gemm(m, n, k, trans_b)), target=t.tvm_target())


def test_unit_extent_axes_rejected_with_reason():
    from tirbyoc_intrinsics import blas

    with pytest.raises(tirbyoc.IntrinsicError, match=r"axes \['i', 'j'\] have extent 1"):
        blas.gemm(1, 1, 2)


def test_blas_batched_odd_shape():
    from tirbyoc_intrinsics import blas

    t = _runnable("blas")
    assert self_check(blas.batched_gemm(3, 5, 7, 11, True), dict(t.target)).passed


@pytest.mark.parametrize("template", ["x86_vnni", "x86_vnni_emulated"])
def test_vnni_does_not_saturate_at_int16(template):
    """All-extreme inputs: 4 x 255 x -128 per lane overflows int16; VNNI must be exact, and
    so must its emulation."""
    t = _runnable(template)
    mod = tvm.compile(tensorize_exact(t.groups[0].compute), target=t.tvm_target())
    a = np.full(4, 255, "uint8")
    b = np.full((16, 4), -128, "int8")
    c = tvm.runtime.tensor(np.zeros(16, "int32"))
    mod["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    assert (c.numpy() == 4 * 255 * -128).all()


def test_hexagon_intrinsics_generate_hvx_code():
    """Every HVX compute intrinsic tensorizes to llvm.hexagon.V6 calls and builds for the
    template's target (running it is tests/test_hexagon.py's)."""
    t = tirbyoc.get_template("hexagon_hvx")
    for intrin in t.intrinsics():
        if intrin.role.value != "compute":
            continue
        mod = tensorize_exact(intrin)
        text = mod.script()
        assert "llvm.hexagon.V6.v" in text and "int32x32" in text
        tvm.compile(mod, target=t.tvm_target())


def test_vta_impls_call_simulator_runtime():
    t = tirbyoc.get_template("vta")
    text = tensorize_exact(t.intrinsic("gemm_1x16x16")).script()
    assert 'T.call_packed("tirbyoc.sim.gemm"' in text


def test_cuda_mma_tensorized_calls_wmma():
    t = tirbyoc.get_template("cuda_mma")
    text = tensorize_exact(t.intrinsic("mma_16x16x16_float16_float32")).script()
    assert "T.tvm_mma_sync" in text


@pytest.mark.gpu
def test_cuda_mma_needs_gpu():
    t = tirbyoc.get_template("cuda_mma")
    if not t.runs_here():
        pytest.skip(t.unavailable_reason())
