"""MetaSchedule integration: tirbyoc's schedule rule, tuning, applying a database, the
simulator runner and remote measurement through an RPC tracker on loopback.

Tuning is slow on two cores: each test measures a handful of candidates."""

import socket
import time

import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

import tirbyoc
from tirbyoc.testing import workloads
from tirbyoc.errors import RewriteError, TirbyocError
from tirbyoc._tvm import structural_equal
from tirbyoc.tuning import (SimulatorRunner, TirbyocRule, load_database, offloadable_tasks, prepare,
                            rpc_runner, tune, tuned_schedules, tuning_target)
from tirbyoc.tuning.tasks import workload
from vnni import NAME, VNNI  # the candidates run here: x86_vnni, or its emulation


def _design_spaces(func, template):
    rule = TirbyocRule(template)
    gen = ms.space_generator.PostOrderApply(sch_rules=[rule], postprocs=[], mutator_probs={})
    with tirbyoc.tuning.without_tvm_intrinsic_library():
        ctx = ms.TuneContext(tvm.IRModule({"main": func}), target=tuning_target(template),
                             space_generator=gen)
    return ctx.generate_design_space(), rule


def _replay(space, func, seed):
    """The design space's trace with fresh random decisions, as MetaSchedule's search does."""
    sch = Schedule(tvm.IRModule({"main": func}), seed=seed + 1)
    space.trace.apply_to_schedule(sch, remove_postproc=True,
                                  decision_provider=lambda inst, inputs, attrs, decision: None)
    return sch.mod["main"]




@pytest.mark.parametrize("shape, trans_b", [((64, 96, 128), True), ((50, 40, 70), False)])
def test_rule_space_replays_and_verifies(shape, trans_b):
    """Every sampled candidate of the space (packed weights; padding for odd extents) builds
    and computes what the workload does."""
    func = workloads.matmul(*shape, "uint8", "int8", "int32", trans_b=trans_b)
    spaces, rule = _design_spaces(func, NAME)
    assert rule.offloaded == {"C": f"{NAME}.dot_16x4_u8i8i32"}
    assert len(spaces) == 2  # the default schedule's register block, and a sampled one
    sampled = [s for s in spaces if any(str(i.kind.name) == "SamplePerfectTile" for i in s.trace.insts)]
    assert len(sampled) == 1
    candidates = {_replay(sampled[0], func, seed).script() for seed in range(8)}
    assert len(candidates) > 1, "sampling never changed the register block"
    for text in list(candidates)[:3]:
        cand = tvm.script.from_source(text)
        assert '(16, 4), "int8", offset_factor=1)' in text  # B's tile, as the intrinsic takes it
        assert ("vpdpbusd" in text) == (not VNNI.emulates)
        check = tirbyoc.verify(func, cand, tuning_target(NAME))
        assert check.passed, check.describe()


def test_rule_leaves_unmatched_blocks_and_says_why():
    func = workloads.matmul(32, 32, 32, "float32", "float32", "float32")
    spaces, rule = _design_spaces(func, NAME)
    assert len(spaces) == 1
    assert "C" in rule.refusals and "C" not in rule.offloaded
    assert tirbyoc._tvm.structural_equal(spaces[0].mod["main"].body, func.body)


def test_commuted_product_needs_prepare():
    """A product written B * A is reordered by an IR edit, which a trace cannot replay: the
    traced rewrite refuses it, and `prepare` makes the workload traceable."""
    from tirbyoc.rewrite.block.tensorize import tensorize_in
    from tirbyoc.tuning.preparation import best_matches

    func = workloads.matmul(32, 32, 32, "uint8", "int8", "int32", trans_b=True, swap_mul=True)
    m = best_matches(func, VNNI)["C"]
    with pytest.raises(RewriteError, match="prepare"):
        tensorize_in(Schedule(func), m)
    ready = prepare(func, NAME)
    assert not ready.same_as(func)
    spaces, rule = _design_spaces(ready, NAME)
    assert rule.offloaded and not rule.refusals.get("C")
    assert tirbyoc.verify(func, _replay(spaces[-1], ready, 0), tuning_target(NAME)).passed


def test_separate_init_needs_prepare():
    func = workloads.matmul(32, 32, 32, "uint8", "int8", "int32", trans_b=True, init="outside")
    spaces, rule = _design_spaces(func, NAME)
    assert "prepare" in rule.refusals["C"]
    spaces, rule = _design_spaces(prepare(func, NAME), NAME)
    assert rule.offloaded


