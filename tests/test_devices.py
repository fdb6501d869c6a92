"""The device records: which device a target's code is, what each says about running here."""

import pytest

from tirbyoc._tvm import host_target
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading import devices
from tirbyoc.offloading.devices import CPU, CUDA, FOREIGN, HEXAGON, Device, device_of

HEXAGON_TARGET = {"kind": "llvm", "mtriple": "hexagon", "mcpu": "hexagonv66", "mattr": ["+hvx-length128b"]}


@pytest.mark.parametrize("target,device", [
    ({"kind": "llvm"}, CPU),
    ({"kind": "c"}, CPU),
    ({"kind": "cuda", "arch": "sm_80"}, CUDA),
    (HEXAGON_TARGET, HEXAGON),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, FOREIGN),
])
def test_each_target_is_one_devices_code(target, device):
    assert device_of(target) is device


def test_an_emulated_device_runs_the_model_on_this_cpu_and_is_not_timed():
    assert HEXAGON.emulated and HEXAGON.on_this_cpu
    assert str(HEXAGON.model_target(HEXAGON_TARGET).kind.name) == "llvm"
    assert HEXAGON.model_target(HEXAGON_TARGET).attrs.get("mtriple") in (None, host_target().attrs.get("mtriple"))
    assert HEXAGON.emulator_name(HEXAGON_TARGET) == "qemu-hexagon (HVX v66)"
    assert not CPU.emulated and CPU.model_target({"kind": "llvm"}).kind.name == "llvm"


def test_foreign_code_is_refused_with_what_it_is():
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    assert FOREIGN.unavailable(target) == "llvm code for aarch64-linux-gnu cannot run on this machine"
    assert not FOREIGN.on_this_cpu


def test_cuda_says_why_it_cannot_run_here_and_what_to_do():
    if CUDA.unavailable({"kind": "cuda"}) is None:
        pytest.skip("a CUDA GPU is here")
    assert CUDA.unavailable({"kind": "cuda"}) == "this machine has no CUDA device"
    assert "tirbyoc match" in CUDA.advice and not CUDA.on_this_cpu


def test_a_new_device_is_registered_before_the_catch_all():
    vendor = Device("vendor", lambda t: str(t.attrs.get("mtriple")) == "riscv64-unknown-elf",
                    lambda f, t: "no board", lambda *a: None, on_this_cpu=False)
    devices.register_device(vendor)
    try:
        assert device_of({"kind": "llvm", "mtriple": "riscv64-unknown-elf"}) is vendor
        assert devices.DEVICES[-1] is FOREIGN
        with pytest.raises(TirbyocError, match="'vendor' is registered already"):
            devices.register_device(vendor)
    finally:
        devices.DEVICES.remove(vendor)
