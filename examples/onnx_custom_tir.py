"""A custom TensorIR operator inside an ONNX-imported graph, called with ``R.call_tir``.

An attention-like ONNX model (MatMul -> Softmax -> MatMul) is written with ``onnx.helper``,
imported with TVM's Relax ONNX frontend, and its ``softmax`` is replaced by our own TensorIR
kernel (three blocks: row max, sum of exponentials, normalise) through a `Dispatch` rule; the
matmuls are then offloaded to the ``blas`` template with `OffloadTIR`. The result is compared
with TVM's default build of the same ONNX file.

    python examples/onnx_custom_tir.py [out.onnx]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tirbyoc import import_onnx, relax_vm
from tirbyoc.relax import Dispatch, DispatchReport, OffloadReport, OffloadTIR, Rule, TIRKernel


def write_model(path: Path, seq: int = 64, dim: int = 32) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    k = numpy_helper.from_array(rng.standard_normal((dim, seq)).astype("float32"), "K")
    v = numpy_helper.from_array(rng.standard_normal((seq, dim)).astype("float32"), "V")
    nodes = [helper.make_node("MatMul", ["q", "K"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "V"], ["out"])]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("q", TensorProto.FLOAT, [seq, dim])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [seq, dim])], [k, v])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def softmax_rows(m):
    """Our softmax over the last axis of a 2-D float32 tensor, written in TVMScript."""
    from tvm.script import tirx as T

    rows, cols = (int(d) for d in m.inputs[0].ty.shape.values)

    @T.prim_func(s_tir=True)
    def softmax(x: T.Buffer((rows, cols), "float32"), y: T.Buffer((rows, cols), "float32")):
        row_max = T.sblock_alloc_buffer((rows,), "float32")
        row_sum = T.sblock_alloc_buffer((rows,), "float32")
        for i, j in T.grid(rows, cols):
            with T.sblock("row_max"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    row_max[vi] = T.float32(-3.4e38)
                row_max[vi] = T.max(row_max[vi], x[vi, vj])
        for i, j in T.grid(rows, cols):
            with T.sblock("row_sum"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    row_sum[vi] = T.float32(0)
                row_sum[vi] = row_sum[vi] + T.exp(x[vi, vj] - row_max[vi])
        for i, j in T.grid(rows, cols):
            with T.sblock("normalise"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.exp(x[vi, vj] - row_max[vi]) / row_sum[vi]

    return softmax


RULE = Rule("relax.nn.softmax", TIRKernel(softmax_rows, "softmax_rows"), name="softmax->our TIR",
            when=lambda m: len(m.inputs[0].ty.shape.values) == 2 and int(m.attrs.axis) in (-1, 1)
            and str(m.inputs[0].ty.dtype) == "float32")


def main(path=None):
    path = Path(path) if path else Path(tempfile.mkdtemp()) / "attention.onnx"
    write_model(path)
    original = import_onnx(path)
    target = tvm.target.Target({"kind": "llvm"})
    dispatched, offloaded = DispatchReport(), OffloadReport()
    mod = Dispatch([RULE], target=target, report=dispatched)(original)
    mod = relax.transform.LegalizeOps()(mod)
    mod = OffloadTIR(["blas"], report=offloaded)(mod)
    print(mod["main"])
    for c in dispatched.calls:
        print(f"{c.rule}: {'replaced' if c.replaced else 'kept'}, verified={c.verified} {c.reason or ''}")
    print(f"MAC coverage on blas: {offloaded.coverage:.0%}")
    q = np.random.default_rng(1).standard_normal((64, 32)).astype("float32")
    outs = [relax_vm(tvm.compile(m, target=target), tvm.cpu())["main"](tvm.runtime.tensor(q)).numpy()
            for m in (mod, relax.transform.LegalizeOps()(original))]
    err = float(np.abs(outs[0] - outs[1]).max())
    print(f"vs TVM's default build of the ONNX file: max abs error {err:.2g}")
    return dispatched, offloaded, err


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
