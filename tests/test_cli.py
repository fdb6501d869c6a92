"""The command line as a new user meets it: the installed ``tirbyoc`` entry point, run from
outside the checkout, with its exit codes and its messages."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "tirbyoc"
TIRBYOC = str(BIN) if BIN.exists() else shutil.which("tirbyoc")

pytestmark = pytest.mark.skipif(TIRBYOC is None, reason="the tirbyoc entry point is not installed")


def tirbyoc(*args, cwd):
    done = subprocess.run([TIRBYOC, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def test_version_and_help_list_models_templates_and_exit_codes(tmp_path):
    code, out, _ = tirbyoc("--version", cwd=tmp_path)
    assert code == 0 and out.startswith("tirbyoc ")
    code, out, _ = tirbyoc("run", "--help", cwd=tmp_path)
    assert code == 0 and "resnet18_int8" in out and "vta" in out and "exit status" in out
    assert "3  TVM could not import or build the model itself" in out


def test_intrinsics_takes_several_templates_after_one_flag(tmp_path):
    code, out, _ = tirbyoc("intrinsics", "--template", "vta", "blas", "--json", cwd=tmp_path)
    assert code == 0 and {r["template"] for r in json.loads(out)} == {"vta", "blas"}


def test_intrinsics_lists_a_groups_tensor_core_kernel(tmp_path):
    code, out, _ = tirbyoc("intrinsics", "--template", "cuda_mma", cwd=tmp_path)
    assert code == 0 and "tensor-core kernel" in out
    assert "ldmatrix + mma.sync 16x16x32 int8 -> int32" in out and "B as nk" in out


@pytest.mark.parametrize("target,message", [
    ("{kind: llvm}", "is not valid JSON"),
    ('{"kind": "llvm", "mcpu": "skylake"}', "LLVM would abort"),
    ("cuda", "no CUDA device"),
])
def test_target_mistakes_are_usage_errors_before_any_work(tmp_path, target, message):
    """skylake under x86_vnni used to abort the process inside LLVM (exit 134)."""
    code, out, err = tirbyoc("run", "-q", "-t", "x86_vnni", "--target", target, cwd=tmp_path)
    assert code == 2 and message in err and "Traceback" not in err


def test_tvms_own_build_failure_is_exit_3_in_one_line(tmp_path):
    """TVM 0.27 cannot build a boolean `equal`: that is TVM's failure, not the offload's."""
    model = tmp_path / "booleq.py"
    model.write_text(
        "from tvm.script import ir as I\n"
        "from tvm.script import relax as R\n\n\n"
        "@I.ir_module\n"
        "class Model:\n"
        "    @R.function\n"
        "    def main(x: R.Tensor((4, 8), 'bool'), y: R.Tensor((4, 8), 'bool')):\n"
        "        with R.dataflow():\n"
        "            z = R.equal(x, y)\n"
        "            R.output(z)\n"
        "        return z\n")
    code, _, err = tirbyoc("run", "-q", "-t", "blas", "-m", str(model), cwd=tmp_path)
    assert code == 3 and "TVM could not build or run the model itself (not the offload)" in err
    assert len(err.strip().splitlines()) == 1


def test_run_without_timing_the_baseline(tmp_path):
    code, out, _ = tirbyoc("run", "-q", "-t", "blas", "--no-baseline", "--repeat", "1", "--json",
                           cwd=tmp_path)
    result = json.loads(out)
    assert code == 0 and result["verified"] is True
    assert "baseline" not in result["latency_ms"] and result["latency_ms"]["offloaded"] > 0


def test_nothing_offloaded_builds_once_and_says_so(tmp_path):
    """An fp32 model on an int8 template: the offloaded build would be TVM's build again."""
    code, out, _ = tirbyoc("run", "-q", "-t", "vta", "-m", "builtin:mlp", "--json", cwd=tmp_path)
    result = json.loads(out)
    assert code == 0 and result["coverage"] == 0 and "nothing was offloaded" in result["not_run"]
    assert "offloaded" not in result["latency_ms"]


