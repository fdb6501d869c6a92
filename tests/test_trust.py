"""What tirbyoc says must be true: comparisons that can fail, inputs in their domain, figures
that do not depend on what ran before. Each test here failed before its fix."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

import tirbyoc
from tirbyoc.ir.domains import Domain, buffer_domains, draw
from tirbyoc.offloading.verification import compare_arrays, verify


# ---------------------------------------------------------------- comparisons (item 2)
def test_tiny_outputs_are_compared_at_their_own_scale():
    ref = np.full((64,), 1e-14, "float32") * np.arange(1, 65, dtype="float32")
    wrong = ref * 3  # an absolute tolerance of ~1e-5 would wave this through
    c = compare_arrays(ref, wrong, "float32", reduction=64)
    assert c.passed is False and c.rel_err > 1
    assert compare_arrays(ref, ref.copy(), "float32", 64).passed is True


@pytest.mark.parametrize("ref,why", [
    (np.zeros((4, 4), "float32"), "all zero"),
    (np.full((4, 4), 0.5, "float32"), "constant"),
    (np.array([1.0, np.nan, 2.0], "float32"), "non-finite"),
    (np.zeros((8,), "int32"), "all zero"),
])
def test_degenerate_references_are_not_meaningfully_checked(ref, why):
    c = compare_arrays(ref, ref.copy())
    assert c.passed is None and why in c.note


def test_a_degenerate_reference_still_catches_a_different_output():
    ref = np.zeros((4, 4), "float32")
    assert compare_arrays(ref, ref + 1).passed is False


@T.prim_func(s_tir=True)
def _zero_output(A: T.Buffer((16, 16), "float32"), B: T.Buffer((16, 16), "float32")):
    for i, j in T.grid(16, 16):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(0)


def test_verify_says_not_meaningfully_checked_for_an_all_zero_output():
    v = verify(_zero_output, _zero_output)
    assert v.passed is None and "all zero" in v.reason
    assert "not meaningfully checked" in v.describe()


def test_verify_reports_relative_error_and_tolerance():
    from tirbyoc.testing.workloads import matmul

    f = matmul(16, 16, 16, "float32", "float32", "float32")
    v = verify(f, f)
    assert v.passed is True and v.max_rel_err == 0 and "tolerance" in v.describe()


@pytest.mark.slow
def test_builtin_resnet50_outputs_are_finite_and_verified_on_blas():
    from tirbyoc.app.running.run import run_model

    r = run_model("builtin:resnet50", ["blas"], repeat=1)
    assert r.verified is True and r.comparison.note is None
    assert 1e-3 < r.comparison.scale < 1e3


def test_builtin_float_models_keep_activations_of_order_one():
    """Weights drawn as torch.nn initialises them (+-1/sqrt(fan-in)): a ResNet-18's logits
    stay O(1) instead of 1e20."""
    from tirbyoc.app.model_in.legalize import legalized_model
    from tirbyoc.app.running.run import model_output as _output

    prepared = legalized_model("builtin:resnet18", ["blas"])
    mod, entry, arrays = prepared.mod, prepared.entry, prepared.arrays
    params = [p.name for p in mod[entry].params]
    w = arrays[params.index("stem.conv.weight")]
    assert np.abs(w).max() <= 1 / np.sqrt(3 * 7 * 7) + 1e-7
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = _output(vm[entry](*[tvm.runtime.tensor(a) for a in arrays]))
    assert np.isfinite(out).all() and 1e-3 < np.abs(out).max() < 100


def test_json_never_prints_nan(capsys, monkeypatch):
    from tirbyoc.app.commands.cli import main
    from tirbyoc.decl import host

    monkeypatch.setattr(host.shutil, "which", lambda prog: None)  # Hexagon code cannot run
    code = main(["run", "-q", "-t", "hexagon_hvx", "-m", "builtin:mlp_int8", "--json"])
    text = capsys.readouterr().out
    assert code == 0 and "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["max_abs_err"] is None


# --------------------------------------------------------------------- domains (item 3)
def _legalized(mod):
    return relax.transform.LegalizeOps()(mod)


def _gather_module():
    @tvm.script.ir_module
    class Gather:
        @R.function
        def main(table: R.Tensor((50, 8), "float32"), ids: R.Tensor((4,), "int64"),
                 x: R.Tensor((4, 8), "int32"), s: R.Tensor((8,), "int32"),
                 d: R.Tensor((4, 8), "int32")):
            with R.dataflow():
                a = R.take(table, ids, axis=0)
                b = R.right_shift(x, s)
                c = R.floor_divide(x, d)
                R.output(a, b, c)
            return (a, b, c)

    return _legalized(Gather)


def test_domains_read_from_the_use_of_a_buffer():
    mod = _gather_module()
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert buffer_domains(funcs["take"])["ids"] == Domain(0, 50, why="indexes table dimension 0")
    assert buffer_domains(funcs["right_shift"])["s"].high == 32
    assert buffer_domains(funcs["floor_divide"])["d"].nonzero


def test_draw_stays_in_the_domain():
    rng = np.random.default_rng(0)
    ids = draw((10000,), "int64", rng, Domain(0, 50))
    assert ids.min() >= 0 and ids.max() < 50
    div = draw((10000,), "int32", rng, Domain(nonzero=True))
    assert (div != 0).all() and (div < 0).any()
    pos = draw((1000,), "float32", rng, Domain(0, None, nonzero=True))
    assert (pos > 0).all()


def test_model_inputs_follow_call_tir_domains():
    from tirbyoc.app.model_in.model_inputs import model_inputs

    mod = _gather_module()
    table, ids, x, s, d = model_inputs(mod, "main", 0)
    assert ids.min() >= 0 and ids.max() < 50
    assert s.min() >= 0 and s.max() < 32 and (d != 0).all()


def test_verify_draws_gather_indices_inside_the_table():
    """Uniform ids in [-64, 64) read outside the table: TVM's own build returns garbage."""
    mod = _gather_module()
    take = next(f for gv, f in mod.functions.items() if gv.name_hint == "take")
    v = verify(take, take)
    assert v.passed is True


