"""An int8 model offloaded to AVX-512 VNNI end to end: quantize, make integer, legalize,
offload, build, run.

A float CNN written with ``relax.frontend.nn`` is quantized as ONNX Runtime's
``quantize_static`` would (`tirbyoc.app.model_in.models.quantize`: its weights bound as constants, QDQ
pairs calibrated on sample inputs, per-channel int8 weights, uint8 activations), its chains
made integer (`QuantizedToInteger`: uint8 x int8 -> int32 cores), legalized, and its
convolutions and dense layer are offloaded to the ``x86_vnni`` template (``vpdpbusd`` 16x4
dot products) with `OffloadTIR`. Both builds - offloaded and TVM's default - run on the same
inputs; the int8 cores make them agree bit for bit.

On a CPU without AVX-512 VNNI it runs on ``x86_vnni_emulated`` instead (the same rewrite, each
``vpdpbusd`` as portable vector code): the same check, and no times, which would not be VNNI's.

    python examples/int8_model_x86_vnni.py
"""

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tirbyoc import get_template, quantize, relax_vm
from tirbyoc.relax import OffloadReport, OffloadTIR, QuantizedToInteger


class Net(nn.Module):
    def __init__(self):
        self.conv1 = nn.Conv2D(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2D(32, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2D(64, 128, 1)
        self.fc = nn.Linear(128 * 16 * 16, 10)

    def forward(self, x):
        y = nn.op.relu(self.conv3(nn.op.relu(self.conv2(nn.op.relu(self.conv1(x))))))
        return self.fc(nn.op.reshape(y, (1, 128 * 16 * 16)))


def main():
    template = get_template("x86_vnni")
    if not template.runs_here():
        print(f"x86_vnni cannot run here ({template.unavailable_reason()}): "
              "running x86_vnni_emulated, untimed")
        template = get_template("x86_vnni_emulated")
    mod, _ = Net().export_tvm({"forward": {"x": nn.spec.Tensor((1, 3, 32, 32), "float32")}})
    mod = relax.transform.LegalizeOps()(QuantizedToInteger("uint8")(quantize(mod)))
    report = OffloadReport()
    offloaded = OffloadTIR([template], report=report)(mod)
    for f in report.functions:
        if f.macs:
            print(f"{f.name:10s} {f.macs:>12,} MACs  {', '.join(dict.fromkeys(f.intrinsics)) or f.reason}")
    print(f"MAC coverage: {report.coverage:.1%}")

    target = tvm.target.Target(dict(template.target))
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in p.ty.shape.values]).astype("float32"))
            for p in mod["forward"].params]
    results = {}
    for name, m in (("offloaded", offloaded), ("TVM default", mod)):
        vm = relax_vm(tvm.compile(m, target=target), tvm.cpu())
        out = vm["forward"](*args).numpy()
        ms = None
        if not template.emulates:
            ms = float(np.min(vm.time_evaluator("forward", tvm.cpu(), number=10, repeat=3)(*args).results)) * 1e3
            print(f"{name:12s} {ms:8.3f} ms")
        results[name] = (out, ms)
    err = float(np.abs(results["offloaded"][0] - results["TVM default"][0]).max())
    print(f"max abs error between the builds: {err:.3g}")
    return report, err, {k: v[1] for k, v in results.items()}


if __name__ == "__main__":
    main()
