"""The device records: which device a target's code is, what each says about running here."""

import pytest

from tirbyoc.decl.host import host_target
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


def test_this_cpu_is_built_for_without_the_features_the_machine_hides():
    """LLVM names the host by its CPU model; a virtual machine may hide features of that
    model (a Zen 4 guest without AVX-512 reads as ``znver4``). The host target turns off
    what the kernel does not report, so code built for it runs here, and a target that
    names the model plainly is refused with the features this CPU lacks."""
    import numpy as np

    from tirbyoc._tvm import isa_features, tvm
    from tirbyoc.decl.host import cpuinfo_flags, hidden_features, host_cpu_features
    from tirbyoc.offloading.devices import compile_func
    from tvm.script import tirx as T

    hidden = hidden_features("znver4", ["sse4_1", "sse4_2", "pni", "avx", "avx2", "fma", "bmi1", "sha_ni"])
    assert {"avx512f", "avx512vnni", "avx512bf16"} <= set(hidden)
    assert not {"avx", "avx2", "fma", "sse4.1", "sse3", "bmi", "sha"} & set(hidden)
    if cpuinfo_flags():
        assert isa_features(host_target()) <= host_cpu_features()
        assert not set(hidden_features(str(host_target().attrs["mcpu"]), cpuinfo_flags())) & isa_features(host_target())

    @T.prim_func(s_tir=True)
    def add(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.vectorized(64):
            with T.sblock("b"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi] * T.float32(2)

    exe = compile_func(add, host_target(), "doubling")
    a, b = tvm.runtime.tensor(np.arange(64, dtype="float32")), tvm.runtime.tensor(np.zeros(64, "float32"))
    exe.mod["main"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(64, dtype="float32") * 2)
    plain = tvm.target.Target({"kind": "llvm", "mcpu": str(host_target().attrs["mcpu"])})
    missing = isa_features(plain) - host_cpu_features()
    reason = devices.CPU.cannot_run(add, plain)
    assert (reason is None) == (not missing)
    if missing:
        assert "this CPU lacks" in reason and sorted(missing)[0] in reason


def test_a_reference_build_is_quicker_and_gives_the_same_bits():
    """A reference is built at LLVM -O2 (`devices.reference_target`): the same outputs, bit
    for bit, as TVM's default -O3 on a float matmul with a transcendental epilogue and on an
    int8 one (whose strided reduction -O3 spends seconds vectorizing)."""
    import numpy as np

    from tvm import te

    from tirbyoc._tvm import tvm
    from tirbyoc.offloading.verification import compile_func, concrete_params, make_inputs, run_executable

    assert devices.reference_target().attrs["opt-level"] == devices.REFERENCE_OPT_LEVEL
    assert devices.reference_target({"kind": "llvm", "opt-level": 3}).attrs["opt-level"] == 3
    assert "opt-level" not in devices.reference_target({"kind": "c"}).attrs

    def matmul(dtype, acc):
        a, b = te.placeholder((16, 96), dtype, "a"), te.placeholder((96, 48), dtype, "b")
        k = te.reduce_axis((0, 96), "k")
        c = te.compute((16, 48), lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k))
        out = te.compute((16, 48), lambda i, j: te.exp(c[i, j] * 0.01) if acc == "float32" else c[i, j] >> 3)
        return te.create_prim_func([a, b, out])

    for dtype, acc in (("float32", "float32"), ("int8", "int32")):
        func = matmul(dtype, acc)
        arrays = make_inputs(func, concrete_params(func), None, 0)
        outs = [run_executable(compile_func(func, t, "original"), [x.copy() for x in arrays], tvm.cpu())[-1]
                for t in (host_target(), devices.reference_target())]
        assert np.array_equal(*outs) and np.abs(outs[0]).max() > 0


def test_cheap_frames_are_the_frames_inspect_gives():
    """TVM's CUDA intrinsics are parsed under `cheap_frames` (its import 21 -> 2 s): the frames
    TVMScript reads are inspect's own, and inspect is itself again afterwards."""
    import inspect

    from tirbyoc._tvm import cheap_frames

    def fields(frames):
        return [(f.filename, f.lineno, f.function, f.code_context) for f in frames[:4]]

    real = inspect.stack
    expected = fields(inspect.stack())
    with cheap_frames():
        got = fields(inspect.stack())
        assert inspect.stack is not real
    assert inspect.stack is real
    assert [g[0] for g in got] == [e[0] for e in expected] and got[1:] == expected[1:]
    assert got[0][2] == expected[0][2] == "test_cheap_frames_are_the_frames_inspect_gives"
