"""A fused layer that ends in quantize -> dequantize stores its 8-bit value and its readers
dequantize it (`tirbyoc.relax.narrow_boundary`): ResNet's projection shortcuts, as ONNX
Runtime's quantizer writes them, with the same output bits in TVM's build and in tirbyoc's."""

import numpy as np
import pytest

import tirbyoc.app.model_in.legalize as legalize
from tirbyoc._tvm import relax_vm, tirx, tvm
from tirbyoc.app.model_in.legalize import legalized_model
from tirbyoc.relax.narrow_boundary import MARK, dequantized_output
from tirbyoc.testing.qdq import float_resnet18, ort_quantize

pytest.importorskip("onnxruntime")
TEMPLATE = "x86_amx_emulated"  # fuses epilogues and runs on any CPU


@pytest.fixture(scope="module")
def qdq_resnet18(tmp_path_factory):
    folder = tmp_path_factory.mktemp("narrow")
    return ort_quantize(float_resnet18(folder / "f.onnx", size=32, classes=10, width=16), folder / "q.onnx")


def outputs(mod, entry, arrays):
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    return relax_vm(exe, tvm.cpu())[entry](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_the_projections_store_bytes_with_tvms_output_bits(qdq_resnet18, monkeypatch):
    prepared = legalized_model(str(qdq_resnet18), [TEMPLATE], constant_weights=True)
    report, mod, entry, arrays = prepared.quantized, prepared.mod, prepared.entry, prepared.arrays
    assert len(report.boundaries) == 3  # res3, res4, res5's projections
    assert "3 dequantized outputs stored in 8 bits" in report.describe()
    marked = {gv.name_hint: f.attrs[MARK] for gv, f in mod.functions.items()
              if isinstance(f, tirx.PrimFunc) and f.attrs is not None and MARK in f.attrs}
    assert sorted(marked.values()) == ["input"] * 3 + ["output"] * 3, marked
    for name in report.boundaries:
        assert str(mod[name].params[-1].dtype) == "uint8" and dequantized_output(mod[name]) is None

    monkeypatch.setattr(legalize, "narrow_boundaries", lambda m: (m, []))
    wide = legalized_model(str(qdq_resnet18), [TEMPLATE], constant_weights=True).mod
    producers = [f for f in wide.functions.values() if isinstance(f, tirx.PrimFunc) and dequantized_output(f)]
    assert len(producers) == 3
    np.testing.assert_array_equal(outputs(mod, entry, arrays), outputs(wide, entry, arrays))


def test_offloaded_with_the_boundaries_in_bytes_is_bit_exact(qdq_resnet18):
    from tirbyoc.app.running.run import run_model

    result = run_model(str(qdq_resnet18), [TEMPLATE])
    assert result.verified and result.max_abs_err == 0.0
    assert len(result.quantized.boundaries) == 3
