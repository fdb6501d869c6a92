"""tirbyoc.sim: exact tile arithmetic and the decoupled access-execute timing model, checked
against closed-form counts; and the vta template run end to end through it."""

import json

import numpy as np
import pytest
import tvm

import tirbyoc
from tirbyoc import sim

LAT, BPC = 10, 8


@pytest.fixture
def simulator():
    s = sim.Simulator(sim.SimConfig(core_macs=256, alu_lanes=16, dma_bytes_per_cycle=BPC, dma_latency=LAT))
    s.configure()
    return s


def op(name):
    return tvm.get_global_func(f"tirbyoc.sim.{name}")


def t(array):
    return tvm.runtime.tensor(np.ascontiguousarray(array))


rng = np.random.default_rng(0)


def i8(*shape):
    return rng.integers(-128, 128, shape, dtype="int8")


def test_gemm_only_program(simulator):
    """N GEMMs into one accumulator tile: serialized by the tile, one cycle each."""
    a, b, c = i8(1, 16), i8(16, 16), t(np.zeros((1, 16), "int32"))
    for _ in range(25):
        op("gemm")(c, t(a), t(b))
    np.testing.assert_array_equal(c.numpy(), 25 * (a.astype(np.int32) @ b.T.astype(np.int32)))
    st = simulator.stats()
    assert st.cycles == 25 and st.busy == {"load": 0, "compute": 25, "store": 0}
    assert st.utilization["compute"] == 1.0 and st.ops["gemm"] == 25 and st.macs == 25 * 256


def test_dma_only_program(simulator):
    """N loads of 16x16 int8 tiles: latency + bytes / bandwidth each, one after another."""
    src = i8(64, 64)
    tiles = [t(np.zeros((16, 16), "int8")) for _ in range(4)]
    for n, tile in enumerate(tiles):
        op("dma_load")(tile, t(src[16 * n:16 * n + 16, :16]), 1)
    for n, tile in enumerate(tiles):
        np.testing.assert_array_equal(tile.numpy(), src[16 * n:16 * n + 16, :16])
    st = simulator.stats()
    per = LAT + 256 // BPC
    assert st.cycles == 4 * per and st.busy["load"] == 4 * per
    assert st.load_bytes == {"input": 0, "weight": 4 * 256, "accumulator": 0} and st.ops["load"] == 4


def test_a_load_overlaps_independent_compute_and_waits_for_nothing_else(simulator):
    a, b = t(i8(1, 16)), t(i8(16, 16))
    c = t(np.zeros((1, 16), "int32"))
    op("gemm")(c, a, b)  # compute: cycles 0..1
    op("dma_load")(t(np.zeros((16, 16), "int8")), t(i8(16, 16)), 1)  # load: 0..LAT+32
    assert simulator.stats().cycles == LAT + 32  # overlapped, not 1 + LAT + 32


def test_compute_waits_for_the_load_of_its_operand(simulator):
    a = t(np.zeros((1, 16), "int8"))
    op("dma_load")(a, t(i8(1, 16)), 0)  # LAT + 2 cycles
    op("gemm")(t(np.zeros((1, 16), "int32")), a, t(i8(16, 16)))
    op("dma_load")(a, t(i8(1, 16)), 0)  # must wait until the GEMM has read a (write after read)
    st = simulator.stats()
    assert st.cycles == (LAT + 2) + 1 + (LAT + 2)


def test_store_narrows_and_alu_ops(simulator):
    x = np.array([[300, -5, 70000, -129] * 4], dtype="int32")
    out = t(np.zeros((1, 16), "int8"))
    op("dma_store")(out, t(x), 2)
    np.testing.assert_array_equal(out.numpy(), x.astype(np.int8))  # low bits, as a cast
    z = t(np.zeros((1, 16), "int32"))
    op("alu_shift_clip")(z, t(x), 2, -128, 127)
    np.testing.assert_array_equal(z.numpy(), np.clip(x >> 2, -128, 127))
    op("alu_relu")(z, t(x))
    np.testing.assert_array_equal(z.numpy(), np.maximum(x, 0))
    op("alu_max")(z, t(x), t(-x))
    np.testing.assert_array_equal(z.numpy(), np.abs(x))
    assert simulator.stats().ops == {"gemm": 0, "alu": 3, "load": 0, "store": 1}


