"""Sizes known only at run time: functions with symbolic extents offloaded and checked at
several sizes, from Relax models whose shapes are named (a sequence length, a batch)."""

import re

import numpy as np
import pytest
from tvm import relax

import tirbyoc
from tirbyoc._tvm import tirx
from tirbyoc.offloading.verification import SYMBOLIC_SIZES, specialize_symbolic, symbolic_names
from tirbyoc.relax.bridge import offload_module
from tirbyoc.testing.workloads import matmul
from vnni import NAME

MODEL = '''from tvm.relax.frontend import nn


class MLP(nn.Module):
    def __init__(self):
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(nn.relu(self.fc1(x)))


model = MLP()
spec = {"forward": {"x": nn.spec.Tensor(("n", 64), "float32")}}
'''


@pytest.fixture(scope="module")
def dynamic_mlp(tmp_path_factory):
    """`MODEL` (a relax.frontend.nn MLP whose row count is the name ``n``), legalized (int64 shapes)."""
    from tirbyoc.app.model_in.frontends import load_model

    path = tmp_path_factory.mktemp("model") / "mlp.py"
    path.write_text(MODEL)
    return relax.transform.LegalizeOps()(load_model(str(path))[1])


def test_the_sizes_a_symbolic_extent_is_checked_at_take_every_path():
    assert SYMBOLIC_SIZES[0] == 1 and any(s % 16 == 0 for s in SYMBOLIC_SIZES)
    assert any(s % 16 == 1 and s > 1 for s in SYMBOLIC_SIZES) and max(SYMBOLIC_SIZES) > 128


def test_several_size_variables_are_checked_together_while_small_then_each_alone():
    """Two or three size variables bound together at 131 would check 17,161 or 2.2 million rows
    against TVM's unscheduled build; past `SYMBOLIC_VOLUME` each is checked alone."""
    from tirbyoc.offloading.verification import SYMBOLIC_VOLUME, symbolic_bindings, symbolic_checks_said

    assert symbolic_bindings(["n"]) == [{"n": s} for s in SYMBOLIC_SIZES]
    two = symbolic_bindings(["batch", "seq"])
    assert two[:4] == [{"batch": s, "seq": s} for s in (1, 7, 16, 17)]
    assert two[4:] == [{"batch": 131, "seq": 1}, {"batch": 1, "seq": 131}]
    assert all(b["batch"] * b["seq"] <= SYMBOLIC_VOLUME for b in two)
    assert symbolic_checks_said(["batch", "seq"]) == "checked with batch = seq = 1, 7, 16, 17; each alone (the others 1) at 131"
    assert symbolic_checks_said(["n"]) == "checked with n = 1, 7, 16, 17, 131"


COMPOUND = """
@T.prim_func(s_tir=True)
def main(a: T.handle, past: T.int64, c: T.handle):
    batch = T.int64()
    seq = T.int64()
    A = T.match_buffer(a, (batch, past + seq), "float32")
    C = T.match_buffer(c, (seq,), "float32")
    for i in range(seq):
        with T.sblock("C"):
            vi = T.axis.remap("S", [i])
            C[vi] = A[batch - 1, past + vi]
"""


def test_a_compound_extent_and_a_scalar_size_are_bound_for_a_check():
    """A KV cache's ``past + seq`` extent beside a bare ``batch`` that no other buffer has,
    ``past`` a scalar parameter (Relax passes it so): every extent concrete after the binding."""
    from tirbyoc.offloading.verification import concrete_params
    from tirbyoc.testing.workloads import parse

    func = parse(COMPOUND)
    assert symbolic_names([func]) == ["batch", "past", "seq"]
    (bound,) = specialize_symbolic([func], {"batch": 2, "past": 5, "seq": 3})
    assert [shape for _, shape, _ in concrete_params(bound)] == [(2, 8), (3,)]


def test_a_relax_models_int64_sizes_are_bound_for_a_check(dynamic_mlp):
    func = dynamic_mlp["matmul"]
    assert symbolic_names([func]) == ["n"]
    (bound,) = specialize_symbolic([func], {"n": 7})
    shapes = [[int(d) for d in p.shape] for p in bound.params]
    assert shapes == [[7, 64], [64, 128], [7, 128]]
    assert all(str(d.ty.dtype) == "int64" for d in bound.params[0].shape if isinstance(d, tirx.IntImm))


