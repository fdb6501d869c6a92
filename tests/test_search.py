"""Searched sweeps: the space, the strategies, the results file, the engines, and a search of
vta variants on a local Dask cluster whose rows are the serial ones (a worker killed
mid-run loses none)."""

import json
import os
import signal
import time

import pytest

from tirbyoc.app.sweeping.engines import DaskEngine, LocalEngine
from tirbyoc.app.sweeping.objectives import OBJECTIVES, objective, pareto_front
from tirbyoc.app.options import RunOptions
from tirbyoc.app.sweeping.search_space import Constraint, SearchSpace, point_key
from tirbyoc.app.sweeping.strategies import strategy
from tirbyoc.app.sweeping.sweep_point import SweepPoint
from tirbyoc.app.sweeping.sweep_results import ResultsFile
from tirbyoc.errors import TirbyocError
from tirbyoc.testing.workers import kill_a_worker_after


# ------------------------------------------------------------------------ the space
def test_a_space_takes_choices_ranges_and_powers_of_two(tmp_path):
    space = SearchSpace.parse(["BLOCK_OUT=8,16,32", "ACC_KIB=32..256:x2", "DMA_LATENCY=10..30:10",
                               "DOUBLE_BUFFER=true,false"])
    assert space.params == {"block_out": [8, 16, 32], "acc_kib": [32, 64, 128, 256],
                            "dma_latency": [10, 20, 30], "double_buffer": [True, False]}
    assert space.size == 3 * 4 * 3 * 2 and space.grid()[:2] == [
        {"block_out": 8, "acc_kib": 32, "dma_latency": 10, "double_buffer": True},
        {"block_out": 8, "acc_kib": 32, "dma_latency": 10, "double_buffer": False}]
    path = tmp_path / "space.json"
    path.write_text(json.dumps({"BLOCK_OUT": [8, 16], "WGT_KIB": "64..256:x2"}))
    both = SearchSpace.parse(["BLOCK_OUT=32"], str(path))
    assert both.params == {"block_out": [32], "wgt_kib": [64, 128, 256]}  # the flag wins


@pytest.mark.parametrize("spec,why", [("BLOCK_OUT", "NAME=V1,V2"), ("A=8..4", "LO <= HI"),
                                      ("A=0..64:x2", "factor"), ("A=1..x", "a range is"), ("A=8,8", "twice")])
def test_a_bad_space_says_how_to_write_it(spec, why):
    with pytest.raises(TirbyocError, match=why):
        SearchSpace.parse([spec])


def test_constraints_bound_parameters_and_objectives():
    c = Constraint.parse("scratchpad_kib<=512")
    assert (c.name, c.op, c.value) == ("scratchpad_kib", "<=", 512) and c.holds(512) and not c.holds(513)
    assert not c.holds(None) and str(c) == "scratchpad_kib<=512"
    with pytest.raises(TirbyocError, match="NAME<=VALUE"):
        Constraint.parse("scratchpad <= lots")


# ------------------------------------------------------------------- strategies
def _cycles(params):  # a smooth made-up cost with one best point, for the strategies alone
    return (params["a"] - 13) ** 2 + (params["b"] - 5) ** 2 * 3 + 100


def _drive(strat, budget):
    seen = []
    while len(seen) < budget:
        batch = strat.ask(2)
        if not batch:
            break
        for p in batch:
            seen.append(p)
            strat.tell(p, (_cycles(p),))
    return seen


def test_grid_and_random_strategies_propose_every_point_once():
    space = SearchSpace.parse(["A=0..19", "B=0..9"])
    grid = _drive(strategy("grid", space, [objective("cycles")]), 1000)
    rnd = _drive(strategy("random", space, [objective("cycles")], seed=3), 1000)
    assert grid == space.grid()
    assert sorted(map(point_key, rnd)) == sorted(map(point_key, grid)) and rnd != grid


