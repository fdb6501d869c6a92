"""Hexagon HVX offloads run under qemu-hexagon and are checked bit-exact against TVM's CPU build.

The emulated tests need Debian's qemu-user, clang-16 and lld-16 (`.ci/run` installs them);
elsewhere they skip with that reason, and the tests of what happens without the tools run
everywhere by hiding them.
"""

import json

import numpy as np
import pytest

import tirbyoc
from tirbyoc._tvm import is_host_target
from tirbyoc.app.commands.cli import main
from tirbyoc.decl import host
from tirbyoc.decl.host import hexagon_emulator_missing
from tirbyoc.offloading import hexagon
from tirbyoc.offloading.selfcheck import tensorize_exact
from tirbyoc.rewrite.block.tensorize import tensorize
from tirbyoc import Intrinsic, Operand, Role
from tirbyoc.offloading.selfcheck import self_check
from tirbyoc_intrinsics.hexagon_hvx import TARGET, dma_load, dmpy_i16, make_template

from workloads import conv2d, matmul

needs_qemu = pytest.mark.skipif(hexagon_emulator_missing() is not None,
                                reason=str(hexagon_emulator_missing()))


def _ran_under_qemu(out):
    v = out.verification
    assert out.offloaded and v.passed is True and v.max_abs_err == 0, v.describe()
    assert v.ran_on == "qemu-hexagon (HVX v66)" and "ran under qemu-hexagon (HVX v66)" in v.describe()


@needs_qemu
@pytest.mark.parametrize("func", [
    matmul(64, 64, 64, "uint8", "int8", "int32", trans_b=True),  # dense: W[N, K]
    matmul(37, 45, 70, "uint8", "int8", "int32", trans_b=True),  # odd sizes: padded
    matmul(50, 33, 29, "uint8", "uint8", "int32"),  # matmul: B[K, N], u8 x u8
    conv2d(1, 19, 9, 9, 40, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32"),
], ids=["dense", "dense-odd", "matmul-u8u8-odd", "conv-nhwc-odd"])
def test_offloads_run_under_qemu_bit_exact(func):
    _ran_under_qemu(tirbyoc.offload(func, "hexagon_hvx"))


@needs_qemu
@pytest.mark.parametrize("func", [
    matmul(40, 70, 30, "int16", "int16", "int32", trans_b=True),  # int16 dmpy
    matmul(33, 50, 21, "uint8", "uint8", "uint32"),  # u8 x u8 -> u32 vrmpy
], ids=["dense-i16", "matmul-u8u8u32"])
def test_int16_and_unsigned_accumulator_shapes_offload(func):
    out = tirbyoc.offload(func, "hexagon_hvx")
    _ran_under_qemu(out)
    want = "dmpy_32x2_i16i16i32" if "int16" in func.script() else "vrmpy_32x4_u8u8u32"
    assert want in out.blocks[0].intrinsic


def _saturating_vdmpy():
    """TVM's own dot_product_32x2_i16i16i32_vdmpy (vdmpyhvsat), declared as tirbyoc would."""
    desc = dmpy_i16().desc

    def build():
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((2,), "int16", offset_factor=1), B: T.Buffer((32, 2), "int16", offset_factor=1),
                 C: T.Buffer((32,), "int32", offset_factor=1)) -> None:
            with T.sblock("root"):
                T.reads(C[0:32], A[0:2], B[0:32, 0:2])
                T.writes(C[0:32])
                a = T.reinterpret(A.vload([0], "int16x2"), dtype="int32")
                b = T.reinterpret(B.vload([0, 0], dtype="int16x64"), dtype="int32x32")
                C[T.ramp(T.int32(0), 1, 32)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.hexagon.V6.vdmpyhvsat.acc.128B"),
                    C[T.ramp(T.int32(0), 1, 32)], T.broadcast(a, 32), b, dtype="int32x32")

        return desc, impl

    return Intrinsic("tvm_vdmpy.sat_32x2", Role.COMPUTE,
                     [Operand("A", (2,), "int16"), Operand("B", (32, 2), "int16"), Operand("C", (32,), "int32")],
                     [("i", 32, "S"), ("k", 2, "R")], build)


@needs_qemu
def test_int16_dmpy_is_exact_where_tvms_vdmpy_saturates():
    """Random full-range data: both agree with the description. Where a sum leaves int32
    ((-32768)^2 + (-32768)^2 = 2^31, or an accumulator near its limit), the description wraps,
    tirbyoc's dmpy wraps with it, and TVM's vdmpyhvsat saturates."""
    assert self_check(dmpy_i16(), TARGET).passed and self_check(_saturating_vdmpy(), TARGET).passed
    a = np.full(2, -32768, np.int16)
    b = np.full((32, 2), -32768, np.int16)
    c = np.zeros(32, np.int32)
    c[1::2] = 2**31 - 5  # + 1 -> overflows
    b[1::2] = [[1, 0]] * 16
    b[1::2, 0] = -1  # a0 * -1 = 32768
    want = (c.astype(np.int64) + (a.astype(np.int64) * b.astype(np.int64)).sum(1)).astype(np.int32)  # wraps
    exact = hexagon.run(dmpy_i16().impl, TARGET, [a, b, c]).arrays[2]
    saturating = hexagon.run(_saturating_vdmpy().impl, TARGET, [a, b, c]).arrays[2]
    assert np.array_equal(exact, want)
    assert (saturating[0::2] == 2**31 - 1).all() and (saturating[1::2] == 2**31 - 1).all()
    assert not np.array_equal(saturating, want)