def test_a_dynamic_relax_models_matmuls_offload_and_verify_at_every_size(dynamic_mlp):
    out, report = offload_module(dynamic_mlp, ["blas"])
    matmuls = {f.name: f for f in report.functions if f.name.startswith("matmul")}
    assert set(matmuls) == {"matmul", "matmul1"}
    assert all(f.template == "blas" and f.verified for f in matmuls.values()), matmuls
    # one GEMM call of n rows each (the kernel reads n from its arguments), not a GEMV per row
    assert all(f.extern == "tirbyoc_blas_matmul_nn" for f in matmuls.values())
    assert "tirbyoc_blas_matmul_nn" in out["forward"].script()
    inside = tirbyoc.offload(dynamic_mlp["matmul"], "blas")  # inside a PrimFunc: a GEMV per row
    assert inside.verification.passed
    assert inside.verification.reason == "checked with n = " + ", ".join(map(str, SYMBOLIC_SIZES))


@pytest.mark.parametrize("template,dtypes", [(NAME, ("uint8", "int8", "int32")), ("x86_avx2", ("uint8", "int8", "int32")),
                                             ("vta", ("int8", "int8", "int32")),
                                             ("x86_fp32_avx2", ("float32",) * 3)])
@pytest.mark.parametrize("symbolic", ["n", "k", "mnk"])
def test_a_tile_intrinsic_pads_an_axis_of_run_time_extent(template, dtypes, symbolic):
    """An output-channel or reduction extent known only at run time lies under the
    intrinsic's lanes: padded to their multiple when the function runs (the staging copy's
    extent is symbolic), checked at every size."""
    func = matmul(20, 24, 40, *dtypes, symbolic=symbolic)
    out = tirbyoc.offload(func, template)
    assert out.offloaded and out.verification.passed, out.table()
    assert out.verification.reason.startswith("checked with ") and "= 1, 7, 16, 17" in out.verification.reason
    assert out.verification.reason.split("; ")[0].endswith(", 131") == (len(symbolic) == 1)  # mnk: 131 each alone
    steps = " ".join(out.rewrites[0].steps)
    lanes = "n" in symbolic or ("k" in symbolic and dtypes[0] != "float32")  # the fp32 FMA's k is a loop
    assert ("a multiple of" in steps and "at run time" in steps) == lanes, steps
    if template == "vta":  # the scratchpad tiles do not grow with the size
        assert "(extent known at run time), so it fits at every size" in steps


@pytest.mark.parametrize("template,dtypes", [(NAME, ("uint8", "int8", "int32")), ("x86_avx2", ("uint8", "int8", "int32")),
                                             ("x86_fp32_avx2", ("float32",) * 3)])
def test_rows_known_only_at_run_time_are_register_blocked(template, dtypes):
    """A row count known only at run time (a served model's tokens) is padded to a multiple of
    RUN_TIME_ROWS when the function runs, so the register block keeps several rows instead of
    one (a matrix-vector product per row); the padded rows are never written back. Checked
    at every size, the ones below, at and past a multiple included."""
    from tirbyoc.rewrite.cpu.run_time_rows import RUN_TIME_ROWS

    out = tirbyoc.offload(matmul(20, 48, 64, *dtypes, symbolic="m"), template)
    assert out.offloaded and out.verification.passed, out.table()
    assert out.verification.reason.endswith("= 1, 7, 16, 17, 131")
    steps = " ".join(out.rewrites[0].steps)
    assert f"rows padded to a multiple of {RUN_TIME_ROWS} at run time" in steps, steps
    block = re.search(r"register-blocked (\d+)x(\d+)", steps)
    assert block and int(block.group(1)) > 1 and RUN_TIME_ROWS % int(block.group(1)) == 0, steps


PROJECTION = """
@T.prim_func(s_tir=True)
def main(a: T.handle, w: T.Buffer((32, 48), "float32"), c: T.handle):
    batch = T.int32()
    seq = T.int32()
    A = T.match_buffer(a, (batch, seq, 32), "float32")
    C = T.match_buffer(c, (batch, seq, 48), "float32")
    for b, s, n, k in T.grid(batch, seq, 48, 32):
        with T.sblock("C"):
            vb, vs, vn, vk = T.axis.remap("SSSR", [b, s, n, k])
            with T.init():
                C[vb, vs, vn] = T.float32(0)
            C[vb, vs, vn] = C[vb, vs, vn] + A[vb, vs, vk] * w[vk, vn]
"""


