"""PyTorch PT2E quantized models (``prepare_pt2e`` / ``convert_pt2e`` with the x86 quantizer:
uint8 activations, per-channel int8 weights, float biases, a float last layer) import as QDQ
graphs (`tirbyoc.relax.pt2e`) and land on the int8 templates as integer cores. Needs torch and
torchao (``pip install torch==2.13.0 torchao``); skipped without them."""

import runpy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.decl.host import host_target
from tirbyoc.app.model_in.frontends import load_model  # noqa: E402
from tirbyoc.app.running.run import run_model  # noqa: E402
from tirbyoc.relax.quantized import quantized_to_integer  # noqa: E402

MODEL = '''
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        return self.fc(x.flatten(1))


torch.manual_seed(0)
example_inputs = (torch.randn(1, 3, 8, 8),)
_prepared = prepare_pt2e(torch.export.export(Net().eval(), example_inputs).module(),
                         X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
for _ in range(8):
    _prepared(torch.randn(1, 3, 8, 8))
model = convert_pt2e(_prepared)
'''


@pytest.fixture(scope="module")
def pt2e_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2e") / "pt2e_net.py"
    path.write_text(MODEL)
    return path


def run(mod, x):
    exe = tvm.compile(mod, target=host_target())
    out = relax_vm(exe, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out[0] if hasattr(out, "__len__") and not hasattr(out, "numpy") else out).numpy()


def test_pt2e_graph_imports_as_qdq_and_becomes_integer(pt2e_file):
    """The imported graph computes what PyTorch's converted model computes; its three chains
    (two convs with float biases and ReLU, the float classifier) become integer cores that
    agree with it to float32 rounding."""
    mod = load_model(str(pt2e_file))[1]
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    namespace = runpy.run_path(str(pt2e_file))
    want = namespace["model"](torch.from_numpy(x)).detach().numpy()
    qdq = run(tvm.relax.transform.LegalizeOps()(mod), x)
    np.testing.assert_allclose(qdq, want, rtol=1e-5, atol=1e-5)
    integer, report = quantized_to_integer(mod, "int8")
    assert sorted(report.integer) == ["conv2d 16x3x3x3", "conv2d 32x16x3x3", "matmul 512x10"], report.kept
    np.testing.assert_allclose(run(tvm.relax.transform.LegalizeOps()(integer), x), qdq, rtol=1e-5, atol=1e-5)


def test_pt2e_model_runs_integer_on_vta(pt2e_file):
    r = run_model(str(pt2e_file), ["vta"], repeat=1)
    assert r.quantized.describe().startswith("3 of 3 quantized conv/matmul chains made integer"), r.table()
    assert r.report.coverage == 1.0 and r.verified is True and r.comparison.abs_err == 0, r.table()
