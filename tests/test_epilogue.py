"""Fused epilogues (tirbyoc.rewrite.block.epilogue): the elementwise blocks after a core - bias add,
requantization, ReLU - run on the accumulator tile with the template's block ALU and the store
narrows; every result is verified bit-exact in the simulator, the bytes stored drop 4x, the
scratchpad holds no more than the tile (and its bias), and a block that cannot be fused says
why while the rest of the function stays correct."""

import pytest
from tvm import relax

import tirbyoc
from tirbyoc import BlockALU, TemplateError
from tirbyoc.relax.bridge import fuse
from tirbyoc.rewrite.foundation.steps import StepKind

VTA = tirbyoc.get_template("vta")


def requantized_layer(kind: str = "dense", *, bias: bool = True, multiply: bool = False,
                      shared: bool = False):
    """One fused PrimFunc of a VTA-quantized layer: int8 core -> (+ int32 bias) -> + 32 -> >> 6
    -> clip -> ReLU -> int8. ``multiply``: a x3 (no ALU operation of vta's) after the round;
    ``shared``: the core's output is also read by a second block."""
    bb = relax.BlockBuilder()
    if kind == "dense":
        x = relax.Var("x", relax.TensorType([16, 256], "int8"))
        w = relax.Var("w", relax.TensorType([128, 256], "int8"))
        b = relax.Var("b", relax.TensorType([128], "int32"))
    else:
        x = relax.Var("x", relax.TensorType([1, 32, 28, 28], "int8"))
        w = relax.Var("w", relax.TensorType([64, 32, 3, 3], "int8"))
        b = relax.Var("b", relax.TensorType([64, 1, 1], "int32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            if kind == "dense":
                acc = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
            else:
                acc = bb.emit(relax.op.nn.conv2d(x, w, padding=1, out_dtype="int32"))
            y = bb.emit(relax.op.add(acc, b)) if bias else acc
            y = bb.emit(relax.op.add(y, relax.const(32, "int32")))
            if multiply:
                y = bb.emit(relax.op.multiply(y, relax.const(3, "int32")))
            y = bb.emit(relax.op.right_shift(y, relax.const(6, "int32")))
            y = bb.emit(relax.op.nn.relu(relax.op.clip(y, -128, 127)))
            out = bb.emit(relax.op.astype(y, "int8"))
            if shared:
                out = bb.emit(relax.op.add(relax.op.astype(out, "int32"), acc))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    mod = fuse(relax.transform.LegalizeOps()(bb.get()))
    (name,) = [gv.name_hint for gv, f in mod.functions.items() if gv.name_hint.startswith("fused_")]
    return mod[name]


def offload(func, template=VTA):
    out = tirbyoc.offload(func, template)
    assert out.verification.passed is True, out.verification.describe()
    return out, template.simulator.stats()


def epilogue_notes(out) -> list[str]:
    return [str(s) for b in out.blocks for s in b.steps
            if s.kind in (StepKind.EPILOGUE, StepKind.EPILOGUE_LEFT)]


def test_bias_requantize_relu_run_on_the_accumulator_tile_and_the_store_narrows():
    func = requantized_layer("dense")
    fused, stats = offload(func)
    host, host_stats = offload(func, VTA.variant(fused_epilogue=False))
    core = fused.blocks[0]
    assert core.block == "matmul" and "vta.block_alu" in core.intrinsic
    notes = epilogue_notes(fused)
    assert any(n.startswith("fused epilogue on the accumulator tile: T_add (add b") and
               "(shr 6)" in n and "(min 127, max -128)" in n and "(max 0)" in n and
               "(store as int8)" in n for n in notes), notes
    others = [b for b in fused.blocks if b.block != "matmul"]
    assert others and all(b.offloaded and "epilogue of matmul" in b.steps[0] for b in others)
    assert not epilogue_notes(host)
    # 16x128 int8 stored instead of int32, and the tile (plus its bias) is all the
    # accumulator scratchpad holds: the epilogue works in place
    assert stats.store_bytes == 16 * 128 and host_stats.store_bytes == 4 * 16 * 128
    assert stats.high_water["accumulator"] == 16 * 128 * 4 + 128 * 4
    assert stats.load_bytes["accumulator"] == 128 * 4  # the bias, by block DMA
    assert stats.ops["alu"] > host_stats.ops["alu"]


def test_a_convolution_with_a_per_channel_bias_fuses_in_its_own_layout():
    fused, stats = offload(requantized_layer("conv"))
    assert any(n.startswith("fused epilogue") for n in epilogue_notes(fused)), epilogue_notes(fused)
    assert stats.store_bytes == 64 * 28 * 28  # int8


def test_an_operation_the_alu_lacks_ends_the_chain_and_the_rest_stays_on_the_host():
    out, stats = offload(requantized_layer("dense", multiply=True))
    (note,) = [n for n in epilogue_notes(out) if n.startswith("fused")]
    assert "T_add1 (add 32)" in note and "Mul is not an ALU operation of the template" in note
    assert stats.store_bytes == 4 * 16 * 128  # the int32 tile after the round, stored as it is
    kept = [b for b in out.blocks if b.block.startswith(("T_multiply", "T_right_shift"))]
    assert kept and not any(b.offloaded for b in kept)


def test_an_intermediate_another_block_reads_is_not_fused_away():
    out, _ = offload(requantized_layer("dense", shared=True))
    (note,) = epilogue_notes(out)
    assert note.startswith("epilogue left to the host: matmul_intermediate is read by 2 blocks"), note


def test_block_alu_declarations_are_checked():
    with pytest.raises(TemplateError, match="unknown operations \\['mul'\\]"):
        BlockALU("f", "g", "local.acc_buffer", ops=("add", "mul"))
    with pytest.raises(TemplateError, match="not among its ops"):
        BlockALU("f", "g", "local.acc_buffer", ops=("add",), tensor_ops=("max",))
    with pytest.raises(TemplateError, match="block_alu needs a block_dma"):
        tirbyoc.Template(name="alu_only", target={"kind": "llvm"}, runtime="simulator",
                         scopes=VTA.scopes, block_alu=BlockALU("f", "g", "local.acc_buffer"))
    with pytest.raises(TemplateError, match="works in scope 'local.nowhere'"):
        VTA.variant().__class__(**{**_fields(VTA), "block_alu": BlockALU("f", "g", "local.nowhere")})


def _fields(template) -> dict:
    from dataclasses import fields

    return {f.name: getattr(template, f.name) for f in fields(template)}


@pytest.mark.slow  # 36 s: a sweep of whole simulated models (test_sim sweeps in the default run)
def test_a_sweep_over_the_alu_runs_one_model_and_the_fused_point_stores_less():
    from tirbyoc.app.sweeping.sweep import parse_params, sweep

    host, fused = sweep("builtin:mlp_int8", "vta", parse_params(["FUSED_EPILOGUE=false,true"]))
    assert host.verified is True and fused.verified is True, (host.error, fused.error)
    # the same requantized model: the three layers' 16 x (512, 512, 128) outputs leave as int8
    # instead of int32 (the last layer too: its requantization runs before the float output)
    assert host.dma_bytes - fused.dma_bytes == 3 * 16 * (512 + 512 + 128)
    assert fused.cycles < host.cycles


def test_run_reports_where_each_functions_epilogue_runs(capsys):
    import json

    from tirbyoc.app.commands.cli import main

    assert main(["run", "--json", "-q", "-t", "vta"]) == 0  # the built-in quantized MLP
    out = json.loads(capsys.readouterr().out)
    assert out["verified"] is True
    cores = [f for f in out["functions"] if f["macs"]]
    assert len(cores) == 3 and all(f["epilogue"].startswith("fused epilogue on the accumulator tile")
                                   and "(store as int8)" in f["epilogue"] for f in cores), cores