def test_run_takes_user_inputs(tmp_path):
    from tirbyoc.app.running.run import run_model

    x = np.full((16, 256), 0.25, "float32")
    np.savez(tmp_path / "in.npz", x=x)
    from tirbyoc.app.model_in.model_inputs import load_inputs

    r = run_model("builtin:mlp", ["blas"], repeat=1, inputs=load_inputs(str(tmp_path / "in.npz")))
    assert r.verified is True
    with pytest.raises(tirbyoc.TirbyocError, match="does not take"):
        run_model("builtin:mlp", ["blas"], repeat=1, inputs={"y": x})


def test_verify_accepts_a_scalar_for_a_0d_buffer():
    @T.prim_func(s_tir=True)
    def scale(A: T.Buffer((8,), "float32"), s: T.Buffer((), "float32"), B: T.Buffer((8,), "float32")):
        for i in range(8):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] * s[()]

    v = verify(scale, scale, inputs={"s": 2.0})
    assert v.passed is True


# ------------------------------------------------------------- OpenBLAS threads (item 9)
def test_blas_runs_single_threaded_inside_tvm_loops_and_whole_on_tvms_pool(monkeypatch):
    """Tile calls happen inside TVM's parallel loops: OpenBLAS's own pool must not fight TVM's.
    A whole matmul (a packed kernel on the VM's thread) runs on TVM's pool, single-threaded
    GEMMs, unless TIRBYOC_BLAS_THREADS asks for OpenBLAS's own threads."""
    import ctypes

    import scipy_openblas32 as ob
    from tirbyoc_intrinsics.blas import LIBRARY, PACKED_LIBRARY

    from tirbyoc._tvm import to_tensor

    openblas = ctypes.CDLL(str(next(__import__("pathlib").Path(ob.get_lib_dir()).glob("*.so*"))))
    threads = openblas.scipy_openblas_get_num_threads
    shim = LIBRARY.load()
    a = np.ones((8, 8), "float32")
    c = np.zeros((8, 8), "float32")
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    shim.tirbyoc_blas_sgemm.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                        ctypes.c_void_p, ctypes.c_int]
    openblas.scipy_openblas_set_num_threads(2)
    assert shim.tirbyoc_blas_sgemm(0, 8, 8, 8, ptr(a), 8, ptr(a), 8, 0.0, ptr(c), 8) == 0
    assert threads() == 1 and np.allclose(c, 8)

    monkeypatch.delenv("TIRBYOC_BLAS_THREADS", raising=False)
    matmul = PACKED_LIBRARY.runtime_module()["tirbyoc_blas_matmul_nn"]
    out = to_tensor(np.zeros((8, 8), "float32"))
    matmul(to_tensor(a), to_tensor(a), out)
    assert threads() == 1 and np.allclose(out.numpy(), 8)

    monkeypatch.setenv("TIRBYOC_BLAS_THREADS", "2")
    out = to_tensor(np.zeros((8, 8), "float32"))
    matmul(to_tensor(a), to_tensor(a), out)
    assert threads() == 2 and np.allclose(out.numpy(), 8)
    assert shim.tirbyoc_blas_sgemm(0, 8, 8, 8, ptr(a), 8, ptr(a), 8, 0.0, ptr(c), 8) == 0
    assert threads() == 1


