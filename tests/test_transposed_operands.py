"""A matmul of a run-time operand transposed just for it reads the operand where it lies
(`tirbyoc.relax.transposed_operands`): a decoder's ``q . k^T`` and an encoder's head split as one
PrimFunc each, bit for bit what TVM's build of the untouched graph computes at run-time sizes,
offloaded whole; left alone where the leading axes broadcast, the operand is an integer one, or
nothing is transposed."""

import numpy as np
import pytest
from cpu_templates import runnable
from tvm import relax
import tirbyoc
from tirbyoc._tvm import relax_vm, tirx, tvm
from tirbyoc.relax.bridge import fuse
from tirbyoc.relax.transposed_operands import transposed_in_place


def attention_scores(perm=(0, 1, 3, 2), k_shape=("b", 4, "s", 16), dtype="float32", also_read=False):
    """``matmul(q, permute_dims(k, perm)) * 0.25`` with ``q`` of ``[b, 4, s, 16]`` (``b``, ``s``
    run-time); ``also_read``: the transposed keys are an output too."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    dims = {"b": b, "s": s}
    q = relax.Var("q", relax.TensorType([b, 4, s, 16], dtype))
    k = relax.Var("k", relax.TensorType([dims.get(d, d) for d in k_shape], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, list(perm)))
            y = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)), relax.const(0.25, dtype)))
            out = bb.emit_output(relax.Tuple([y, kt]) if also_read else relax.Tuple([y]))
        bb.emit_func_output(out)
    return bb.get()


def _built(mod):
    return relax_vm(tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm"), tvm.cpu())


def _outputs(vm, arrays):
    got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [got.numpy()] if hasattr(got, "numpy") else [x.numpy() for x in got]


@pytest.mark.parametrize("also_read", [False, True])
def test_keys_read_in_place_compute_what_tvm_computed_bit_for_bit(also_read):
    mod = attention_scores(also_read=also_read)
    new, report = transposed_in_place(mod)
    assert report.rewritten == 1 and "in place of its transpose" in report.describe()
    text = new.script()
    assert "R.matmul" not in text and "matmul_in_place" in text
    assert ("R.permute_dims" in text) == also_read  # a transpose nobody else reads is dropped
    before, after = _built(mod), _built(new)
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 7), (3, 33)):
        arrays = [rng.standard_normal((b, 4, s, 16)).astype("float32") for _ in range(2)]
        for x, y in zip(_outputs(before, arrays), _outputs(after, arrays)):
            assert np.array_equal(x, y)


def encoder_heads():
    """BERT's attention on ``[b, s, 4 heads, 16]`` projections: ``q`` and ``v`` transposed to
    ``[b, 4, s, 16]``, ``k`` to ``[b, 4, 16, s]``, then ``(q . k) . v``."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([b, s, 4, 16], "float32")) for n in "qkv")
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            qt, vt = (bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3])) for x in (q, v))
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 3, 1]))
            scores = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(qt, kt)), relax.const(0.25, "float32")))
            out = bb.emit_output(bb.emit(relax.op.matmul(scores, vt)))
        bb.emit_func_output(out)
    return bb.get()


def test_an_encoders_head_split_is_read_in_place_by_both_matmuls():
    mod = encoder_heads()
    new, report = transposed_in_place(mod)
    assert report.rewritten == 2 and "R.permute_dims" not in new.script()
    before, after = _built(mod), _built(new)
    rng = np.random.default_rng(1)
    for b, s in ((1, 5), (2, 17)):
        arrays = [rng.standard_normal((b, s, 4, 16)).astype("float32") for _ in range(3)]
        assert np.array_equal(_outputs(before, arrays)[0], _outputs(after, arrays)[0])


@pytest.mark.parametrize("case, kwargs", [
    ("nothing transposed", {"perm": (0, 1, 2, 3), "k_shape": ("b", 4, 16, "s")}),
    ("keys broadcast over the batch", {"k_shape": (4, "s", 16), "perm": (0, 2, 1)}),
    ("integer operands", {"dtype": "int32"}),
])
def test_left_alone(case, kwargs):
    mod = attention_scores(**kwargs)
    new, report = transposed_in_place(mod)
    assert report.rewritten == 0 and new is mod, case


@pytest.mark.parametrize("model", [attention_scores, encoder_heads])
def test_the_matmuls_are_offloaded_whole_with_the_operands_staged_by_the_core(model):
    runnable("x86_fp32_avx2")
    new, report = transposed_in_place(model())
    fused = fuse(relax.transform.LegalizeOps()(new))
    funcs = [f for gv, f in fused.functions.items() if "matmul_in_place" in gv.name_hint]
    assert len(funcs) == report.rewritten
    for func in funcs:
        out = tirbyoc.offload(func.with_attr("global_symbol", "main"), "x86_fp32_avx2")
        (core,) = out.offloaded  # symbolic extents: MACs are counted at a model's sizes, not here
        assert out.verification.passed and "checked with b = s = 1, 7, 16, 17" in out.verification.reason
        assert any("register-blocked" in str(s) for s in core.steps)
