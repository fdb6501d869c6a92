"""A vendor's conv2d + ReLU kernel called from a Relax model through ``R.call_dps_packed``.

The vendor ships C code exporting a TVM packed function (``csrc/vendor_conv.c``). We declare
it as an `ExternLibrary` (``ffi=True``: compiled against TVM's FFI headers, loaded as a TVM
runtime module), write one `Rule` that takes every ``relu(conv2d(x, w))`` it can - NCHW,
float32, square stride and padding, no dilation or groups - and run `Dispatch` before
``LegalizeOps``. Each replacement is verified against TVM's own lowering of the two
operators; everything else (the conv without ReLU, the pooling) is legalized as usual.

    python examples/conv_relu_extern.py
"""

from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc import ExternLibrary, PackedFunction
from tirbyoc.relax import Dispatch, DispatchReport, LibraryKernel, Rule

VENDOR = ExternLibrary(
    name="vendor_conv",
    sources=[Path(__file__).parent / "csrc" / "vendor_conv.c"],
    symbols=["vendor_conv2d_relu"],
    ffi=True,
)
CONV_RELU = PackedFunction("vendor_conv2d_relu", VENDOR, doc="relu(conv2d(x, w)), NCHW fp32")

x, w = wildcard(), wildcard()
conv = is_op("relax.nn.conv2d")(x, w)
pattern = is_op("relax.nn.relu")(conv)


def vendor_takes(m) -> bool:
    """What the vendor kernel does: NCHW / OIHW float32, one stride and one padding for both
    axes, no dilation, no groups. Other convolutions stay with TVM."""
    a = m[conv].attrs
    return (str(a.data_layout) == "NCHW" and str(a.kernel_layout) == "OIHW" and int(a.groups) == 1
            and str(m[x].ty.dtype) == "float32"
            and len({int(s) for s in a.strides}) == 1 and len({int(p) for p in a.padding}) == 1
            and all(int(d) == 1 for d in a.dilation))


def stride_and_pad(m):
    a = m[conv].attrs
    return [int(a.strides[0]), int(a.padding[0])]


@I.ir_module
class Model:
    @R.function
    def forward(img: R.Tensor((1, 3, 32, 32), "float32"), w1: R.Tensor((16, 3, 3, 3), "float32"),
                w2: R.Tensor((32, 16, 3, 3), "float32"), w3: R.Tensor((32, 32, 1, 1), "float32")):
        with R.dataflow():
            a = R.nn.relu(R.nn.conv2d(img, w1, padding=1))
            b = R.nn.max_pool2d(a, pool_size=(2, 2), strides=(2, 2))
            c = R.nn.relu(R.nn.conv2d(b, w2, strides=2, padding=1))
            d = R.nn.conv2d(c, w3)  # no ReLU: not the vendor's pattern, TVM lowers it
            R.output(d)
        return d


def main():
    target = tvm.target.Target({"kind": "llvm"})
    report = DispatchReport()
    rule = Rule(pattern=pattern, inputs=(x, w), action=LibraryKernel(CONV_RELU, scalars=stride_and_pad),
                when=vendor_takes, targets=("cpu",), name="conv2d+relu")
    mod = Dispatch([rule], target=target, report=report)(Model)
    mod = relax.transform.LegalizeOps()(mod)
    print(mod["forward"])
    for c in report.calls:
        print(f"{c.rule:12s} -> {c.kernel}: {'replaced' if c.replaced else 'kept'}"
              f" verified={c.verified} max_abs_err={c.max_abs_err:.2g} {c.reason or ''}")

    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in Model["forward"].params]
    outs = []
    for m in (mod, relax.transform.LegalizeOps()(Model)):
        vm = relax.VirtualMachine(tvm.compile(m, target=target), tvm.cpu())
        outs.append(vm["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    err = float(np.abs(outs[0] - outs[1]).max())
    print(f"whole model vs TVM's default build: max abs error {err:.2g}")
    assert len(report.replaced) == 2 and err < 1e-3
    return report, err


if __name__ == "__main__":
    main()
