"""Every script in examples/ runs, and does what its docstring says."""

import importlib.util
import sys
from pathlib import Path

import pytest

import tirbyoc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TVMScript reads a class's source through its module
    spec.loader.exec_module(module)
    return module


def test_a_conv_relu_to_an_extern_library_via_call_dps_packed():
    report, err = load_example("conv_relu_extern").main()
    assert [c.kernel for c in report.replaced] == ["vendor_conv2d_relu"] * 2
    assert all(c.verified for c in report.replaced) and err < 1e-3


def test_b_custom_tir_operator_in_an_onnx_graph(tmp_path):
    pytest.importorskip("onnx")
    dispatched, offloaded, err = load_example("onnx_custom_tir").main(tmp_path / "attention.onnx")
    assert [(c.kernel, c.replaced, c.verified) for c in dispatched.calls] == [("softmax_rows", True, True)]
    assert offloaded.coverage == 1.0 and err < 1e-4


def test_c_target_dispatch_of_concat():
    results = load_example("concat_dispatch").main()
    (x86_report, x86_err), (generic_report, generic_err) = results.values()
    assert {c.kernel for c in x86_report.replaced} == {"concat_tir"} and len(x86_report.replaced) == 2
    assert {c.kernel for c in generic_report.replaced} == {"vendor_concat"} and len(generic_report.replaced) == 2
    assert x86_err == 0 and generic_err == 0


def test_d_int8_model_on_x86_vnni():
    """On x86_vnni where this CPU has VNNI (timed), else on its emulation (untimed)."""
    report, err, latency = load_example("int8_model_x86_vnni").main()
    assert report.coverage == 1.0 and err == 0
    assert all(f.verified for f in report.functions if f.macs)
    if tirbyoc.get_template("x86_vnni").runs_here():
        assert latency["offloaded"] > 0 and latency["TVM default"] > 0
    else:
        assert latency == {"offloaded": None, "TVM default": None}


def test_new_accelerator_runs_in_the_simulator():
    result = load_example("new_accelerator").main()
    assert result.verified is True and result.max_abs_err == 0
    convs = [f for f in result.report.functions if f.name.startswith("conv2d")]
    assert len(convs) == 3 and all(f.offloaded and f.verified for f in convs)
    assert result.simulation["npu8"].cycles > 0 and result.simulation["npu8"].config.clock_mhz == 400


def test_a_llama_decoder_at_several_lengths():
    result = load_example("llama_decoder").main(lengths=(1, 9))
    assert [r.sizes["seq"] for r in result.sizes] == [1, 9]
    assert all(r.coverage == 1.0 and r.verified for r in result.sizes)