def test_rows_of_two_run_time_dimensions_are_one_row_count():
    """A projection [batch, seq, K] x [K, N] with both sizes known at run time: batch x seq rows
    padded once (a batch of decoding tokens, seq 1, is not each token's row padded to a block),
    the weight untouched; checked at every binding of the two."""
    from tirbyoc.testing.workloads import parse

    out = tirbyoc.offload(parse(PROJECTION), "x86_fp32_avx2")
    assert out.offloaded and out.verification.passed, out.table()
    steps = " ".join(out.rewrites[0].steps)
    assert "the rows (2 dimensions of run-time extent folded into one) to a multiple of" in steps, steps
    from tirbyoc.rewrite.cpu.run_time_rows import RUN_TIME_ROWS

    padded = f"(batch * seq + {RUN_TIME_ROWS - 1}) // {RUN_TIME_ROWS} * {RUN_TIME_ROWS}"
    assert padded in out.func.script(), out.func.script()


def test_each_row_block_runs_on_its_real_rows():
    """Rows known at run time, padded to 4: each register block of 4 rows runs a version of
    its core for its count of real rows (a decoding token computes one row, not four), chosen
    when the function runs - every count checked against numpy, 1 to 9 rows."""
    import tvm

    from tirbyoc._tvm import make_target, tvm_ffi
    from tirbyoc.rewrite.cpu.run_time_rows import skip_padded_row_blocks
    from tirbyoc.testing.workloads import parse

    out = tirbyoc.offload(parse(PROJECTION.replace("48", "64")), "x86_fp32_avx2")
    assert out.offloaded and out.verification.passed, out.table()
    steps = " ".join(out.rewrites[0].steps)
    block = re.search(r"register-blocked (\d+)x\d+", steps)
    assert block and "each row block run on its real rows only" in steps, steps
    flags = []
    tvm_ffi.structural_walk(skip_padded_row_blocks(out.func).body, (tvm.tirx.Bind, flags.append), order="pre")
    assert len([f for f in flags if "is_real" in f.var.name]) == int(block.group(1)), out.func.script()
    lib = tvm.compile(tvm.IRModule({"main": out.func}), target=make_target({"kind": "llvm"}),
                      tir_pipeline=tirbyoc.PIPELINE)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 64)).astype("float32")
    for batch, seq in [(1, n) for n in range(1, 10)] + [(2, 3), (3, 1)]:
        a = rng.standard_normal((batch, seq, 32)).astype("float32")
        c = tvm.runtime.tensor(np.zeros((batch, seq, 64), "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(w), c)
        np.testing.assert_allclose(c.numpy(), a @ w, rtol=1e-5, atol=1e-5, err_msg=f"{batch} x {seq}")


def _divisions_by(node, names: set) -> int:
    """Floor divisions and modulos in ``node`` whose divisor is one of the variables ``names``."""
    from tirbyoc._tvm import tvm_ffi

    found = []
    tvm_ffi.structural_walk(node, [(tirx.FloorDiv, found.append), (tirx.FloorMod, found.append)], order="pre")
    return len([d for d in found if isinstance(d.b, tirx.Var) and d.b.name in names])


def test_the_bounds_of_fused_run_time_rows_are_checked_without_a_division():
    """``batch x seq`` rows folded into one: the write-back's predicate checks ``r // seq <
    batch`` and ``r % seq < seq``, two divisions a row that TVM cannot drop (it does not know
    ``seq`` is positive); the stage makes it ``r < batch * seq`` - none left in any block
    predicate, and the values still numpy's at every binding, a row block's worth or less."""
    import tvm

    from tirbyoc._tvm import make_target, s_tir, tvm_ffi
    from tirbyoc.rewrite.cpu.row_bounds import simplify_row_bounds
    from tirbyoc.testing.workloads import parse

    out = tirbyoc.offload(parse(PROJECTION.replace("48", "64")), "x86_fp32_avx2")
    assert out.offloaded and out.verification.passed, out.table()

    def predicates(func):
        found = []
        tvm_ffi.structural_walk(func.body, (s_tir.SBlockRealize, lambda r: found.append(r.predicate)), order="pre")
        return found

    assert sum(_divisions_by(p, {"seq"}) for p in predicates(out.func)) >= 2, out.func.script()
    simplified = simplify_row_bounds(out.func)
    assert sum(_divisions_by(p, {"seq"}) for p in predicates(simplified)) == 0, simplified.script()
    assert simplify_row_bounds(simplified).same_as(simplified)  # nothing left to rewrite
    lib = tvm.compile(tvm.IRModule({"main": out.func}), target=make_target({"kind": "llvm"}),
                      tir_pipeline=tirbyoc.PIPELINE)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 64)).astype("float32")
    for batch, seq in [(1, 1), (1, 13), (2, 5), (3, 4), (5, 7)]:
        a = rng.standard_normal((batch, seq, 32)).astype("float32")
        c = tvm.runtime.tensor(np.full((batch, seq, 64), 7.0, "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(w), c)
        np.testing.assert_allclose(c.numpy(), a @ w, rtol=1e-5, atol=1e-5, err_msg=f"{batch} x {seq}")


def test_a_library_kernel_takes_a_size_known_at_run_time(dynamic_mlp):
    from tirbyoc.offloading.whole_function import find_whole_call, verify_whole_call

    func = dynamic_mlp["matmul"]
    best = tirbyoc.explain(func, "blas")[0].best
    assert best.runtime_axes == ("vi",) and "vi=v_i0 (size at run time)" in best.describe()
    call, why = find_whole_call(func, tirbyoc.match(func, [tirbyoc.get_template("blas")]))
    assert why is None and call.symbol == "tirbyoc_blas_matmul_nn"
    check = verify_whole_call(func, call)
    assert check.passed and check.reason.startswith("checked with n = 1, 7")


def test_a_dynamic_model_offloaded_runs_at_every_size(dynamic_mlp):
    import tvm

    offloaded, _ = offload_module(dynamic_mlp, ["blas"])
    build = lambda mod: relax.VirtualMachine(tvm.compile(mod, "llvm", tir_pipeline=tirbyoc.PIPELINE), tvm.cpu())  # noqa: E731
    ours, reference = build(offloaded), build(dynamic_mlp)
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-0.1, 0.1, tuple(int(d) for d in p.ty.shape.values)).astype("float32")
               for p in dynamic_mlp["forward"].params[1:]]
    for n in (1, 17, 128):  # one build serves every length
        x = rng.uniform(-1, 1, (n, 64)).astype("float32")
        args = [tvm.runtime.tensor(a) for a in (x, *weights)]
        got, want = ours["forward"](*args).numpy(), reference["forward"](*args).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_run_binds_a_named_size_to_several_values_from_one_build(tmp_path, capsys):
    import json

    from tirbyoc.app.commands.cli import main

    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "n=1,17,128", "--repeat", "1",
                 "--json"]) == 0
    sizes = json.loads(capsys.readouterr().out)["sizes"]
    assert [s["sizes"] for s in sizes] == [{"n": 1}, {"n": 17}, {"n": 128}]
    for s in sizes:  # every matmul MAC offloaded at every length, the outputs compared at each
        assert s["total_macs"] == s["sizes"]["n"] * (64 * 128 + 128 * 32)
        assert s["coverage"] == 1.0 and s["verified"] is True
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "n=1,17", "--repeat", "1"]) == 0
    table = capsys.readouterr().out
    assert "MAC coverage: 100.0% at n=1 (12,288 of 12,288); each size below" in table
    assert "n=17   208,896  100.0%     match" in table