@needs_qemu
def test_vtcm_variant_runs_and_its_capacity_is_enforced():
    t = make_template(vtcm_bytes=64 * 1024)
    f = matmul(64, 64, 128, "uint8", "uint8", "int32", trans_b=True)
    m = next(m for m in tirbyoc.match(f, [t]) if "vtcm" in m.intrinsic.name)
    g = tensorize(f, m, template=t).func
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, (64, 128), dtype=np.uint8), rng.integers(0, 256, (64, 128), dtype=np.uint8)
    done = hexagon.run(g, TARGET, [a, b, np.zeros((64, 64), "int32")], 64 * 1024)
    assert np.array_equal(done.arrays[2], a.astype(np.int32) @ b.astype(np.int32).T)
    assert 0 < done.vtcm_high_water <= 64 * 1024
    # the same code in a VTCM too small for its plan stops with the numbers, as a crash
    with pytest.raises(hexagon.HexagonRunError, match="VTCM exhausted") as err:
        hexagon.run(g, TARGET, [a, b, np.zeros((64, 64), "int32")], done.vtcm_high_water // 2)
    assert err.value.crashed
    check = tirbyoc.verify(f, g, TARGET, capacities={"global.vtcm": 64 * 1024})
    assert check.passed is True and check.ran_on.startswith("qemu-hexagon")


@needs_qemu
def test_dma_into_vtcm_runs_as_a_checked_copy():
    mod = tensorize_exact(dma_load(128))
    src = np.arange(128, dtype=np.uint8)[::-1].copy()
    done = hexagon.run(mod["main"], TARGET, [src, np.zeros(128, np.uint8)])
    assert np.array_equal(done.arrays[1], src) and done.vtcm_high_water == 128


@needs_qemu
def test_a_wrong_rewrite_is_caught_under_qemu():
    """The emulated check can fail: C = A B^T checked against code computing C = A B."""
    original = matmul(64, 64, 64, "uint8", "uint8", "int32", trans_b=True)
    other = tirbyoc.offload(matmul(64, 64, 64, "uint8", "uint8", "int32"), "hexagon_hvx", verify=False)
    check = tirbyoc.verify(original, other.func, TARGET)
    assert check.passed is False and check.max_abs_err > 0 and check.ran_on


@needs_qemu
def test_run_cnn_int8_is_verified_end_to_end(capsys):
    code = main(["run", "-q", "--json", "-t", "hexagon_hvx", "-m", "builtin:cnn_int8"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verified"] is True and out["not_run"] is None, out["not_run"]
    assert out["coverage"] >= 0.9 and out["max_abs_err"] == 0
    offloaded = [f for f in out["functions"] if f["intrinsics"]]
    assert offloaded and all(f["verified"] is True for f in offloaded)
    emulated = out["emulated"]
    assert emulated["emulator"] == "qemu-hexagon (HVX v66)"
    assert sum(emulated["calls"].values()) == sum(f["calls"] for f in offloaded)
    assert out["target"]["kind"] == "llvm" and "mtriple" not in out["target"]  # the rest: here


def test_without_the_tools_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(host.shutil, "which", lambda prog: None)
    reason = hexagon_emulator_missing()
    assert "apt-get install -y qemu-user clang-16 lld-16" in reason and "qemu-hexagon" in reason
    out = tirbyoc.offload(matmul(64, 64, 64, "uint8", "int8", "int32", trans_b=True), "hexagon_hvx")
    v = out.verification
    assert out.offloaded and v.passed is None and "built for Hexagon only" in v.reason
    assert "apt-get install" in v.describe()
    code = main(["run", "-q", "--json", "-t", "hexagon_hvx", "-m", "builtin:mlp_int8"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["verified"] is None and "apt-get install" in result["not_run"]


def test_newer_dsps_build_only_and_say_why():
    t = make_template(arch="v68")
    out = tirbyoc.offload(matmul(64, 64, 64, "uint8", "int8", "int32", trans_b=True), t)
    v = out.verification
    assert out.offloaded and v.passed is None
    assert "built for Hexagon only" in v.reason and "mcpu=hexagonv68" in v.reason
    with pytest.raises(ValueError, match="unknown Hexagon architecture"):
        make_template(arch="v99")


def test_hexagon_targets_are_not_this_cpu():
    assert not is_host_target(TARGET) and hexagon.is_hexagon(TARGET)
    assert is_host_target({"kind": "llvm"}) and not hexagon.is_hexagon({"kind": "llvm"})
    assert "aborts" in hexagon.cannot_run({"kind": "hexagon", "mcpu": "hexagonv68"})


@needs_qemu
def test_a_sweep_runs_each_variant_for_its_own_dsp():
    """arch changes the target: v66 runs under QEMU and verifies; v68 is built only and says
    so, instead of being run as v66 code."""
    from tirbyoc.app.sweeping.sweep import parse_params, sweep

    v66, v68 = sweep("builtin:mlp_int8", "hexagon_hvx", parse_params(["ARCH=v66,v68"]))
    assert v66.verified is True and v66.coverage == 1.0 and v66.error is None
    assert v68.verified is None and "mcpu=hexagonv68 is built only" in v68.error
