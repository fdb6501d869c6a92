"""`RunOptions`: how a model is loaded, built and run, as one record.

`tirbyoc run`, `build`, `sweep` and `tune` share most of what they are told - the target, how
the model is loaded (seed, inputs, which object of a file, input shapes, fast math), a tuning
database - and `run` adds how it is timed and checked. The CLI builds one `RunOptions` from
its flags (`from_flags`); `run_model`, `build_library` and `sweep` take it, or its fields as
keywords (``run_model("builtin:mlp", ["blas"], repeat=1)``), checked by name (`options_of`).
A new option is a field here, with its default and what it means, and one flag in the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class RunOptions:
    target: dict | str | None = None  # the target both builds use (None: the templates' own)
    seed: int = 0  # drawn inputs and random weights
    inputs: dict | None = None  # the model's inputs by name (the rest are drawn)
    obj: str | None = None  # which object of a Python model file
    input_shapes: dict | None = None  # an ONNX model's input shapes, by input name
    fast_math: bool = False  # approximate float32 exp / erf / tanh in both builds
    precision: str | None = None  # "bf16": convolutions and matmuls read bfloat16 in both builds
    database: str | None = None  # a `tirbyoc tune` work directory whose schedules apply
    repeat: int = 10  # runs per timing measurement (the minimum of 3 is reported)
    baseline: str = "default"  # how TVM builds the untouched model (`BASELINES`)
    time_baseline: bool = True  # False: the baseline is built and run for the check, untimed
    profile: bool = False  # also time each offloaded PrimFunc alone
    reference: str | None = None  # "onnxruntime": also run an ONNX model there
    sizes: dict | None = None  # named dimensions -> the sizes to run the model at ({"n": (1, 17, 128)})

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def options_of(options: RunOptions | None, changes: dict, caller: str) -> RunOptions:
    """``options`` (default: `RunOptions()`) with the fields ``changes`` names set; an unknown
    name is a TypeError that lists the known ones."""
    unknown = sorted(set(changes) - set(RunOptions.names()))
    if unknown:
        raise TypeError(f"{caller}() got unknown option(s) {', '.join(unknown)}; "
                        f"RunOptions has {', '.join(RunOptions.names())}")
    return replace(options or RunOptions(), **changes)


def from_flags(**flags) -> RunOptions:
    """The `RunOptions` of a command's parsed flags (those it has; None leaves the default)."""
    return RunOptions(**{k: v for k, v in flags.items() if v is not None})


__all__ = ["RunOptions", "from_flags", "options_of"]