# ------------------------------------------- matches the rewriter refuses (item 4)
def test_a_gemv_under_a_gemm_intrinsic_is_not_reported_as_a_match():
    """cuda_mma's 16x16x16 MMA has no row to give a GEMV's unit M: offload always refused
    it, so explain must not report it as a match (it names the axis instead)."""
    from tirbyoc.matching.matcher import explain
    from tirbyoc.testing.workloads import matmul

    f = matmul(1, 64, 64, "float16", "float16", "float32", trans_b=True)
    (r,) = explain(f, tirbyoc.get_template("cuda_mma"))
    assert r.best is None and "intrinsic axis" in r.reason and "size 16" in r.reason
    # where the intrinsic has no such axis (vta's 1x16x16 core), the GEMV still matches
    (v,) = explain(matmul(1, 64, 64, "int8", "int8", "int32", trans_b=True), tirbyoc.get_template("vta"))
    assert v.best is not None


# -------------------------------------- workloads that should be taken (item 5)
def test_te_conv2d_nhwc_with_an_unsimplified_group_index_offloads():
    """TVM's te conv2d_nhwc indexes the input with co // CO * CI + rc (= rc within bounds)."""
    from tvm import te
    from tvm.s_tir.meta_schedule.testing import te_workload

    f = te.create_prim_func(te_workload.conv2d_nhwc(1, 14, 14, 64, 64, 3, 1, 1))
    out = tirbyoc.offload(f, "blas")
    (conv,) = [b for b in out.blocks if b.block == "conv2d_nhwc"]
    assert conv.offloaded and out.verification.passed is True


def _tiled_matmul(m, n, k, split_k: bool):
    """A float matmul scheduled into 16-wide tiles (k too when ``split_k``): (schedule, block,
    loops outer to inner)."""
    from tirbyoc._tvm import Schedule
    from tirbyoc.testing.workloads import matmul

    sch = Schedule(matmul(m, n, k, "float32", "float32", "float32"))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    io, ii = sch.split(i, [None, 16])
    jo, ji = sch.split(j, [None, 16])
    if split_k:
        ko, ki = sch.split(kk, [None, 16])
        sch.reorder(io, jo, ko, ii, ji, ki)
        return sch, block, (io, jo, ko, ii, ji, ki)
    sch.reorder(io, jo, ii, ji, kk)
    return sch, block, (io, jo, ii, ji, kk)


def test_a_scheduled_loop_nest_with_a_decomposed_init_offloads():
    """Split loops and decompose_reduction's init block inside them: merged and unsplit."""
    sch, block, loops = _tiled_matmul(64, 48, 32, split_k=False)
    k = loops[-1]
    sch.decompose_reduction(block, k)
    out = tirbyoc.offload(sch.mod["main"], "blas")
    (update,) = [b for b in out.blocks if b.block == "C_update"]
    assert update.offloaded and out.verification.passed is True


# ------------------------------------------------------------------- counts (item 6)
def test_a_blockized_gemm_counts_its_macs_where_they_compute():
    from tirbyoc.ir.pattern import block_macs

    sch, _, loops = _tiled_matmul(64, 64, 64, split_k=True)
    sch.blockize(loops[3])  # the inner 16x16x16 tile becomes a block
    func = sch.mod["main"]
    assert block_macs(func) == {"C": 64 ** 3}
    out = tirbyoc.offload(func, "blas")
    assert out.coverage == 1.0 and out.verification.passed is True