def test_block_alu_on_whole_tiles_with_immediates_and_broadcast(simulator):
    """One ALU call per tile (VTA's ALU instruction loops over a tile): immediates, a tensor
    operand broadcast along the dimensions it does not follow, in place, one cycle per 16
    lanes."""
    rng = np.random.default_rng(0)
    x = rng.integers(-2**20, 2**20, (2, 3, 16), dtype=np.int64).astype("int32")
    bias = rng.integers(-1000, 1000, (3,), dtype=np.int64).astype("int32")
    z = t(np.zeros_like(x))
    before = simulator.stats().busy["compute"]
    op("alu_tensor")(z, t(x), t(bias), 0, 1)  # bias follows Z's dimension 1
    np.testing.assert_array_equal(z.numpy(), x + bias[None, :, None])
    assert simulator.stats().busy["compute"] - before == 6  # 96 lanes / 16
    op("alu_imm")(z, z, 0, 1 << 5)  # in place: + round
    op("alu_imm")(z, z, 3, 6)  # >> 6
    op("alu_imm")(z, z, 2, 127)
    op("alu_imm")(z, z, 1, -128)
    want = np.clip((x.astype(np.int64) + bias[None, :, None] + 32) >> 6, -128, 127)
    np.testing.assert_array_equal(z.numpy(), want)
    with pytest.raises(Exception, match="shift by 40"):
        op("alu_imm")(z, z, 3, 40)
    with pytest.raises(Exception, match="does not follow a dimension"):
        op("alu_tensor")(z, t(x), t(bias), 0, 2)


@pytest.mark.parametrize("call, message", [
    (lambda: op("gemm")(t(np.zeros((1, 16), "int32")), t(i8(1, 16))), "expects \\(C, A, B\\)"),
    (lambda: op("gemm")(t(np.zeros((1, 16), "int32")), t(i8(1, 8)), t(i8(16, 16))), "do not chain"),
    (lambda: op("fill_zero")(t(np.zeros(16, "float32"))), "integer tile"),
    (lambda: op("dma_load")(t(np.zeros(16, "int8")), t(i8(16)), 7), "scope 7"),
])
def test_bad_calls_raise_instead_of_corrupting_memory(simulator, call, message):
    with pytest.raises(Exception, match=message):
        call()


def test_config_is_validated():
    with pytest.raises(ValueError, match="dma_bytes_per_cycle must be a positive int"):
        sim.SimConfig(dma_bytes_per_cycle=0)
    with pytest.raises(ValueError, match="capacities"):
        sim.SimConfig(capacities=(1, 2))


def test_vta_offload_runs_bit_exact_in_the_simulator():
    from tirbyoc.testing.workloads import matmul

    vta = tirbyoc.get_template("vta")
    assert vta.runs_here()
    out = tirbyoc.offload(matmul(40, 48, 70, "int8", "int8", "int32", trans_b=True), vta)
    assert out.offloaded and out.verification.passed and out.verification.max_abs_err == 0


def test_run_on_vta_reports_cycles():
    from tirbyoc.app.running.run import run_model

    r = run_model("builtin:cnn_int8", ["vta"], repeat=1)
    assert r.verified is True and r.max_abs_err == 0 and r.report.coverage == 1.0
    st = r.simulation["vta"]
    assert st.cycles > 0 and st.ops["gemm"] > 0 and 0 < st.utilization["compute"] <= 1
    # every GEMM call is one 1x16x16 tile; padding makes the MACs at least the model's
    assert st.macs == 256 * st.ops["gemm"] >= r.report.total_macs
    assert "simulated on vta:" in r.table()
    assert r.to_json()["simulation"]["vta"]["cycles"] == st.cycles


