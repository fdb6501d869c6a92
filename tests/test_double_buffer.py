"""Double buffering of scratchpad tiles (tirbyoc.rewrite.functions.double_buffer): loads overlap the
GEMMs only where the program's dependences allow it, results stay bit-exact, and the
scratchpad footprint the simulator checks is that of the code that runs."""

import numpy as np
import pytest
import tvm
from workloads import matmul

import tirbyoc
from tirbyoc import sim
from tirbyoc.decl.host import host_target
from tirbyoc.offloading.verification import compile_func
from tirbyoc.rewrite.functions.double_buffer import ATTR
from tirbyoc.rewrite.foundation.steps import StepKind

LAT, BPC = 10, 8
VTA = tirbyoc.get_template("vta")


def small_vta(double_buffer: bool):
    """Scratchpads small enough that a 64x128x1024 GEMM streams 16 input and weight tiles."""
    return VTA.variant(inp_kib=8, wgt_kib=32, acc_kib=16, double_buffer=double_buffer)


def t(array):
    return tvm.runtime.tensor(np.ascontiguousarray(array))


def test_alternating_tiles_let_the_next_load_overlap_the_gemm():
    """The timing model itself, in closed form: a load into the tile a GEMM is reading waits
    for the GEMM (write after read); a load into the other version does not."""
    s = sim.Simulator(sim.SimConfig(core_macs=16, alu_lanes=16, dma_bytes_per_cycle=BPC, dma_latency=LAT))
    s.configure()  # loads the simulator
    gemm, load = tvm.get_global_func("tirbyoc.sim.gemm"), tvm.get_global_func("tirbyoc.sim.dma_load")
    weights = np.ones((16, 16), "int8")
    load_cycles, gemm_cycles = LAT + 256 // BPC, 256 // 16

    def program(versions: int) -> int:
        s.configure()
        tiles = [t(np.zeros((16, 16), "int8")) for _ in range(versions)]
        acc = t(np.zeros((1, 16), "int32"))
        for i in range(4):
            tile = tiles[i % versions]
            load(tile, t(weights), 1)
            gemm(acc, t(np.ones((1, 16), "int8")), tile)
        np.testing.assert_array_equal(acc.numpy(), np.full((1, 16), 4 * 16))
        return s.stats().cycles

    assert program(1) == 4 * (load_cycles + gemm_cycles)  # each load waits for the GEMM before
    assert program(2) == 4 * load_cycles + gemm_cycles  # loads back to back, the GEMMs hidden


def test_double_buffered_tiles_overlap_loads_and_stay_bit_exact():
    f = matmul(64, 128, 1024, "int8", "int8", "int32", trans_b=True)
    stats = {}
    for double in (False, True):
        template = small_vta(double)
        out = tirbyoc.offload(f, template)
        assert out.verification.passed is True, out.verification.describe()
        assert (ATTR in out.func.attrs) is double
        said = [s for s in out.blocks[0].steps if s.kind is StepKind.DOUBLE_BUFFER]
        assert bool(said) is double and (not said or "local.inp_buffer, local.wgt_buffer" in said[0])
        stats[double] = template.simulator.stats()
    single, double = stats[False], stats[True]
    # the planner gave each version half the input and weight scratchpads: as many bytes held
    assert double.high_water == single.high_water == {"input": 8192, "weight": 8192, "accumulator": 16384}
    assert double.load_bytes == single.load_bytes and double.macs == single.macs
    assert double.cycles < 0.7 * single.cycles
    assert double.utilization["compute"] > single.utilization["compute"] + 0.2


def test_a_tile_loaded_once_is_not_versioned():
    """One input tile for the whole loop (64x64x64 fits at once): nothing to overlap, so the
    footprint stays one tile."""
    template = small_vta(True)
    out = tirbyoc.offload(matmul(64, 64, 64, "int8", "int8", "int32", trans_b=True), template)
    assert out.verification.passed is True
    run = compile_func(out.func, host_target(), "offloaded")
    template.simulator.configure()
    run(t(np.ones((64, 64), "int8")), t(np.ones((64, 64), "int8")), t(np.zeros((64, 64), "int32")))
    assert template.simulator.stats().high_water["input"] == 64 * 64


def _first_iteration_only(func, block_name: str):
    """``func`` with ``block_name``'s body run only in the first iteration of the loop over
    tiles around it: later iterations read the tile an earlier one loaded."""
    from tirbyoc._tvm import s_tir, tirx, tvm_ffi

    loops = []
    tvm_ffi.structural_walk(func.body, (tirx.For, loops.append), order="pre")
    tile_loop = next(f for f in loops if int(f.extent) == 16)

    def guard(block):
        if block.name_hint != block_name:
            return block
        body = tirx.IfThenElse(tile_loop.loop_var == 0, block.body, None)
        return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                            block.init, block.alloc_buffers, block.match_buffers, block.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlock, guard)]))


def test_a_tile_later_iterations_read_without_reloading_keeps_one_version():
    """Versioning is refused where an iteration reads what an earlier one loaded (the loop
    body does not begin by loading the whole tile): the code computes what it computed
    unmarked, in one tile. Unguarded, the same function is versioned (the control)."""
    template = small_vta(True)
    out = tirbyoc.offload(matmul(64, 128, 1024, "int8", "int8", "int32", trans_b=True), template)
    rng = np.random.default_rng(0)
    a, b = rng.integers(-128, 128, (64, 1024), dtype="int8"), rng.integers(-128, 128, (128, 1024), dtype="int8")

    def run(func):
        exe = compile_func(func, host_target(), "offloaded")
        template.simulator.configure()
        c = t(np.zeros((64, 128), "int32"))
        exe(t(a), t(b), c)
        return c.numpy(), template.simulator.stats().high_water["input"]

    assert run(out.func)[1] == 2 * run(out.func.without_attr(ATTR))[1] == 8192
    guarded = _first_iteration_only(out.func, "A_local.inp_buffer_dma")
    (marked, marked_bytes), (plain, plain_bytes) = run(guarded), run(guarded.without_attr(ATTR))
    np.testing.assert_array_equal(marked, plain)
    assert marked_bytes == plain_bytes == 4096


def test_the_template_declares_which_scopes_double_buffer():
    assert VTA.block_dma.double_buffer == ("local.inp_buffer", "local.wgt_buffer")
    assert VTA.variant(double_buffer=False).block_dma.double_buffer == ()
    from tirbyoc import BlockDMA
    from tirbyoc.errors import TemplateError

    with pytest.raises(TemplateError, match="tuple of scope names"):
        BlockDMA("a", "b", double_buffer="local.inp_buffer")
