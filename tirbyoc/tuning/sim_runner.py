"""A MetaSchedule runner whose measurement is the accelerator simulator's cycle count.

For a simulated template (``Runtime.SIMULATOR``: vta and templates declared like it) host
seconds say nothing about the accelerator: the candidate runs on the host, calling
``tirbyoc.sim.*`` per tile, and what matters is the cycles the modelled accelerator would
take. `SimulatorRunner` loads each built candidate in this process, runs it once on random
inputs with the template's simulator configured, and reports ``cycles / clock`` as the
candidate's run time - MetaSchedule ranks, keeps and reports that. The cycles themselves
are kept in `SimulatorRunner.cycles` (artifact -> cycles) for reports.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerResult

from tirbyoc.decl.registry import as_template
from tirbyoc.errors import TirbyocError
from tirbyoc.ir.domains import random_array


def _random_args(args_info, seed: int):


    rng = np.random.default_rng(seed)
    args = []
    for info in args_info:
        kind, dtype, shape = info.as_json()
        if kind != "TENSOR":
            raise NotImplementedError(f"argument kind {kind}")
        args.append(tvm.runtime.tensor(random_array(tuple(int(s) for s in shape), str(dtype), rng)))
    return args


@derived_object
class SimulatorRunner(PyRunner):
    """Measure candidates in ``template``'s simulator (see the module docstring).

    ``clock_hz``: converts cycles to the seconds MetaSchedule records (default the
    template's simulator clock)."""

    def __init__(self, template, clock_hz: float | None = None) -> None:

        super().__init__()
        self.template = as_template(template)
        sim = getattr(self.template, "simulator", None)
        if sim is None:

            raise TirbyocError(f"template {self.template.name!r} has no simulator; measure it with "
                               "MetaSchedule's LocalRunner (or RPCRunner) instead")
        self.sim = sim
        self.clock_hz = float(clock_hz or sim.config.clock_mhz * 1e6)
        self.cycles: dict[str, int] = {}

    def run(self, runner_inputs):
        return [self._measure(i, inp) for i, inp in enumerate(runner_inputs)]

    def _measure(self, index: int, inp):

        try:
            mod = tvm.runtime.load_module(str(inp.artifact_path))
            args = _random_args(inp.args_info, seed=index)
            self.sim.configure()  # timing set, state cleared: this run alone is counted
            mod["main"](*args)  # MetaSchedule names every task's function main
            cycles = self.sim.stats().cycles
            self.cycles[str(inp.artifact_path)] = cycles
            result = RunnerResult(run_secs=[cycles / self.clock_hz], error_msg=None)
        except Exception as err:  # noqa: BLE001 - a candidate that fails is reported, not raised
            result = RunnerResult(run_secs=None, error_msg=f"simulator run failed: {err}")
        return RunnerFuture(f_done=lambda: True, f_result=lambda: result)


__all__ = ["SimulatorRunner"]
