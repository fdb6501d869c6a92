"""Target-specific dispatch of ``concat``: hand-written TIR for one target, a library for another.

`Dispatch` runs before ``LegalizeOps``. For an x86 CPU with AVX-512 (``llvm`` with
``mcpu``), ``R.concat`` becomes a TensorIR PrimFunc written here, called with ``R.call_tir``;
for the plain ``c`` / generic CPU target it becomes the vendor library's ``vendor_concat``
called with ``R.call_dps_packed``. Everything else in the model (the matmul, the ReLU) is
legalized by TVM's default ``LegalizeOps``. Each replacement is verified against TVM's own
concat, and the whole model against TVM's default build.

    python examples/concat_dispatch.py
"""

from pathlib import Path

import numpy as np
import tvm
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc import ExternLibrary, PackedFunction, relax_vm
from tirbyoc.relax import Dispatch, DispatchReport, LibraryKernel, Rule, TIRKernel

LIBRARY = ExternLibrary(name="vendor_concat", sources=[Path(__file__).parent / "csrc" / "vendor_concat.c"],
                        symbols=["vendor_concat"], ffi=True)
VENDOR_CONCAT = PackedFunction("vendor_concat", LIBRARY)


def concat_tir(m):
    """A TensorIR concat along the call's axis for any number of inputs: each output element
    selects its input by comparing the axis index with the running offsets."""
    axis = int(m.attrs.axis) % len(m.inputs[0].ty.shape.values)
    ins = [te.placeholder([int(d) for d in i.ty.shape.values], str(i.ty.dtype), f"in{n}")
           for n, i in enumerate(m.inputs)]
    starts, total = [], 0
    for t in ins:
        starts.append(total)
        total += int(t.shape[axis])
    shape = list(ins[0].shape)
    shape[axis] = total

    def element(*idx):
        value = None
        for t, start in zip(ins, starts):
            at = list(idx)
            at[axis] = idx[axis] - start
            value = t(*at) if value is None else tvm.tirx.if_then_else(idx[axis] >= start, t(*at), value)
        return value

    out = te.compute(shape, element, name="concat")
    return te.create_prim_func(ins + [out])


RULES = [
    # x86 with a named CPU: our TIR kernel
    Rule("relax.concat", TIRKernel(concat_tir, "concat_tir"), name="concat->TIR",
         targets=lambda t: str(t.kind.name) == "llvm" and "mcpu" in t.attrs),
    # any other CPU target: the vendor library (the axis passed as a scalar)
    Rule("relax.concat", LibraryKernel(VENDOR_CONCAT, scalars=lambda m: [
        int(m.attrs.axis) % len(m.inputs[0].ty.shape.values)]), name="concat->library",
        targets=("cpu",)),
]


@I.ir_module
class Model:
    @R.function
    def forward(x: R.Tensor((8, 24), "float32"), y: R.Tensor((8, 40), "float32"),
                w: R.Tensor((64, 16), "float32")):
        with R.dataflow():
            xy = R.concat((x, y), axis=1)
            h = R.nn.relu(R.matmul(xy, w))
            out = R.concat((h, x, h), axis=-1)
            R.output(out)
        return out


def run(target_dict):
    target = tvm.target.Target(target_dict)
    report = DispatchReport()
    with target:
        mod = Dispatch(RULES, report=report)(Model)  # the current target picks the rules
    mod = relax.transform.LegalizeOps()(mod)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in Model["forward"].params]
    outs = []
    for m in (mod, relax.transform.LegalizeOps()(Model)):
        vm = relax_vm(tvm.compile(m, target=target), tvm.cpu())
        outs.append(vm["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    err = float(np.abs(outs[0] - outs[1]).max())
    return mod, report, err


def main():
    results = {}
    for label, tdict in (("x86 (llvm, mcpu)", {"kind": "llvm", "mcpu": "cascadelake"}),
                         ("generic CPU (llvm)", {"kind": "llvm"})):
        if "mcpu" in tdict:
            from tirbyoc.decl.host import host_target_spec

            tdict = dict(tdict, **host_target_spec())  # this machine's CPU, less what it hides
        mod, report, err = run(tdict)
        calls = [c for c in report.calls]
        print(f"== {label}")
        for c in calls:
            print(f"  {c.rule:18s} {c.kernel:14s} {'replaced' if c.replaced else 'kept':8s} "
                  f"verified={c.verified} {c.reason or ''}")
        print(f"  whole model vs TVM's default build: max abs error {err:.2g}")
        results[label] = (report, err)
    return results


if __name__ == "__main__":
    main()