def test_tpe_finds_the_best_point_in_a_third_of_the_grid():
    pytest.importorskip("optuna")
    space = SearchSpace.parse(["A=0..19", "B=0..9"])
    seen = _drive(strategy("tpe", space, [objective("cycles")], seed=0), space.size // 3)
    assert len({point_key(p) for p in seen}) == len(seen)  # never twice
    best = min(_cycles(p) for p in seen)
    assert best <= 1.02 * 100, best  # the grid's best is 100


def test_the_pareto_front_keeps_only_undominated_points():
    objs = [objective("cycles"), objective("scratchpad_kib")]
    values = [(100, 512), (120, 256), (100, 600), (150, 256), (90, 1024), (120, 256)]
    assert pareto_front(values, objs) == [0, 1, 4, 5]
    busy = [objective("cycles"), objective("compute_busy")]  # maximised
    assert pareto_front([(100, 0.5), (100, 0.9), (90, 0.2)], busy) == [1, 2]
    assert set(OBJECTIVES) >= {"cycles", "compute_busy", "dma_bytes", "scratchpad_kib"}


# ------------------------------------------------------------------- results file
def test_the_results_file_resumes_and_survives_a_row_cut_short(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"model": "m", "template": "vta"}
    store = ResultsFile(path, header)
    store.add(SweepPoint({"block_out": 8}, cycles=10).to_json())
    store.add(SweepPoint({"block_out": 8}, cycles=99).to_json())  # a point has one row
    with open(path, "a") as f:
        f.write('{"params": {"block_out": 16}, "cyc')  # killed mid-write
    again = ResultsFile(path, header)
    assert list(again.rows) == [point_key({"block_out": 8})] and {"block_out": 8} in again
    assert again.rows[point_key({"block_out": 8})]["cycles"] == 10
    with pytest.raises(TirbyocError, match="holds another sweep"):
        ResultsFile(path, {"model": "other", "template": "vta"})


# ------------------------------------------------------------------------ engines
def _square(scale, params):
    return scale * params["x"] ** 2


def _die_once(marker, params):
    """Kills its own process the first time it runs for x == 2 (a worker lost mid-point)."""
    if params["x"] == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return params["x"]


def _collect(engine, n):
    out, t0 = [], time.monotonic()
    while len(out) < n and time.monotonic() - t0 < 120:
        out += engine.wait(timeout=5)
    return sorted((p["x"], r, why) for p, r, why in out)


@pytest.mark.parametrize("kind", [LocalEngine, DaskEngine])
def test_an_engine_runs_every_point_once_and_reruns_one_whose_worker_died(kind, tmp_path):
    if kind is DaskEngine:
        pytest.importorskip("distributed")
    eng = kind(_die_once, (str(tmp_path / "died"),), 2)
    try:
        for x in range(5):
            eng.submit({"x": x})
        assert _collect(eng, 5) == [(x, x, None) for x in range(5)]
        assert (tmp_path / "died").exists() and eng.running == 0
    finally:
        eng.close()


def test_the_local_engine_refuses_an_address():
    with pytest.raises(TirbyocError, match="--engine dask"):
        LocalEngine(_square, (1,), 2, address="tcp://localhost:8786")


# ----------------------------------------------------------- a search of vta variants
@pytest.mark.slow
def test_a_search_on_a_local_dask_cluster_gives_the_serial_rows_and_survives_a_killed_worker(tmp_path):
    pytest.importorskip("distributed")
    pytest.importorskip("optuna")
    from tirbyoc.app.sweeping.sweep import search_model

    space = SearchSpace.parse(["BLOCK_OUT=8,16", "DMA_BYTES_PER_CYCLE=4,16"])
    serial = search_model("builtin:mlp_int8", "vta", space)
    killed: list = []
    results = tmp_path / "vta.jsonl"
    dask = search_model("builtin:mlp_int8", "vta", space, engine="dask", jobs=2, results=str(results),
                        progress=kill_a_worker_after(1, killed))
    assert killed, "no worker process was found to kill"
    assert [p.row() for p in dask.points] == [p.row() for p in serial.points]  # grid order, no row lost
    assert all(p.verified and p.cycles for p in serial.points)
    assert len(results.read_text().splitlines()) == 1 + 4  # the header and each row once
    searched = search_model("builtin:mlp_int8", "vta", space, strategy="tpe", trials=2, results=str(results),
                            objectives=("cycles", "scratchpad_kib"))
    assert searched.trials == 2 and all(p.row() in [q.row() for q in serial.points] for p in searched.points)
    assert searched.best().row() in [p.row() for p in serial.points]


def test_the_sweep_command_searches_and_reports_the_front(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from tirbyoc.app.commands.cli import main

    plot = tmp_path / "front.png"
    assert main(["sweep", "-q", "-t", "vta", "-m", "builtin:mlp_int8", "-p", "BLOCK_OUT=8,16", "-p", "ACC_KIB=32..128:x2",
                 "--search", "random", "--trials", "2", "--objective", "cycles", "--objective", "scratchpad_kib",
                 "--constraint", "scratchpad_kib<=352", "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["points"]) == 2 and out["search"]["objectives"] == ["cycles", "scratchpad_kib"]
    assert all(s["params"]["acc_kib"] == 128 and s["constraint"] == "scratchpad_kib<=352" for s in out["search"]["skipped"])
    assert out["search"]["best"] in out["points"] and plot.stat().st_size > 0


def test_points_that_differ_only_in_timing_share_one_build_and_give_fresh_rows():
    """vta's DMA bandwidth changes its timing, not its code (`Template.timing_params`): the
    second point re-simulates the first one's build, and its row is what a fresh run gives."""
    import tirbyoc
    from tirbyoc.app.sweeping.sweep import code_key, run_point

    vta = tirbyoc.get_template("vta")
    assert set(vta.timing_params) == {"dma_bytes_per_cycle", "dma_latency", "clock_mhz"}
    assert code_key(vta.variant(dma_bytes_per_cycle=4)) == code_key(vta) != code_key(vta.variant(acc_kib=64))
    shared: dict = {}
    first = run_point("builtin:mlp_int8", vta, {"dma_bytes_per_cycle": 4}, RunOptions(), shared)
    again = run_point("builtin:mlp_int8", vta, {"dma_bytes_per_cycle": 16}, RunOptions(), shared)
    fresh = run_point("builtin:mlp_int8", vta, {"dma_bytes_per_cycle": 16}, RunOptions(), {})
    assert again.row() == fresh.row() and again.cycles < first.cycles and again.verified
    assert again.seconds < fresh.seconds / 3


def test_a_timing_parameter_must_be_a_parameter():
    import tirbyoc

    vta = tirbyoc.get_template("vta")
    with pytest.raises(tirbyoc.TemplateError, match="timing parameter 'dma_speed'"):
        tirbyoc.Template("t", {"kind": "llvm"}, tirbyoc.Runtime.EXTERN_C, params=dict(vta.params),
                         timing_params=("dma_speed",))


def test_a_template_parameter_is_an_objective_to_minimise():
    import tirbyoc

    params = tirbyoc.get_template("vta").params
    width = objective("BLOCK_OUT", params)
    assert width.direction == "minimize" and width.value(SweepPoint({"block_out": 32})) == 32
    assert objective("double_buffer", params).value(SweepPoint({"double_buffer": True})) is None
    with pytest.raises(TirbyocError, match="or a template parameter"):
        objective("area", params)


def _pid(params):
    return os.getpid()


def test_dask_keeps_the_points_of_one_build_on_one_worker():
    pytest.importorskip("distributed")
    eng = DaskEngine(_pid, (), 2)
    try:
        for x in range(6):
            eng.submit({"x": x}, group="a" if x % 2 else "b")
        out, t0 = [], time.monotonic()
        while len(out) < 6 and time.monotonic() - t0 < 60:
            out += eng.wait(timeout=5)
        pids = {g: {pid for p, pid, _ in out if (p["x"] % 2 == 1) == (g == "a")} for g in "ab"}
        assert all(len(v) == 1 for v in pids.values()), pids
    finally:
        eng.close()


def test_dask_joins_a_running_cluster_at_its_address():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        eng = DaskEngine(_square, (3,), 1, address=cluster.scheduler_address)
        try:
            eng.submit({"x": 4})
            assert _collect(eng, 1) == [(4, 48, None)]
        finally:
            eng.close()
        assert cluster.scheduler_address  # the cluster outlives the engine that joined it
