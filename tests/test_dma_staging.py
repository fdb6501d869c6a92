"""DMA staging: scratchpad tiles that fit, copies tensorized with the template's DMA
intrinsics, and the numbers when nothing fits.

The vta template's runtime is the simulator (a later issue), so its rewrites are checked at
the IR level here: which intrinsics run, what TVM allocates per scratchpad against the
capacity. The one piece of TVM behaviour the staging works around (blockize on a window
copy) is checked numerically on the CPU.
"""

import pytest
from workloads import conv2d, matmul

import tirbyoc
from tirbyoc import RewriteError, tensorize
from tirbyoc.rewrite.block.scratchpad import TileAxis, TileOperand, rank_tiles, scratchpad_usage

VTA = tirbyoc.get_template("vta")
VTA_TILE_DMA = VTA.variant(block_dma=False)  # one DMA per intrinsic tile
VTA_SCOPES = [s.name for s in VTA.scopes if s.bounded]


def staged(func, template=VTA):
    (m,) = [m for m in tirbyoc.match(func, [template]) if m.block in ("C", "conv")][:1]
    return tensorize(func, m, template=template)


def assert_fits(rewritten, template=VTA):
    used = scratchpad_usage(rewritten.func, [s.name for s in template.scopes if s.bounded])
    for scope, n in used.items():
        assert 0 < n <= template.scope(scope).capacity, (scope, n)
    return used


VTA_CASES = {
    "dense 512^3, weights [N, K]": lambda: matmul(512, 512, 512, "int8", "int8", "int32", trans_b=True),
    "dense 100x200x300, weights [K, N], padded": lambda: matmul(100, 200, 300, "int8", "int8", "int32"),
    "batched 3x64x48x80": lambda: matmul(64, 48, 80, "int8", "int8", "int32", batch=3, trans_b=True),
    "conv NHWC 14x14 3x3 (window halo)": lambda: conv2d(1, 64, 14, 14, 64, 3, 3, layout="NHWC",
                                                        dtype="int8", acc="int32"),
    "conv NHWC 28x28 3x3 stride 2": lambda: conv2d(1, 64, 28, 28, 128, 3, 3, layout="NHWC", stride=2,
                                                   dtype="int8", acc="int32"),
}


@pytest.mark.parametrize("case", list(VTA_CASES))
def test_vta_every_copy_is_a_dma_and_every_scratchpad_fits(case):
    r = staged(VTA_CASES[case](), VTA_TILE_DMA)
    assert set(r.intrinsics) == {"vta.gemm_1x16x16", "vta.reset_16", "vta.load_inp_1x16_int8",
                                 "vta.load_wgt_16x16_int8", "vta.store_acc_1x16_int32"}, r.steps
    used = assert_fits(r, VTA_TILE_DMA)
    plan = next(s for s in r.steps if s.startswith("scratchpad tile of"))
    for scope, n in used.items():  # the step reports what TVM allocates
        assert f"{scope} {n}/{VTA.scope(scope).capacity} B" in plan
    assert not any("left as a copy loop" in s for s in r.steps)
    text = r.func.script()
    for scope in VTA_SCOPES:
        assert f'scope="{scope}"' in text


@pytest.mark.parametrize("case", list(VTA_CASES))
def test_vta_copies_each_plain_window_tile_with_one_block_dma(case):
    """Inputs and outputs are windows of their buffers reshaped into the scratchpad: one
    block DMA per scratchpad tile. Weight tiles laid out tile-major are not, and keep their
    16x16 DMA, except where the window already is tile-major."""
    r = staged(VTA_CASES[case]())
    assert {"vta.block_dma_load", "vta.block_dma_store"} <= set(r.intrinsics), r.steps
    assert "vta.load_inp_1x16_int8" not in r.intrinsics and "vta.store_acc_1x16_int32" not in r.intrinsics
    assert any(s.startswith("load A's") and "one block DMA each" in s for s in r.steps)
    assert not any("left as a copy loop" in s for s in r.steps)
    assert_fits(r)