def test_profile_times_each_function_of_a_dynamic_model_at_its_first_size(tmp_path, capsys):
    import json

    from tirbyoc.app.commands.cli import main

    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    assert main(["run", "-q", "-m", str(path), "-t", "x86_fp32_avx2", "--size", "n=17,128", "--repeat", "2",
                 "--profile", "--json"]) == 0
    functions = [f for f in json.loads(capsys.readouterr().out)["functions"] if f["ms_per_call"]]
    assert functions  # every offloaded function timed alone at n=17, none left with an error
    assert all(f["ms_per_call"].get("tvm", 0) > 0 and f["ms_per_call"].get("offloaded", 0) > 0
               for f in functions), functions


def test_a_named_size_without_values_says_how_to_give_them(tmp_path, capsys):
    from tirbyoc.app.commands.cli import main

    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    assert main(["run", "-q", "-m", str(path), "-t", "blas"]) == 2
    assert "give its sizes with --size n=V1,V2,..." in capsys.readouterr().err
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "n=0,4"]) == 2
    assert "--size 'n=0,4': write NAME=V1,V2,... with positive integers" in capsys.readouterr().err


def test_sizes_are_taken_together_position_by_position():
    from tirbyoc.app.model_in.sizes import bindings
    from tirbyoc.errors import TirbyocError

    assert bindings(None) == [None]
    assert bindings({"n": (1, 8), "b": (2,)}) == [{"n": 1, "b": 2}, {"n": 8, "b": 2}]
    with pytest.raises(TirbyocError, match="give each name one value or as many as the others"):
        bindings({"n": (1, 8, 9), "b": (2, 3)})