# ------------------------------------------------------------------------ sweep
def test_sweep_table_json_and_plot(tmp_path, capsys):
    from tirbyoc.app.commands.cli import main

    plot = tmp_path / "sweep.png"
    code = main(["sweep", "-q", "-t", "vta", "-p", "BLOCK_OUT=8,16", "-p", "dma_latency=0",
                 "-m", "builtin:cnn_int8", "--json", "--plot", str(plot)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [p["params"] for p in out["points"]] == [
        {"block_out": 8, "dma_latency": 0}, {"block_out": 16, "dma_latency": 0}]
    narrow, wide = out["points"]
    assert narrow["verified"] and wide["verified"] and narrow["coverage"] == wide["coverage"] == 1.0
    assert narrow["cycles"] > wide["cycles"] > 0  # a wider core takes fewer cycles
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_rows_do_not_depend_on_the_rest_of_the_grid():
    """A grid point's row is the same alone, after another point and before it: variants
    share the simulator library, so each must configure it with its own capacities."""
    from tirbyoc.app.sweeping.sweep import parse_params, sweep

    def rows(spec):
        pts = sweep("builtin:cnn_int8", "vta", parse_params([spec]))
        return {p.params["acc_kib"]: (p.coverage, p.cycles, p.verified, p.error) for p in pts}

    alone = rows("ACC_KIB=128")
    up, down = rows("ACC_KIB=64,128"), rows("ACC_KIB=128,64")
    assert alone[128][0] == 1.0 and alone[128][2] is True
    assert up[128] == down[128] == alone[128]
    assert up[64] == down[64]


def test_sweep_in_worker_processes_gives_the_serial_rows():
    """--jobs 2: each point in a process of its own, the rows as a serial sweep gives them,
    in grid order."""
    from tirbyoc.app.sweeping.sweep import parse_params, sweep

    grid = parse_params(["BLOCK_OUT=8,16"])
    serial = sweep("builtin:cnn_int8", "vta", grid)
    parallel = sweep("builtin:cnn_int8", "vta", grid, jobs=2)
    assert [p.params for p in parallel] == [{"block_out": 8}, {"block_out": 16}]
    assert [(p.coverage, p.cycles, p.utilization, p.verified, p.error) for p in parallel] == \
        [(p.coverage, p.cycles, p.utilization, p.verified, p.error) for p in serial]
    assert all(p.verified for p in parallel)
    with pytest.raises(tirbyoc.TirbyocError, match="not the registered template"):
        sweep("builtin:cnn_int8", tirbyoc.get_template("vta").variant(block_out=8), grid, jobs=2)


def test_sweep_reports_invalid_points_and_rejects_unknown_parameters():
    from tirbyoc.errors import TirbyocError
    from tirbyoc.app.sweeping.sweep import parse_params, sweep, table

    points = sweep("builtin:mlp_int8", "vta", parse_params(["block_out=0"]))
    assert points[0].error and "block_out must be a positive int" in points[0].error
    assert "block_out must be a positive int" in " ".join(table(points).split())  # wrapped
    with pytest.raises(TirbyocError, match="no parameter 'block_size'"):
        sweep("builtin:mlp_int8", "vta", parse_params(["BLOCK_SIZE=8"]))
    with pytest.raises(TirbyocError, match="NAME=V1,V2"):
        parse_params(["BLOCK_OUT"])
    # switches are booleans: "false" must not switch anything on
    assert parse_params(["DOUBLE_BUFFER=true,False"]) == {"double_buffer": [True, False]}
    points = sweep("builtin:mlp_int8", "vta", parse_params(["double_buffer=no"]))
    assert points[0].error and "double_buffer must be true or false, got 'no'" in points[0].error


def test_programs_report_scratchpad_high_water_and_fail_past_a_capacity():
    from tirbyoc.decl.host import host_target
    from tirbyoc.offloading.verification import compile_func as _compile
    from tirbyoc.testing.workloads import matmul

    vta = tirbyoc.get_template("vta")
    out = tirbyoc.offload(matmul(64, 64, 64, "int8", "int8", "int32", trans_b=True), vta, verify=False)
    assert 'T.call_packed("tirbyoc.sim.scratchpad_begin"' in out.func.script()
    run = _compile(out.func, host_target(), "offloaded")
    args = [t(np.zeros((64, 64), "int8")), t(np.zeros((64, 64), "int8")), t(np.zeros((64, 64), "int32"))]
    vta.simulator.configure()
    run(*args)
    run(*args)  # sequential programs release what they held
    assert vta.simulator.stats().high_water == {"input": 64 * 64, "weight": 64 * 64, "accumulator": 64 * 64 * 4}
    small = sim.Simulator(sim.SimConfig(capacities=(1024, 262144, 131072), scopes=vta.simulator.config.scopes))
    small.configure()
    with pytest.raises(Exception, match="input scratchpad would hold 4096 bytes .* over its capacity of 1024"):
        run(*args)


@pytest.mark.slow
def test_readme_sweep_gives_the_same_rows_in_both_grid_orders():
    """README's grid, forwards and backwards: each point's coverage, cycles and verdict agree
    (the end of every offloaded PrimFunc is a barrier, so host address reuse by earlier
    points cannot shift a dependence)."""
    from tirbyoc.app.sweeping.sweep import parse_params, sweep

    def rows(specs):
        return {(p.params["block_out"], p.params["acc_kib"]): (p.coverage, p.cycles, p.verified, p.error)
                for p in sweep("builtin:cnn_int8", "vta", parse_params(specs))}

    forwards = rows(["BLOCK_OUT=8,16,32", "ACC_KIB=64,128"])
    backwards = rows(["ACC_KIB=128,64", "BLOCK_OUT=32,16,8"])
    assert forwards == backwards and len(forwards) == 6
    assert all(v[2] is True for v in forwards.values())


# ------------------------------------------------------------------ block DMA (whole tiles)
def view(array):
    """A DLTensor view sharing ``array``'s memory (strides included)."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(array)


def test_block_dma_costs_one_descriptor_per_2d_block(simulator):
    """A window of 3 x 5 runs of 32 contiguous bytes at two strides: 3 descriptors (one per
    2-D block of 5 rows), all bytes at the DMA's bandwidth; copied element for element."""
    dram = i8(4, 8, 64)
    spad = np.zeros((3, 5, 2, 16), "int8")  # the scratchpad tile, as intrinsic tiles of 16
    op("dma_load")(view(spad), view(dram[1:4, 2:7, :32]), 0)
    np.testing.assert_array_equal(spad.reshape(3, 5, 32), dram[1:4, 2:7, :32])
    st = simulator.stats()
    assert st.busy["load"] == 3 * LAT + 3 * 5 * 32 // BPC and st.load_bytes["input"] == 480
    # whole pixels: the 5 rows of 64 bytes are one contiguous run, 3 of them at a stride: one
    op("dma_load")(view(np.zeros((3, 5, 64), "int8")), view(dram[1:4, 2:7, :]), 0)
    assert simulator.stats().busy["load"] == st.busy["load"] + LAT + 960 // BPC


def test_a_gemm_waits_for_the_block_dma_that_wrote_its_tile(simulator):
    """Dependences are tracked per granule of scratchpad: a GEMM reading one intrinsic tile
    inside a whole-tile load waits for that load, and the next load into the tile waits for
    the GEMM (write after read)."""
    spad = np.zeros((8, 16), "int8")
    op("dma_load")(view(spad), view(i8(8, 16)), 0)  # LAT + 16 cycles
    op("gemm")(t(np.zeros((1, 16), "int32")), view(spad[5:6]), t(i8(16, 16)))  # reads row 5
    op("dma_load")(view(spad), view(i8(8, 16)), 0)
    st = simulator.stats()
    assert st.cycles == (LAT + 16) + 1 + (LAT + 16)


def test_block_dma_store_narrows_a_strided_window(simulator):
    acc = rng.integers(-(2**31), 2**31 - 1, (2, 3, 16), dtype="int32")
    out = np.zeros((6, 8, 16), "int8")
    op("dma_store")(view(out[1:3, 4:7, :]), view(acc), 2)
    np.testing.assert_array_equal(out[1:3, 4:7, :], acc.astype("int8"))
    assert not out[0].any() and not out[3:].any()
    # the DRAM side: 2 rows of 3 x 16 contiguous bytes at a stride of 128, one 2-D block
    assert simulator.stats().busy["store"] == LAT + 2 * 3 * 16 // BPC