def test_block_dma_runs_bit_exact_and_cuts_the_dma_time():
    """The same conv through both mappings: identical outputs, and the block DMA's load and
    store time a fraction of one DMA per 16-byte row."""
    func = conv2d(1, 64, 30, 30, 64, 3, 3, layout="NHWC", dtype="int8", acc="int32")
    stats = {}
    for template in (VTA_TILE_DMA, VTA):
        out = tirbyoc.offload(func, template)
        assert out.verification.passed is True and out.verification.max_abs_err == 0
        template.activate()
        stats[template] = _simulate(out.func, func, template)
    tile, block = stats[VTA_TILE_DMA], stats[VTA]
    assert block.ops["load"] * 10 < tile.ops["load"] and block.load_bytes == tile.load_bytes
    assert block.busy["load"] * 5 < tile.busy["load"] and block.busy["store"] * 5 < tile.busy["store"]
    assert block.busy["compute"] == tile.busy["compute"] and block.cycles * 5 < tile.cycles
    assert block.utilization["compute"] > 0.5


def _simulate(rewritten, original, template):
    from tirbyoc.offloading.verification import (compile_func, concrete_params, make_inputs,
                                                 run_executable)

    exe = compile_func(rewritten, template.tvm_target(), "rewritten")
    arrays = make_inputs(original, concrete_params(original), None, 0)
    template.simulator.configure()
    run_executable(exe, arrays)
    return template.simulator.stats()


def test_vta_tiles_grow_to_fill_the_scratchpads():
    """512^3 does not fit at once: the plan keeps whole rows of the output in the
    accumulator (128 KiB) and reuses each weight tile across them. Double-buffered input
    tiles get half the input scratchpad each."""
    single = VTA.variant(double_buffer=False)
    r = staged(VTA_CASES["dense 512^3, weights [N, K]"](), single)
    used = assert_fits(r, single)
    assert used["local.acc_buffer"] == 128 * 1024
    assert "local.inp_buffer 32768/32768 B" in " ".join(r.steps)
    assert "local.inp_buffer 16384/16384 B" in " ".join(staged(VTA_CASES["dense 512^3, weights [N, K]"]()).steps)


@pytest.mark.parametrize("func", [
    lambda: matmul(64, 64, 64, "int8", "int8", "int32", trans_b=True),
    lambda: matmul(100, 200, 300, "int8", "int8", "int32"),  # padded, weights [K, N]
    lambda: conv2d(1, 32, 14, 14, 32, 3, 3, layout="NHWC", dtype="int8", wdtype="int8", acc="int32"),  # halo
], ids=["dense", "padded", "conv-halo"])
@pytest.mark.parametrize("template", [VTA, VTA_TILE_DMA], ids=["block-dma", "tile-dma"])
def test_vta_dma_staged_offloads_run_bit_exact_in_the_simulator(func, template):
    out = tirbyoc.offload(func(), template)
    load = "block_dma_load" if template.block_dma else "load_inp"
    assert out.blocks[0].offloaded and any(load in i for i in out.rewrites[0].intrinsics)
    assert out.verification.passed is True and out.verification.max_abs_err == 0


def test_hexagon_vtcm_staging_shares_one_scope():
    from intrinsics.hexagon_hvx import make_template

    t = make_template(vtcm_bytes=64 * 1024)
    f = matmul(256, 256, 512, "uint8", "uint8", "int32", trans_b=True)
    m = next(m for m in tirbyoc.match(f, [t]) if "vtcm" in m.intrinsic.name)
    r = tensorize(f, m, template=t)
    used = assert_fits(r, t)
    assert used["global.vtcm"] > 32 * 1024, "the plan should use most of the 64 KiB"
    assert "hexagon_hvx.vrmpy_32x4_u8u8i32_vtcm" in r.intrinsics


def test_no_tiling_fits_says_so_with_the_numbers():
    from intrinsics.hexagon_hvx import make_template

    t = make_template(vtcm_bytes=256)
    f = matmul(64, 64, 64, "uint8", "uint8", "int32", trans_b=True)
    m = next(m for m in tirbyoc.match(f, [t]) if "vtcm" in m.intrinsic.name)
    with pytest.raises(RewriteError, match=r"no scratchpad tiling fits: global.vtcm needs 384 bytes "
                                           r"for one intrinsic tile of A 4 \+ B 128 \+ C 128 "
                                           r"\(each rounded up to 128-byte alignment\), has 256"):
        tensorize(f, m, template=t)
    # offload falls back from the VTCM match to the next one, which computes in DDR
    out = tirbyoc.offload(f, t, policy=lambda ms: next(m for m in ms if "vtcm" in m.intrinsic.name))
    assert out.blocks[0].offloaded and "_ddr" in out.blocks[0].intrinsic


