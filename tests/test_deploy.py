"""`tirbyoc build`: the library it writes runs in a process that cannot import tirbyoc, from
another folder, and gives the output the offloaded model gives in this process."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from workloads import matmul

import tirbyoc
from tirbyoc.app.building.deploy import build_library, export_module
from tirbyoc.decl.host import hexagon_emulator_missing
from tirbyoc.errors import TirbyocError

RUNNER = Path(tirbyoc.__file__).parent / "app" / "building" / "runner.py"

# A process with TVM but no tirbyoc: importing it (or OpenBLAS's Python package) fails.
FRESH = """
import sys
sys.modules["tirbyoc"] = None
sys.modules["scipy_openblas32"] = None
sys.path.insert(0, sys.argv[1])
import numpy as np
import runner
outs = runner.run(sys.argv[2], [np.load(sys.argv[3])], sys.argv[4])
np.save(sys.argv[5], outs[0])
assert not any(m == "tirbyoc" or m.startswith("tirbyoc.") for m in sys.modules if sys.modules[m] is not None)
"""


def run_fresh(built, tmp_path: Path) -> np.ndarray:
    """Move the library (and what ships with it) to a new folder, run it in a fresh process
    with a copy of the runner, return its output."""
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in [built.path, built.path.with_suffix(".json"), *built.shipped]:
        shutil.copy2(f, moved / Path(f).name)
    shutil.copy2(RUNNER, moved / "runner.py")
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, built.sample_inputs[0])
    proc = subprocess.run([sys.executable, "-c", FRESH, str(moved), str(moved / built.path.name), str(x),
                           built.entry, str(y)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(y)


def check(built, tmp_path):
    assert built.report.offloaded_macs > 0
    assert all(f.verified is not False for f in built.report.functions)
    out = run_fresh(built, tmp_path)
    assert out.shape == built.output.shape
    np.testing.assert_array_equal(out, built.output)  # the same code on the same inputs
    manifest = json.loads(built.path.with_suffix(".json").read_text())
    assert manifest["entry"] == built.entry and [i["name"] for i in manifest["inputs"]] == ["x"]


def test_blas_whole_calls_are_linked_and_registered_on_load(tmp_path):
    built = build_library("builtin:mlp", ["blas"], output=tmp_path / "out" / "mlp.so")
    assert built.linked == ["tirbyoc_blas_packed"]
    assert [p.name for p in built.shipped] == ["libscipy_openblas.so"]
    assert len(built.inputs) == 1  # the weights are constants inside
    check(built, tmp_path)


def test_blas_extern_calls_inside_primfuncs_are_linked(tmp_path):
    built = build_library("builtin:mlp", ["blas"], output=tmp_path / "out" / "mlp.so", whole_calls=False)
    assert built.linked == ["tirbyoc_blas_shim"]
    check(built, tmp_path)


def test_vta_model_carries_its_simulator(tmp_path):
    built = build_library("builtin:cnn_int8", ["vta"], output=tmp_path / "out" / "cnn.so")
    assert built.linked == ["tirbyoc_accel_sim"] and not built.shipped
    assert built.report.offloaded_macs == built.report.total_macs
    check(built, tmp_path)


@pytest.mark.parametrize("template", ["x86_vnni", "x86_vnni_emulated"])
def test_x86_vnni_int8_model(tmp_path, template):
    vnni = tirbyoc.get_template(template)
    if not vnni.runs_here():
        pytest.skip(f"{template} cannot run here: {vnni.unavailable_reason()}")
    built = build_library("builtin:mlp_int8", [template], output=tmp_path / "out" / "mlp.so")
    assert built.linked == []
    assert built.to_json()["emulates"] == ({template: vnni.emulates} if vnni.emulates else {})
    check(built, tmp_path)


def test_onnx_model_with_blas_through_the_command_line(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.uniform(-0.1, 0.1, (64, 48)).astype("float32"), "w1")
    w2 = numpy_helper.from_array(rng.uniform(-0.1, 0.1, (48, 16)).astype("float32"), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], [w1, w2])
    model = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    out = tmp_path / "dist" / "two.so"
    proc = subprocess.run([sys.executable, "-m", "tirbyoc", "build", "-q", "-t", "blas", "-m", str(model),
                           "-o", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 of 2 offloaded functions verified" in proc.stdout and "ships with" in proc.stdout
    x = rng.uniform(-1, 1, (8, 64)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    run = subprocess.run([sys.executable, "-m", "tirbyoc.app.building.runner", str(out), "--input", "x.npy",
                          "--output", "y.npy"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    want = np.maximum(x @ numpy_helper.to_array(w1), 0) @ numpy_helper.to_array(w2)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)


def test_bad_requests_say_what_to_do(tmp_path):
    with pytest.raises(TirbyocError, match="PATH.so"):
        build_library("builtin:mlp", ["blas"], output=tmp_path / "mlp.tar")
    with pytest.raises(TirbyocError, match="not yet CUDA"):
        build_library("builtin:mlp", ["blas"], output=tmp_path / "m.so", target={"kind": "cuda", "arch": "sm_80"})
    with pytest.raises(TirbyocError, match="PATH.so or PATH.tar"):
        build_library("builtin:mlp_int8", ["hexagon_hvx"], output=tmp_path / "m.a")
    # the Python route links for this CPU only: a Hexagon target is not handed to the host linker
    with pytest.raises(TirbyocError, match="mtriple=hexagon.*tirbyoc build writes Hexagon libraries"):
        export_module(tvm.IRModule(), ["hexagon_hvx"], tmp_path / "m.so")


ELF_QDSP6, ET_REL, ET_DYN = 164, 1, 3


def _elf(path) -> tuple[int, int]:
    """(e_type, e_machine) of a 32-bit little-endian ELF file."""
    head = Path(path).read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(head[16:18], "little"), int.from_bytes(head[18:20], "little")


@pytest.mark.skipif(hexagon_emulator_missing() is not None, reason=str(hexagon_emulator_missing()))
def test_hexagon_library_as_objects_and_linked(tmp_path):
    """A Hexagon build: the objects and the link command that makes them a Hexagon shared
    object (run here), or that shared object; each offloaded function verified under QEMU,
    the library itself not run (a manifest that says so; the runner refuses it)."""
    import tarfile

    tar = build_library("builtin:cnn_int8", ["hexagon_hvx"], output=tmp_path / "cnn.tar")
    assert [f.verified for f in tar.report.functions if f.offloaded] == [True] * 4
    manifest = json.loads((tmp_path / "cnn.json").read_text())
    assert manifest["runs_here"] is False and manifest["link"][:3] == ["ld.lld-16", "-shared", "-o"]
    with tarfile.open(tmp_path / "cnn.tar") as archive:
        archive.extractall(tmp_path / "objects", filter="data")
    objects = sorted((tmp_path / "objects").glob("*.o"))
    assert [o.name for o in objects] == sorted(manifest["link"][4:])
    assert all(_elf(o) == (ET_REL, ELF_QDSP6) for o in objects)
    subprocess.run(manifest["link"], cwd=tmp_path / "objects", check=True, capture_output=True)
    assert _elf(tmp_path / "objects" / "cnn.so") == (ET_DYN, ELF_QDSP6)
    # what the device's process provides: TVM FFI, the C library, compiler routines; nothing of tirbyoc's
    assert any(s.startswith("TVMFFI") for s in manifest["undefined"])
    assert not any("irbyoc" in s for s in manifest["undefined"])

    so = build_library("builtin:cnn_int8", ["hexagon_hvx"], output=tmp_path / "linked" / "cnn.so")
    assert _elf(so.path) == (ET_DYN, ELF_QDSP6) and so.output is None
    refused = subprocess.run([sys.executable, "-m", "tirbyoc.app.building.runner", str(so.path)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Hexagon shared object" in refused.stderr


def test_hexagon_library_refuses_vtcm_staging():
    from tirbyoc.app.building.deploy_hexagon import check_deployable
    from tirbyoc_intrinsics.hexagon_hvx import make_template

    t = make_template(vtcm_bytes=64 * 1024)
    f = matmul(256, 256, 512, "uint8", "uint8", "int32", trans_b=True)
    m = next(m for m in tirbyoc.match(f, [t]) if "vtcm" in m.intrinsic.name)
    staged = tirbyoc.tensorize(f, m, template=t).func
    with pytest.raises(TirbyocError, match="stage tiles in VTCM.*tirbyoc run -t hexagon_hvx"):
        check_deployable(tvm.IRModule({"kernel": staged}), [])


def test_export_module_saves_what_offload_tir_made(tmp_path):
    """The Python route: OffloadTIR's output (a loaded library in external_mods, which TVM's
    export_library cannot save) exported with its C code linked in, weights as inputs."""
    from tvm import relax

    from tirbyoc.app.building.deploy import export_module
    from tirbyoc.app.model_in.legalize import legalized_model
    from tirbyoc.app.running.run import model_output
    from tirbyoc.relax import OffloadTIR

    prepared = legalized_model("builtin:mlp", ["blas"])
    mod, entry, arrays = prepared.mod, prepared.entry, prepared.arrays
    offloaded = OffloadTIR(["blas"])(mod)
    assert "external_mods" in offloaded.attrs
    shipped, linked = export_module(offloaded, ["blas"], tmp_path / "mlp.so")
    assert linked == ["tirbyoc_blas_packed"] and [p.name for p in shipped] == ["libscipy_openblas.so"]
    args = [tvm.runtime.tensor(a) for a in arrays]
    exe = tvm.compile(offloaded, target=tvm.target.Target({"kind": "llvm", "num-cores": 2}))
    want = model_output(tirbyoc.relax_vm(exe, tvm.cpu())[entry](*args))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "mlp.so")), tvm.cpu())
    np.testing.assert_array_equal(model_output(vm[entry](*args)), want)



def test_libraries_are_found_from_the_calls_in_the_ir_not_from_its_text():
    """A symbol named in an attribute (or any string) is not a call; a call_packed is."""
    import tvm
    from tvm.script import tirx as T

    from tirbyoc.app.building.deploy import called_symbols

    @T.prim_func(s_tir=True)
    def calls(A: T.Buffer((4,), "int32")):
        T.func_attr({"note": "tirbyoc.sim.dma_load and tirbyoc_blas_matmul_nn are only mentioned"})
        T.evaluate(T.call_packed("tirbyoc.sim.gemm", A.data))

    assert called_symbols(tvm.IRModule({"main": calls})) == {"tirbyoc.sim.gemm"}
