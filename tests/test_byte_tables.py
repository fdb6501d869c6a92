"""A QDQ model's elementwise chains from one 8-bit tensor to another, as 256-entry tables
(`tirbyoc.relax.byte_tables`): found where the chain's output depends on one byte alone, left
where it does not, computed by TVM's build of the chain itself, and bit for bit what TVM's build
of the untouched model computes."""

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc._tvm import relax_vm, tvm
from tirbyoc.app.run_target import complete_target
from tirbyoc.relax.bridge import fuse
from tirbyoc.relax.byte_chains import byte_chains
from tirbyoc.relax.byte_tables import byte_tables, table_inputs
from tirbyoc.relax.lookups import LOOKUP_ATTR

HOST = complete_target({"kind": "llvm"})


def gelu_module(out_dtype: str, zero: int):
    """ONNX Runtime's QDQ GELU over ``[n, 64]``: x quantized to ``out_dtype``, then
    x * (erf(x / sqrt 2) + 1) * 0.5 with every step requantized."""
    z = R.const(zero, out_dtype)

    @I.ir_module
    class Gelu:
        @R.function
        def main(x: R.Tensor(("n", 64), "float32")):
            with R.dataflow():
                q = R.quantize(x, R.const(0.04, "float32"), z, out_dtype=out_dtype, axis=1)
                d = R.dequantize(q, R.const(0.04, "float32"), z, out_dtype="float32", axis=1)
                s = R.quantize(R.multiply(d, R.const(0.70710677, "float32")), R.const(0.03, "float32"), z,
                               out_dtype=out_dtype, axis=1)
                e = R.erf(R.dequantize(s, R.const(0.03, "float32"), z, out_dtype="float32", axis=1))
                eq = R.quantize(e, R.const(0.0078431, "float32"), z, out_dtype=out_dtype, axis=1)
                one = R.add(R.dequantize(eq, R.const(0.0078431, "float32"), z, out_dtype="float32", axis=1),
                            R.const(1.0, "float32"))
                g = R.multiply(R.multiply(d, one), R.const(0.5, "float32"))
                y = R.quantize(g, R.const(0.02, "float32"), z, out_dtype=out_dtype, axis=1)
                R.output(y)
            return y

    return Gelu