def test_tasks_are_distinct_and_weighted():
    from tirbyoc.app.model_in.legalize import legalized_model

    mod = legalized_model("builtin:cnn_int8", [VNNI]).mod
    tasks, skipped = offloadable_tasks(mod, NAME)
    assert tasks and all(t.intrinsics and t.macs > 0 and t.weight >= 1 for t in tasks)
    names = [n for t in tasks for n in t.functions]
    assert len(names) == len(set(names))


@pytest.mark.slow  # 31 s: tune then run a model (tuning itself is in the default run)
def test_tune_then_run_with_database(tmp_path):
    """`tune` fills a database; `run_model(database=...)` applies it, verified."""
    from tirbyoc.app.running.run import run_model

    from tirbyoc.app.model_in.legalize import legalized_model

    mod = legalized_model("builtin:mlp_int8", [VNNI]).mod
    seen = []
    result = tune(mod, NAME, trials=5, work_dir=str(tmp_path),
                  progress=lambda done, total, name: seen.append((done, total)))
    assert len(result.tasks) == 3 and result.trials == 5
    assert result.valid == result.trials, result.table()
    assert seen and seen[-1] == (5, 5)
    # each task's first record is its untuned default rewrite, so tuning never ends worse
    records = result.database.get_all_tuning_records()
    assert len(records) == 5
    for task in result.tasks:
        wl = result.database.commit_workload(workload(task.task.func))
        defaults = [r for r in records if structural_equal(r.workload.mod, wl.mod)
                    and not any(str(i.kind.name).startswith("Sample") for i in r.trace.insts)]
        assert defaults, task.task.name
        sch = Schedule(wl.mod)
        defaults[0].trace.apply_to_schedule(sch, remove_postproc=False)
        untuned = tirbyoc.offload(prepare(task.task.func, NAME), NAME).func
        assert structural_equal(sch.mod["main"].without_attr("global_symbol"),
                                 untuned.without_attr("global_symbol"))
    assert all(t.best_secs and t.best_secs < 1e-2 for t in result.tasks if t.trials)
    assert (tmp_path / "database_tuning_record.json").exists()
    data = result.to_json()
    assert data["valid_fraction"] == 1.0 and data["unit"] == "s"
    assert data["emulates"] == VNNI.emulates and ("emulates" in result.table()) == bool(VNNI.emulates)

    run = run_model("builtin:mlp_int8", [VNNI], database=str(tmp_path), repeat=2)
    tuned = [f for f in run.report.functions if f.tuned]
    assert tuned, run.table()
    assert all(f.verified for f in tuned)
    assert run.verified is True
    assert run.report.coverage == 1.0


def test_database_errors(tmp_path):
    with pytest.raises(TirbyocError, match="no MetaSchedule database"):
        load_database(str(tmp_path))
    (tmp_path / "database_workload.json").write_text("not json\n")
    (tmp_path / "database_tuning_record.json").write_text("")
    with pytest.raises(TirbyocError, match="cannot read"):
        load_database(str(tmp_path))


def test_simulator_runner_measures_cycles(tmp_path):
    """On vta the measurement is the simulator's cycle count of the candidate, prepared as
    `offload` prepares its result (K = 2048: tiles streamed through the scratchpads): the best
    candidate, replayed from the database and run as `offload` gives it, takes the cycles the
    tuning measured. `offload(tuned=...)` keeps whichever of it and the untuned rewrite takes
    fewer cycles, and says when the tuned one lost."""
    import numpy as np

    from tirbyoc.decl.host import host_target
    from tirbyoc.offloading.offloader import prepare_for_simulator
    from tirbyoc.offloading.verification import compile_func

    vta = tirbyoc.get_template("vta")
    func = workloads.matmul(32, 64, 2048, "int8", "int8", "int32", trans_b=True)
    runner = SimulatorRunner("vta")
    result = tune(func, "vta", trials=2, work_dir=str(tmp_path), runner=runner)
    assert result.unit == "cycles"
    assert result.valid >= 1, result.table()
    assert runner.cycles and all(c > 0 for c in runner.cycles.values())
    best = result.tasks[0].best_secs
    assert best == pytest.approx(min(runner.cycles.values()), rel=1e-6)
    lookup = tuned_schedules(str(tmp_path))
    new, blocks = lookup(func, vta)
    assert blocks == {"C": result.tasks[0].task.intrinsics[0]}

    def cycles(f):
        exe = compile_func(f, host_target(), "offloaded")
        vta.simulator.configure()
        exe(*[tvm.runtime.tensor(np.zeros(s, d)) for s, d in (((32, 2048), "int8"), ((64, 2048), "int8"),
                                                                ((32, 64), "int32"))])
        return vta.simulator.stats().cycles

    tuned_cycles = cycles(prepare_for_simulator(new, vta))
    assert tuned_cycles == min(runner.cycles.values())  # replayed as measured
    untuned_cycles = cycles(tirbyoc.offload(func, vta, verify=False).func)
    out = tirbyoc.offload(func, "vta", tuned=lookup)
    assert out.verification.passed and out.offloaded
    assert cycles(out.func) == min(tuned_cycles, untuned_cycles)
    lost = [s for s in out.blocks[0].steps if "tuned schedule not used" in s]
    assert bool(lost) is (untuned_cycles < tuned_cycles), out.blocks[0].steps


