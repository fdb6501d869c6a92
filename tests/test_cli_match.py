"""`tirbyoc match` on TVMScript and ONNX files, and its errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from tirbyoc.app.commands.cli import main
from tirbyoc.errors import TirbyocError

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm_workloads.py"


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_match_tvmscript_file_json(capsys):
    rc, out, _ = run(capsys, "match", str(EXAMPLE), "--json", "-t", "x86_vnni", "-t", "vta")
    assert rc == 0
    blocks = {(b["function"], b["block"]): b for b in json.loads(out)["blocks"]}
    assert blocks[("dense_int8", "dense")]["intrinsic"] == "x86_vnni.dot_16x4_u8i8i32"
    assert blocks[("dense_int8", "dense")]["staging"] == {"B": ["pack"]}
    assert blocks[("matmul_odd", "matmul")]["intrinsic"] is None
    assert "float32" in blocks[("matmul_odd", "matmul")]["reason"]
    assert blocks[("dense_bias_relu", "relu")]["fused_into"] == "dense"
    assert blocks[("dense_bias_relu", "dense")]["macs"] == 32 * 64


def test_match_table(capsys):
    rc, out, _ = run(capsys, "match", str(EXAMPLE), "-t", "blas")
    assert rc == 0 and "blas.sgemm_64x64x64_nn" in out and "pad 17->64" in out
    assert "1 of 5 blocks match (blas)" in out


def _onnx_model(path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 32), "float32"), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_match_onnx_file(capsys, tmp_path):
    model = tmp_path / "mlp.onnx"
    _onnx_model(model)
    rc, out, _ = run(capsys, "match", str(model), "--json", "-t", "blas")
    assert rc == 0
    blocks = json.loads(out)["blocks"]
    mm = next(b for b in blocks if b["function"] == "matmul")
    assert mm["intrinsic"] == "blas.sgemm_64x64x64_nn" and mm["padding"] == {"vi": [8, 64], "vj": [32, 64]}
    relu = next(b for b in blocks if b["function"] == "relu")
    assert relu["intrinsic"] is None and "not a reduction" in relu["reason"]


def test_truncated_onnx_is_a_clear_error(capsys, tmp_path):
    model = tmp_path / "mlp.onnx"
    _onnx_model(model)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(model.read_bytes()[:50])
    rc, _, err = run(capsys, "match", str(bad))
    assert rc == 2 and "is not a valid ONNX model" in err


def test_python_file_errors(capsys, tmp_path):
    several = tmp_path / "w.py"
    several.write_text(EXAMPLE.read_text().replace("class Workloads", "class A") +
                       "\nB = A\n")
    rc, _, err = run(capsys, "match", str(several))
    assert rc == 2 and "choose one with --object" in err
    broken = tmp_path / "broken.py"
    broken.write_text("import does_not_exist\n")
    rc, _, err = run(capsys, "match", str(broken))
    assert rc == 2 and "raised ModuleNotFoundError while being imported" in err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    rc, _, err = run(capsys, "match", str(empty))
    assert rc == 2 and "defines no model" in err
    rc, _, err = run(capsys, "match", str(EXAMPLE), "--object", "nope")
    assert rc == 2 and "no model or function named 'nope'" in err
    rc, _, err = run(capsys, "match", str(tmp_path / "missing.py"))
    assert rc == 2 and "no such file" in err


def test_unknown_template(capsys):
    rc, _, err = run(capsys, "match", str(EXAMPLE), "-t", "tpu")
    assert rc == 2 and "tpu" in err


def test_one_loader_takes_every_model_spec_by_its_frontend():
    from tirbyoc.app.model_in import frontends

    assert [f.name for f in frontends.FRONTENDS][:3] == ["builtin", "onnx", "python"]
    assert frontends.frontend_for("builtin:mlp").name == "builtin"
    assert frontends.frontend_for("model.onnx").name == "onnx"
    assert frontends.frontend_for("workloads.py").name == "python"
    with pytest.raises(TirbyocError, match="model 'model.tflite': give builtin:NAME .*, an .onnx file or a .py file"):
        frontends.frontend_for("model.tflite")
    spec, mod = frontends.load_model(None)
    assert spec == "builtin:mlp" and mod.get_global_vars()
    assert frontends.is_float_model("builtin:resnet18") is True
    assert frontends.is_float_model("builtin:resnet18_int8") is False
    assert frontends.is_float_model("notes.txt") is None


def test_a_new_frontend_is_registered_not_coded_in(tmp_path):
    from tirbyoc.app.model_in import frontends

    path = tmp_path / "kernel.tir"
    path.write_text("unused")
    taken = []

    def load(spec, templates, obj, input_shapes):
        taken.append(spec)
        return frontends.load_model("builtin:mlp")[1]

    added = frontends.register_frontend(frontends.Frontend("tir file", ".tir", "a .tir file", load))
    try:
        assert frontends.load_model(str(path))[0] == str(path) and taken == [str(path)]
        with pytest.raises(TirbyocError, match="'.tir' is taken by 'tir file'"):
            frontends.register_frontend(frontends.Frontend("again", ".tir", "x", load))
    finally:
        frontends.FRONTENDS.remove(added)