def test_one_library_serves_every_size_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    import tvm

    from tirbyoc.app.building.deploy import build_library
    from tirbyoc.app.model_in.legalize import legalized_model

    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    built = build_library(str(path), ["blas"], output=tmp_path / "lib" / "mlp.so", sizes={"n": (4,)})
    assert built.inputs == [{"name": "x", "shape": ["n", 64], "dtype": "float32"}]
    assert all(f.verified for f in built.report.functions if f.offloaded)
    # TVM's build of the untouched model with the same weights (the same seed binds the same)
    prepared = legalized_model(str(path), [tirbyoc.get_template("blas")], tirbyoc.RunOptions(sizes={"n": (4,)}),
                               constant_weights=True)
    mod, entry = prepared.mod, prepared.entry
    reference = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(1)
    for n in (3, 9):
        x = rng.uniform(-1, 1, (n, 64)).astype("float32")
        np.save(tmp_path / "x.npy", x)
        done = subprocess.run([sys.executable, "-m", "tirbyoc.app.building.runner", str(built.path), "--input",
                               str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        want = reference[entry](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)


def test_an_onnx_models_dim_param_is_a_size_to_run_at(tmp_path, capsys):
    import json

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from tirbyoc.app.commands.cli import main

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(-0.1, 0.1, s).astype("float32"), n)
               for n, s in (("w1", (64, 128)), ("w2", (128, 32)))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], weights)
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "batch=1,3", "--repeat", "1",
                 "--json"]) == 0
    sizes = json.loads(capsys.readouterr().out)["sizes"]
    assert [(s["sizes"], s["coverage"], s["verified"]) for s in sizes] == [
        ({"batch": 1}, 1.0, True), ({"batch": 3}, 1.0, True)]
    # without --size: the smallest sizes, said so, from a build that takes any
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(s["sizes"], s["verified"]) for s in result["sizes"]] == [({"batch": 1}, True)]
    assert result["size_origin"].startswith("no --size given: run at the smallest sizes (the file declares none), batch=1")