def test_match_and_run_count_macs_the_same_way():
    """Padding, element-wise and pooling blocks do no multiply-accumulates anywhere."""
    from tvm import te
    from tvm.s_tir.meta_schedule.testing import te_workload

    from tirbyoc.matching.matcher import explain
    from tirbyoc.relax.bridge import mac_blocks

    f = te.create_prim_func(te_workload.conv2d_nhwc(1, 14, 14, 64, 64, 3, 1, 1))
    counted = {r.block: r.macs for r in explain(f, tirbyoc.get_template("blas"))}
    assert counted == {"PadInput": 0, "conv2d_nhwc": 14 * 14 * 64 * 3 * 3 * 64}
    assert mac_blocks(f) == {"conv2d_nhwc": counted["conv2d_nhwc"]}


# --------------------------------------------------- the benchmark's denominator (item 8)
def test_a_kernel_above_the_measured_peak_stops_the_benchmark(monkeypatch):
    """bench/gemm.py once printed kernels at 1.7x "of peak": the peak had been measured once,
    while the machine was busy. Now the best of samples is the denominator, and a fraction
    above 1 ends the run with the reason."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "gemm_workers.py"
    spec = importlib.util.spec_from_file_location("bench_gemm_workers", path)
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    assert workers.fraction_of_peak(414.0, 460.0, "GEMM", 2) == pytest.approx(0.9)
    assert workers.fraction_of_peak(200.0, 240.0, "GEMM", 1) == pytest.approx(200 / 240)
    assert workers.fraction_of_peak(469.0, 467.0, "conv", 1) == pytest.approx(469 / 467)  # timing noise at the peak
    with pytest.raises(SystemExit, match="busy"):
        workers.fraction_of_peak(780.0, 460.0, "GEMM 1024^3", 2)


# ----------------------------------------------------- the baseline's target (item 7)
def test_both_builds_use_this_cpu_and_the_json_says_which_target():
    """blas's template names no CPU: the baseline was built for generic x86-64 while the
    offload called OpenBLAS. Both now build for this CPU, and the JSON says so."""
    from tirbyoc.decl.host import host_target_spec
    from tirbyoc.app.run_target import complete_target
    from tirbyoc.app.running.run import run_model

    spec = host_target_spec()
    host = spec["mcpu"]
    assert complete_target({"kind": "llvm", "num-cores": 2}) == {**spec, "num-cores": 2}
    assert complete_target({"kind": "llvm", "mcpu": "cascadelake"})["mcpu"] == "cascadelake"
    r = run_model("builtin:mlp", ["blas"], repeat=1, baseline="dlight")
    out = r.to_json()
    assert out["target"]["mcpu"] == host and out["target"]["num-cores"] == 2
    assert out["baseline"]["name"] == "dlight" and "dlight" in out["baseline"]["what"]
    assert f"mcpu={host}" in r.table() and r.verified is True


def test_a_template_naming_a_cpu_builds_for_this_one_where_it_has_its_features():
    """x86_vnni names cascadelake; a run on a CPU with every one of its instruction-set
    features builds for this CPU instead (LLVM tunes for the CPU that runs the code); one
    lacking any (or a target for another machine) keeps the named CPU."""
    from tirbyoc._tvm import isa_features, make_target
    from tirbyoc.decl.host import host_target, host_target_spec
    from tirbyoc.app.run_target import for_this_cpu

    host = host_target()
    declared = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
    has_all = isa_features(make_target(declared)) <= isa_features(host)
    expected = {**declared, **host_target_spec()} if has_all else declared
    assert for_this_cpu(declared) == expected
    amx = {"kind": "llvm", "mcpu": "graniterapids"}
    if not isa_features(make_target(amx)) <= isa_features(host):  # every CPU seen here lacks AMX
        assert for_this_cpu(amx) == amx
    other = {"kind": "llvm", "mtriple": "hexagon", "mcpu": "hexagonv66"}
    assert for_this_cpu(other) == other