def _dynamic_batch_onnx(path):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).uniform(-0.1, 0.1, (64, 32)).astype("float32"), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_batch_dynamic_onnx_model_runs_with_its_input_shape(tmp_path):
    model = tmp_path / "dyn.onnx"
    _dynamic_batch_onnx(model)
    # without a shape or sizes: its dim_param at the smallest size, from the symbolic build
    code, out, err = tirbyoc("run", "-q", "-t", "blas", "-m", str(model), "--json", cwd=tmp_path)
    result = json.loads(out)
    assert code == 0, err
    assert [(s["sizes"], s["verified"]) for s in result["sizes"]] == [({"batch": 1}, True)]
    assert "the smallest sizes" in result["size_origin"]
    code, out, err = tirbyoc("run", "-q", "-t", "blas", "-m", str(model), "--input-shape", "x=8,64",
                             "--json", cwd=tmp_path)
    result = json.loads(out)
    assert code == 0, err
    assert result["verified"] is True and result["coverage"] == 1.0 and result["total_macs"] == 8 * 64 * 32


NN_FILE = """
from tvm.relax.frontend import nn


class Backbone(nn.Module):
    def __init__(self):
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return nn.op.relu(self.fc(x))


class Model(nn.Module):
    def __init__(self):
        self.body = Backbone()
        self.head = nn.Linear(64, 16)

    def forward(self, x):
        return self.head(self.body(x))


backbone = Backbone()
model = Model()
spec = {"forward": {"x": nn.spec.Tensor((8, 64), "float32")}}
"""


def test_a_file_with_two_models_lists_them_and_takes_object(tmp_path):
    path = tmp_path / "two.py"
    path.write_text(NN_FILE)
    code, _, err = tirbyoc("run", "-q", "-t", "blas", "-m", str(path), cwd=tmp_path)
    assert code == 2 and "backbone (relax.frontend.nn.Module)" in err and "--object" in err
    code, out, err = tirbyoc("run", "-q", "-t", "blas", "-m", str(path), "--object", "model", "--json",
                             cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["total_macs"] == 8 * 64 * 64 + 8 * 64 * 16


def test_match_takes_what_run_takes(tmp_path):
    """One loader: nn model files, built-ins, and a function inside a module of workloads."""
    path = tmp_path / "two.py"
    path.write_text(NN_FILE)
    code, out, err = tirbyoc("match", str(path), "--object", "backbone", "-t", "blas", "--json", cwd=tmp_path)
    assert code == 0, err
    assert any(b["intrinsic"] for b in json.loads(out)["blocks"])
    code, out, _ = tirbyoc("match", "builtin:cnn", "-t", "blas", cwd=tmp_path)
    assert code == 0 and "blocks match (blas)" in out
    examples = Path(__file__).resolve().parents[1] / "examples" / "gemm_workloads.py"
    code, out, err = tirbyoc("match", str(examples), "--object", "dense_int8", "--json", cwd=tmp_path)
    assert code == 0, err
    assert {b["function"] for b in json.loads(out)["blocks"]} == {"dense_int8"}


def test_wide_tables_wrap_and_repeated_reasons_are_grouped():
    from tirbyoc.offloading.table import group_repeats, render

    reason = "a long reason that several PrimFuncs share, word after word after word " * 2
    rows, notes = group_repeats([["f1", reason], ["f2", reason], ["f3", "short"]], 1)
    assert [r[1] for r in rows] == ["[1]", "[1]", "short"] and notes == [f"[1] {reason}"]
    text = render(["name", "note"], [["f1", reason]], width=60)
    assert max(len(line) for line in text.splitlines()) <= 60
    assert "".join(text.split()) .endswith("".join(reason.split()))


def test_profile_times_each_offloaded_primfunc(tmp_path):
    code, out, err = tirbyoc("run", "-q", "-t", "blas", "-m", "builtin:cnn", "--profile", "--repeat", "2",
                             "--json", cwd=tmp_path)
    assert code == 0, err
    timed = [f for f in json.loads(out)["functions"] if f["ms_per_call"]]
    assert timed and all(f["ms_per_call"]["tvm"] > 0 and f["ms_per_call"]["offloaded"] > 0 for f in timed)
    code, out, _ = tirbyoc("run", "-q", "-t", "blas", "-m", "builtin:cnn", "--profile", "--repeat", "2",
                           cwd=tmp_path)
    assert "ms/call TVM -> offloaded" in out


def test_verbose_logs_each_function_and_quiet_keeps_stderr_clean(tmp_path):
    code, _, err = tirbyoc("run", "-v", "-t", "blas", "--repeat", "1", cwd=tmp_path)
    assert code == 0 and "matmul: the library kernel tirbyoc_blas_matmul_nn" in err
    assert "add: kept (no multiply-accumulates)" in err
    code, _, err = tirbyoc("run", "-q", "-t", "blas", "--repeat", "1", cwd=tmp_path)
    assert code == 0 and "matmul:" not in err and "offload [" not in err