def test_a_llama_layer_offloads_every_matmul_mac_at_every_length(capsys):
    import json

    from tirbyoc.app.commands.cli import main

    assert main(["run", "-q", "-m", "builtin:llama_layer", "-t", "blas", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    runs = result["sizes"]  # the built-in's own lengths: 1, 17, 128 from one build
    assert [r["sizes"]["seq"] for r in runs] == [1, 17, 128]
    assert all(r["coverage"] == 1.0 and r["verified"] is True for r in runs), runs
    # every matmul one library call that reads seq from its arguments: the projections (a
    # [1, seq, K] input under one [K, N] weight), q.k^T and p.v (batched over the heads)
    calls = {f["name"]: f["extern"] for f in result["functions"] if f["template"]}
    assert len(calls) == 5 and set(calls.values()) == {"tirbyoc_blas_matmul_nn"}, calls


def test_the_llama_layer_library_serves_two_lengths_in_a_fresh_process(tmp_path):
    """Tensorized GEMVs and whole-call GEMMs in one library: blas's shim linked once."""
    import subprocess
    import sys

    import tvm

    from tirbyoc.app.building.deploy import build_library
    from tirbyoc.app.model_in.legalize import legalized_model

    built = build_library("builtin:llama_layer", ["blas"], output=tmp_path / "llama.so")
    assert [i["shape"] for i in built.inputs] == [[1, "seq", 256], ["seq", 32], ["seq", 32]]
    prepared = legalized_model("builtin:llama_layer", [tirbyoc.get_template("blas")],
                               tirbyoc.RunOptions(sizes={"seq": (1,)}), constant_weights=True)
    mod, entry = prepared.mod, prepared.entry
    reference = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(2)
    for n in (5, 40):
        arrays = {"x": (1, n, 256), "cos": (n, 32), "sin": (n, 32)}
        arrays = {k: rng.uniform(-1, 1, s).astype("float32") for k, s in arrays.items()}
        args = []
        for k, a in arrays.items():
            np.save(tmp_path / f"{k}.npy", a)
            args += ["--input", f"{k}={tmp_path / f'{k}.npy'}"]
        done = subprocess.run([sys.executable, "-m", "tirbyoc.app.building.runner", str(built.path), *args,
                               "--output", str(tmp_path / "y.npy")], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        want = reference[entry](*[tvm.runtime.tensor(a) for a in arrays.values()]).numpy()
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("template", ["x86_vnni", "vta"])
def test_the_quantized_llama_layer_runs_integer_at_every_length(template, capsys):
    """QDQ-quantized (calibrated at seq = 128), made integer, offloaded: the projections' MACs at
    every length, bit-exact against TVM's build - the attention's two matmuls as well: q.k^T's
    sequence-long output axis and p.v's sequence-long reduction padded to the cores' lanes
    when the function runs."""
    import json

    from tirbyoc.app.commands.cli import main
    from vnni import VNNI

    name = VNNI.name if template == "x86_vnni" else template
    assert main(["run", "-q", "-m", "builtin:llama_layer_int8", "-t", name, "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert all(r["verified"] is True for r in result["sizes"])
    assert [r["coverage"] for r in result["sizes"]] == [1.0, 1.0, 1.0]
    assert len(result["quantized"]["integer"]) == 9 and not result["quantized"]["kept"]


def test_a_dynamic_onnx_bert_encoder_offloads_every_mac_at_each_length(tmp_path, capsys):
    import json

    pytest.importorskip("onnx")
    from tirbyoc.app.commands.cli import main
    from tirbyoc.testing.qdq import float_bert_base

    path = float_bert_base(tmp_path / "bert.onnx", dynamic=True, layers=2, dim=256, heads=4, hidden=1024)
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "seq=1,3", "--repeat", "1",
                 "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["sizes"]
    assert [(r["sizes"]["seq"], r["coverage"], r["verified"]) for r in runs] == [(1, 1.0, True), (3, 1.0, True)]


TORCH_MODEL = '''import torch
from torch.export import Dim


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(0)
model = MLP()
example_inputs = (torch.randn(4, 64),)
dynamic_shapes = {DYNAMIC}
'''


@pytest.mark.parametrize("dynamic", ['{"x": {0: Dim("batch", max=4096)}}', '({0: Dim("batch", max=4096)},)'])
def test_a_torch_export_with_a_dynamic_batch_runs_at_every_size(tmp_path, capsys, dynamic):
    """torch.export's dynamic_shapes (keyed by name or by position): the Relax module's size
    variable carries the Dim's name (torch calls it s<N>) and its bound."""
    import json

    pytest.importorskip("torch")
    from tirbyoc.app.commands.cli import main
    from tirbyoc.app.model_in.frontends import load_model

    path = tmp_path / "mlp.py"
    path.write_text(TORCH_MODEL.replace("{DYNAMIC}", dynamic))
    mod = load_model(str(path))[1]
    batch, width = mod["main"].params[0].ty.shape.values
    assert (str(batch), int(width)) == ("batch", 64)
    assert {str(k): int(v) for k, v in mod["main"].attrs["tir_var_upper_bound"].items()} == {"batch": 4096}
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "batch=1,3,100", "--repeat", "1",
                 "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["sizes"]
    assert [(r["sizes"]["batch"], r["coverage"], r["verified"]) for r in runs] == [
        (1, 1.0, True), (3, 1.0, True), (100, 1.0, True)]


def test_a_dynamic_batch_onnx_bert_encoder_offloads_every_mac_at_each_batch(tmp_path, capsys):
    """[batch, seq, dim] in, batch a dim_param (the reshapes copy it with 0): every MAC offloaded
    at batch 1 and 3, the batch a loop around fixed-size library calls."""
    import json

    pytest.importorskip("onnx")
    from tirbyoc.app.commands.cli import main
    from tirbyoc.testing.qdq import float_bert_base

    path = float_bert_base(tmp_path / "bert.onnx", dynamic="batch", batch=2, seq=16, layers=2, dim=128,
                           heads=4, hidden=256)
    assert main(["run", "-q", "-m", str(path), "-t", "blas", "--size", "batch=1,3", "--repeat", "1",
                 "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["sizes"]
    assert [(r["sizes"]["batch"], r["coverage"], r["verified"]) for r in runs] == [(1, 1.0, True), (3, 1.0, True)]


def test_a_file_with_named_dimensions_is_calibrated_at_given_sizes(tmp_path):
    """ONNX Runtime's calibration needs inputs of some size: without ``sizes`` the error names
    the input and its named dimension, not a shape of zeros deep in the quantizer."""
    pytest.importorskip("onnxruntime")
    from tirbyoc.testing.qdq import float_bert_base, ort_quantize

    floating = float_bert_base(tmp_path / "bert.onnx", dynamic="batch,seq", batch=1, seq=16, layers=1, dim=32,
                               heads=2, hidden=64)
    with pytest.raises(ValueError, match="'x' has the named dimension 'batch'.*sizes="):
        ort_quantize(floating, tmp_path / "unsized.onnx")


@pytest.mark.slow  # 80 s on 2 cores: 16 functions each checked at 6 bindings of batch and seq
def test_an_int8_encoder_with_batch_and_seq_both_dynamic_runs_integer_at_every_size(tmp_path, capsys):
    """The served form of a quantized encoder: ``batch`` and ``seq`` dim_params, quantized by
    ONNX Runtime's flow calibrated at given sizes (the file keeps the names); every MAC
    offloaded to the int8 template and verified at each size from one build."""
    import json

    pytest.importorskip("onnxruntime")
    from tirbyoc.app.commands.cli import main
    from tirbyoc.testing.qdq import float_bert_base, ort_quantize

    floating = float_bert_base(tmp_path / "bert.onnx", dynamic="batch,seq", batch=1, seq=16, layers=1, dim=64,
                               heads=2, hidden=128)
    path = ort_quantize(floating, tmp_path / "bert_qdq.onnx", sizes={"batch": 1, "seq": 16})
    assert main(["run", "-q", "-m", str(path), "-t", "x86_avx2", "--size", "batch=1,2", "--size", "seq=5,16",
                 "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["sizes"], r["coverage"], r["verified"]) for r in result["sizes"]] == [
        ({"batch": 1, "seq": 5}, 1.0, True), ({"batch": 2, "seq": 16}, 1.0, True)]
    assert result["quantized"]["integer"] and not result["quantized"]["kept"]
    # the GELU's fourteen requantized steps are one byte table, looked up in FFN1's write-back
    assert [c.split(":")[0] for c in result["byte_tables"]["chains"]] == ["lv85 -> lv103"]
    assert len(result["byte_tables"]["softmaxes"]) == 1  # the attention's, its exp from a pair table
    ffn1 = [f for f in result["functions"] if f["name"].endswith("byte_lookup")]
    assert len(ffn1) == 1 and ffn1[0]["template"] == "x86_avx2" and "byte_lookup" in ffn1[0]["epilogue"]


def test_a_decoder_layer_with_its_kv_cache_offloads_every_mac_at_each_size(tmp_path, capsys):
    """The decode model a serving export writes (`tirbyoc.testing.decoder`): the KV cache's
    ``past`` positions in, ``past + seq`` out through a Concat, so the attention's matmuls see
    ``past + seq`` only as a sum (Relax passes ``past`` as a scalar parameter, which the checks
    bind too): every MAC offloaded and verified at each size, from one build."""
    import json

    pytest.importorskip("onnx")
    from tirbyoc.app.commands.cli import main
    from tirbyoc.testing.decoder import float_llama_layer

    path = float_llama_layer(tmp_path / "decode.onnx", hidden=64, heads=2, ffn=96)
    assert main(["run", "-q", "-m", str(path), "-t", "x86_fp32_avx2", "--size", "batch=1,2", "--size", "seq=1,3",
                 "--size", "past=5,9", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["sizes"], r["coverage"], r["verified"]) for r in result["sizes"]] == [
        ({"batch": 1, "seq": 1, "past": 5}, 1.0, True), ({"batch": 2, "seq": 3, "past": 9}, 1.0, True)]
    assert result["operands_read_in_place"] == 1  # q . k^T reads the key cache as it lies