# --------------------------------------------------------------------- the tile planner
def test_rank_tiles_traffic_is_closed_form():
    """C[i, j] += A[i, k] B[j, k] over 8 x 4 x 4 tiles of 1 x 16 x 16 (VTA's shape)."""
    axes = [TileAxis("i", 1, 8, False), TileAxis("j", 16, 4, False), TileAxis("k", 16, 4, True)]
    ops = [TileOperand("A", "inp", ("i", "k"), "int8", False),
           TileOperand("B", "wgt", ("j", "k"), "int8", False),
           TileOperand("C", "acc", ("i", "j"), "int32", True)]
    big = {"inp": 1 << 20, "wgt": 1 << 20, "acc": 1 << 20}
    best = rank_tiles(axes, ops, big)[0]
    assert best.factors == {"i": 8, "j": 4, "k": 4}  # everything fits: one transfer each
    assert best.bytes_moved == 8 * 64 + 64 * 64 + 8 * 64 * 4 and best.transfers == 3

    small = {"inp": 64, "wgt": 1024, "acc": 1 << 20}
    plans = rank_tiles(axes, ops, small)
    for plan in plans:
        assert all(plan.footprint[s] <= small[s] for s in small)
        f = plan.factors
        spatial = (8 // f["i"]) * (4 // f["j"])
        trips = spatial * (4 // f["k"])
        a = f["i"] * f["k"] * 16
        b = f["j"] * 16 * f["k"] * 16
        c = f["i"] * f["j"] * 16 * 4
        assert plan.bytes_moved == trips * (a + b) + spatial * c
    assert [p.bytes_moved for p in plans] == sorted(p.bytes_moved for p in plans)


# ------------------------------------------- TVM's blockize on a window copy, numerically
def _halo_copy_intrin():
    """A 16-wide global -> global copy, registered once (a stand-in DMA that runs here)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    name = "test_dma_staging.copy16"

    @T.prim_func(s_tir=True)
    def desc(S: T.Buffer((16,), "float32", offset_factor=1), D: T.Buffer((16,), "float32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(S[0:16])
            T.writes(D[0:16])
            for j in range(16):
                with T.sblock("copy"):
                    vj = T.axis.remap("S", [j])
                    D[vj] = S[vj]

    @T.prim_func(s_tir=True)
    def impl(S: T.Buffer((16,), "float32", offset_factor=1), D: T.Buffer((16,), "float32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(S[0:16])
            T.writes(D[0:16])
            for j in T.vectorized(16):
                D[j] = S[j]

    try:
        TensorIntrin.register(name, desc, impl)
    except Exception:  # noqa: BLE001 - registered by an earlier test in this process
        pass
    return name


def test_window_copy_blockize_keeps_the_right_rows():
    """Rows of a 3-tap vertical filter, staged per 4-row tile: the copy reads rows
    tile*4 + r + 0..3 (tiles overlap). TVM 0.27's blockize rewrites that binding wrongly;
    `_blockize_exact` puts it back, and the result matches the untouched function."""
    from tvm.script import tirx as T

    from tirbyoc._tvm import Schedule
    from tirbyoc.rewrite.block.dma import blockize_exact as _blockize_exact

    @T.prim_func(s_tir=True)
    def filt(D: T.Buffer((18, 16), "float32"), W: T.Buffer((3, 16), "float32"), O: T.Buffer((16, 16), "float32")):
        for y, c, r in T.grid(16, 16, 3):
            with T.sblock("O"):
                vy, vc, vr = T.axis.remap("SSR", [y, c, r])
                with T.init():
                    O[vy, vc] = T.float32(0)
                O[vy, vc] = O[vy, vc] + D[vy + vr, vc] * W[vr, vc]

    sch = Schedule(filt)
    blk = sch.get_sblock("O")
    y, c, r = sch.get_loops(blk)
    yo, yi = sch.split(y, [None, 4])
    sch.reorder(yo, r, yi, c)
    stage = sch.cache_read(blk, 0, "global")
    sch.compute_at(stage, r)  # rows yo*4 + r + [0, 4): overlapping windows
    copy_loops = sch.get_loops(stage)
    sch.tensorize(_blockize_exact(sch, copy_loops[-1]), _halo_copy_intrin())
    assert "test_dma_staging.copy16" not in sch.mod.script() and "T.vectorized" in sch.mod.script()
    v = tirbyoc.verify(filt, sch.mod["main"], target={"kind": "llvm"})
    assert v.passed, v.describe()