def _run(mod, x):
    vm = relax_vm(tvm.compile(mod, target=tvm.target.Target(HOST)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("dtype,zero", [("uint8", 128), ("int8", -3)])
def test_a_qdq_gelu_becomes_one_table_lookup_bit_for_bit(dtype, zero):
    """Every step of the chain after the first quantize becomes one lookup; over inputs that
    reach every one of the 256 bytes (and clip at both ends) the output is TVM's, bit for bit."""
    mod = gelu_module(dtype, zero)
    new, report = byte_tables(mod, HOST)
    assert len(report.chains) == 1 and report.chains[0].startswith("q -> y: dequantize")
    assert "erf" in report.chains[0] and "R.erf" not in new["main"].script()
    x = np.linspace(-7, 7, 300 * 64, dtype="float32").reshape(300, 64)
    np.testing.assert_array_equal(_run(new, x), _run(mod, x))


def test_the_table_holds_what_the_chain_computes_at_each_byte():
    """The table's order is the input byte's bits (an int8 -1 is entry 255): the lookup of
    byte ``t`` is entry ``t``, so the table is the chain run over `table_inputs`."""
    inputs = table_inputs("int8", 2)
    assert inputs.shape == (1, 256) and inputs[0, 255] == -1 and inputs[0, 127] == 127
    chain = byte_chains(gelu_module("int8", 0)["main"])[0]
    assert chain.ops[:2] == ["dequantize", "multiply"] and chain.ops[-1] == "quantize"


def _module_with(middle):
    """q -> dequantize -> ``middle(d)`` -> quantize over ``[8, 16]``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    z, s = relax.const(0, "uint8"), relax.const(0.1, "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            q = bb.emit(relax.op.quantize(x, s, z, axis=1, out_dtype="uint8"))
            d = bb.emit(relax.op.dequantize(q, s, z, axis=1, out_dtype="float32"))
            y = bb.emit_output(relax.op.quantize(bb.emit(middle(d)), s, z, axis=1, out_dtype="uint8"))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("middle,why", [
    (lambda d: relax.op.erf(relax.op.multiply(d, relax.const(np.linspace(0, 1, 16, dtype="float32")))),
     "a per-channel constant: the function differs by channel"),
    (lambda d: relax.op.nn.relu(d), "a requantization alone: the write-back computes it in vectors"),
    (lambda d: relax.op.erf(relax.op.add(d, relax.op.sum(d, axis=[1], keepdims=True))),
     "a reduction: an output depends on a whole row"),
])
def test_a_chain_that_is_not_a_function_of_one_byte_or_not_worth_a_table_stays(middle, why):
    mod = _module_with(middle)
    new, report = byte_tables(mod, HOST)
    assert not report.chains, why
    assert new is mod


def test_the_lookup_joins_its_producers_fused_function():
    """TVM's fusion takes a data-dependent load for opaque; the lookup says it is elementwise,
    so it is fused after the quantize that produces its byte (an integer core's write-back
    then computes it)."""
    new, _ = byte_tables(gelu_module("uint8", 128), HOST)
    fused = fuse(relax.transform.LegalizeOps()(new))
    names = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert names == ["fused_quantize_byte_lookup"], names
    lookups = [f for _, f in new.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(lookups) == 1 and LOOKUP_ATTR in lookups[0].attrs


def test_a_target_of_another_machine_leaves_the_model_as_it_is():
    """Hexagon's erf is not this CPU's: its table cannot be computed here."""
    mod = gelu_module("uint8", 128)
    new, report = byte_tables(mod, {"kind": "llvm", "mtriple": "hexagon", "mcpu": "hexagonv66"})
    assert new is mod and "not this machine's" in report.describe()


def softmax_module(dtype: str, zero: int, scale: float = 0.05, axis: int = -1):
    """ONNX Runtime's QDQ softmax over attention scores ``[heads, n, n]`` in ``dtype``."""
    z = R.const(zero, dtype)

    @I.ir_module
    class Softmax:
        @R.function
        def main(x: R.Tensor((2, "n", "n"), "float32")):
            with R.dataflow():
                q = R.quantize(x, R.const(scale, "float32"), z, out_dtype=dtype, axis=1)
                d = R.dequantize(q, R.const(scale, "float32"), z, out_dtype="float32", axis=1)
                p = R.nn.softmax(d, axis=axis)
                y = R.quantize(p, R.const(1 / 255, "float32"), R.const(0, "uint8"), out_dtype="uint8", axis=1)
                R.output(y)
            return y

    return Softmax


@pytest.mark.parametrize("dtype,zero", [("uint8", 131), ("int8", 5)])
def test_a_softmax_of_dequantized_bytes_takes_its_exponentials_from_a_pair_table(dtype, zero):
    """exp(x_j - max x) of bytes is a function of two bytes: the rewritten softmax has no exp
    and computes TVM's values bit for bit, over scores reaching every byte (both clips too),
    rows of one value included."""
    mod = softmax_module(dtype, zero)
    new, report = byte_tables(mod, HOST)
    assert report.softmaxes == ["q -> y"] and not report.chains
    assert "R.exp" not in new["main"].script() and "R.nn.softmax" not in new["main"].script()
    rng = np.random.default_rng(1)
    x = rng.normal(0, 4, (2, 200, 200)).astype("float32")
    x[0, :3] = np.linspace(-20, 20, 600).reshape(3, 200)
    x[1, 7] = 1.25  # one value: every exponential is 1
    np.testing.assert_array_equal(_run(new, x), _run(mod, x))


@pytest.mark.parametrize("scale,axis,why", [(-0.05, -1, "a negative scale: the largest byte is the smallest value"),
                                            (0.05, 1, "another axis than the last")])
def test_a_softmax_the_pair_table_does_not_cover_stays(scale, axis, why):
    mod = softmax_module("uint8", 0, scale, axis)
    new, report = byte_tables(mod, HOST)
    assert not report.softmaxes and new is mod, why


def test_a_table_tvm_cannot_build_leaves_the_chain_as_it_is_with_the_reason(monkeypatch):
    """A clean fallback: the model keeps TVM's own lowering of the chain and the report says
    why there is no table."""
    import tirbyoc.relax.byte_tables as tables

    def refuse(*_args, **_kwargs):
        raise RuntimeError("Check failed: no kernel for this operator")

    monkeypatch.setattr(tables, "run_with_tvm", refuse)
    mod = gelu_module("uint8", 128)
    new, report = byte_tables(mod, HOST)
    assert new is mod and not report.replaced
    assert "could not build the tables" in report.describe() and "no kernel" in report.describe()