def test_simulator_runner_refuses_host_templates():
    with pytest.raises(TirbyocError, match="no simulator"):
        SimulatorRunner("x86_vnni")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rpc_runner_on_loopback(tmp_path):
    """Candidates measured on a server registered with a tracker, as on a remote board."""
    pytest.importorskip("tornado")
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    port = _free_port()
    tracker = Tracker(host="127.0.0.1", port=port, port_end=port + 50, silent=True)
    server_port = _free_port()
    server = rpc.Server(host="127.0.0.1", port=server_port, port_end=server_port + 50, key="tirbyoc-test",
                        tracker_addr=("127.0.0.1", tracker.port), silent=True)
    try:
        time.sleep(0.5)
        func = workloads.matmul(64, 64, 64, "uint8", "int8", "int32", trans_b=True)
        result = tune(func, NAME, trials=2, work_dir=str(tmp_path),
                      runner=rpc_runner(f"127.0.0.1:{tracker.port}", "tirbyoc-test"))
        assert result.valid == result.trials == 2, result.table()
    finally:
        server.terminate()
        tracker.terminate()


@pytest.mark.parametrize("tracker, key, match", [("localhost", "k", "HOST:PORT"),
                                                 ("127.0.0.1:x", "k", "HOST:PORT"),
                                                 ("127.0.0.1:9190", "", "rpc-key")])
def test_rpc_runner_bad_arguments(tracker, key, match):
    with pytest.raises(TirbyocError, match=match):
        rpc_runner(tracker, key)


def test_cli_tune_arguments(capsys):
    from tirbyoc.app.commands.cli import main

    assert main(["tune", "--trials", "0"]) == 2
    assert "--trials" in capsys.readouterr().err
    assert main(["tune", "--rpc-tracker", "127.0.0.1:9190"]) == 2
    assert "together" in capsys.readouterr().err
    assert main(["run", "--database", "/nonexistent/dir"]) == 2
    assert "no MetaSchedule database" in capsys.readouterr().err
    # Hexagon code runs here only under QEMU, which does not time it: refused, with what to give
    assert main(["tune", "-q", "-t", "hexagon_hvx", "-m", "builtin:mlp_int8", "--trials", "2"]) == 2
    assert "qemu-hexagon" in capsys.readouterr().err


def test_tune_on_blas_measures_valid_candidates(tmp_path):
    """The runner's workers load the template's C library first: without it every blas
    candidate crashed its worker ("Subprocess terminated") and none was valid."""
    func = workloads.matmul(64, 64, 64, "float32", "float32", "float32")
    result = tune(func, "blas", trials=2, work_dir=str(tmp_path))
    assert result.trials >= 1 and result.valid == result.trials, result.table()


def test_extern_library_loads_in_a_fresh_process():
    """The shim records OpenBLAS as a dependency (a linker defaulting to --as-needed dropped
    it), so a process that never imported scipy_openblas32 can load it."""
    import subprocess
    import sys

    from tirbyoc_intrinsics.blas import LIBRARY

    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
            "assert hasattr(lib, 'tirbyoc_blas_sgemm')")
    subprocess.run([sys.executable, "-c", code, str(LIBRARY.path)], check=True)
