"""An independent reference for ONNX models: ONNX Runtime runs the same file on the same inputs.

Two sessions are made. The fast one is what a user of ONNX Runtime gets (all graph
optimizations: a QDQ model's chains fused into its integer kernels); it is timed, with its
thread pool as large as TVM's and its spinning off (``session.intra_op.allow_spinning = 0``)
so that the two engines' pools do not steal each other's cores. The second runs the graph
as written (basic optimizations only: QuantizeLinear / DequantizeLinear around float
operators, the ONNX semantics); on x86 CPUs without VNNI, ONNX Runtime's fused u8 x s8
kernels can saturate 16-bit intermediate sums and leave the ONNX semantics by several
quantization steps, which this second output shows.

Agreement: a QDQ model's output is a multiple of its last quantization step (up to the
float32 rounding of ``(q - z) * step`` at the output's magnitude); tirbyoc agrees when it is
at most one step from ONNX Runtime, counted in whole steps (`steps_apart`), so that a report
never reads "1 step" and "disagrees" at once. A float output agrees within `FLOAT_RTOL` of its
scale.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from tirbyoc.errors import TirbyocError

FLOAT_RTOL = 1e-4  # relative to the output's largest magnitude


@dataclass
class Reference:
    name: str
    latency_ms: float
    max_abs_err: float  # tirbyoc's output against the fast session's
    agree: bool
    step: float | None  # the output's quantization step (QDQ models), else None
    spec_max_abs_err: float  # tirbyoc's output against the graph as written
    threads: int

    def describe(self) -> str:
        n = steps_apart(self.max_abs_err, self.step) if self.step else None
        unit = f" = {n} step{'' if n == 1 else 's'}" if n is not None else ""
        text = (f"onnxruntime {self.latency_ms:.3f} ms ({self.threads} threads, timed in this process beside "
                f"TVM, its spinning off; bench/models.py times each engine alone); tirbyoc's output "
                f"{'agrees' if self.agree else 'DISAGREES'} (max abs diff {self.max_abs_err:.3g}{unit})")
        if self.step and self.spec_max_abs_err < self.max_abs_err:
            text += (f"; against the graph as written (ONNX semantics) the diff is "
                     f"{self.spec_max_abs_err:.3g} - ONNX Runtime's fused int8 kernels differ from it here")
        return text

    def to_json(self) -> dict:
        return {"name": self.name, "latency_ms": self.latency_ms, "max_abs_err": self.max_abs_err,
                "agree": self.agree, "step": self.step, "spec_max_abs_err": self.spec_max_abs_err,
                "threads": self.threads}


def ort_session(path, level, threads: int, spinning: bool = False):
    """An ONNX Runtime session on the CPU with ``threads`` intra-op threads, its pool's
    spinning off by default (so that it does not steal the cores of an engine timed beside it
    in the same process); ``spinning=True``: ONNX Runtime's own default, for a process of its
    own."""
    # deferred: optional dependency (onnxruntime)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def output_step(path) -> float | None:
    """The quantization step of a QDQ model's (first) output: the scale of the
    DequantizeLinear that produces it, when it is a constant scalar."""
    # deferred: optional dependency (onnx)
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = model.graph.output[0].name
    for node in model.graph.node:
        if out in node.output and node.op_type == "DequantizeLinear":
            scale = inits.get(node.input[1])
            if scale is not None and scale.size == 1:
                return float(scale.reshape(()))
    return None


def steps_apart(err: float, step: float) -> int:
    """How many whole quantization steps ``err`` (the largest difference of two dequantized
    outputs) is: the outputs are multiples of ``step`` up to float32 rounding, so the
    nearest whole number."""
    return int(round(err / step))


def agrees(mine: np.ndarray, theirs: np.ndarray, step: float | None) -> tuple[bool, float]:
    """(whether two outputs agree - within one quantization step for a QDQ model's, within
    `FLOAT_RTOL` of the scale for a float one - and their largest difference)."""
    err = float(np.abs(np.asarray(mine, np.float64) - np.asarray(theirs, np.float64)).max(initial=0.0))
    if step:
        return steps_apart(err, step) <= 1, err
    return err <= FLOAT_RTOL * max(float(np.abs(theirs).max(initial=0.0)), 1e-30), err


def _flat(outputs) -> np.ndarray:
    return np.concatenate([np.asarray(o).ravel() for o in outputs]).astype(np.float64)


def onnxruntime_reference(path, inputs: list[np.ndarray], output: np.ndarray, repeat: int = 10,
                          threads: int | None = None) -> Reference:
    """ONNX Runtime on ``path`` with ``inputs`` (in the graph's input order), against
    tirbyoc's ``output`` (flattened as `tirbyoc.app.running.run.model_output` does)."""
    try:
        import onnxruntime as ort  # noqa: F401  # deferred: optional dependency (onnxruntime)
    except ImportError:
        raise TirbyocError("--reference onnxruntime needs ONNX Runtime: pip install 'tirbyoc[reference]'") from None
    if not str(path).endswith(".onnx"):
        raise TirbyocError(f"--reference onnxruntime runs ONNX files; {path} is not one")
    threads = threads or int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    fast = ort_session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads)
    names = [i.name for i in fast.get_inputs()]
    if len(names) != len(inputs):
        raise TirbyocError(f"{path}: ONNX Runtime takes {len(names)} inputs {names}, tirbyoc ran it with {len(inputs)}")
    feed = dict(zip(names, inputs))
    got = _flat(fast.run(None, feed))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(max(1, repeat)):
            fast.run(None, feed)
        best = min(best, (time.perf_counter() - t0) / max(1, repeat))
    spec = _flat(ort_session(path, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, threads).run(None, feed))
    mine = np.asarray(output, dtype=np.float64).ravel()
    if mine.shape != got.shape:
        raise TirbyocError(f"tirbyoc's output has {mine.size} values, ONNX Runtime's {got.size}")
    step = output_step(path)
    agree, err = agrees(mine, got, step)
    return Reference("onnxruntime", best * 1e3, err, agree, step,
                     float(np.abs(mine - spec).max(initial=0.0)), threads)


__all__ = ["FLOAT_RTOL", "Reference", "agrees", "onnxruntime_reference", "ort_session", "output_step",
           "steps_apart"]
