"""The ``tirbyoc`` command line's arguments: one sub-command per job, with the exit codes and
examples its help shows. `tirbyoc.app.commands.cli.main` parses with `build_parser` and dispatches on
``args.command``."""

from __future__ import annotations

import argparse
import textwrap
from importlib import metadata

from tirbyoc.app.model_in.models import MODELS
from tirbyoc.decl.registry import template_names
from tirbyoc.relax.fast_math import ERF_ABS, EXP_REL

PRECISION_HELP = ("bf16: a float model's convolutions and matmuls read bfloat16 and accumulate in float32 "
                  "(AMX-BF16 or AVX512_BF16 templates by default); both builds compute it, and its "
                  "accuracy against the float32 model is reported. Changes values: never implied")

EXIT_CODES = """exit status:
  0  done (for run and sweep: the outputs match, or were not compared)
  1  run / sweep: the offloaded model's outputs differ from TVM's build
  2  usage error: bad arguments, model file, template or target
  3  TVM could not import or build the model itself (not the offload)"""


_EXAMPLES = {
    "run": "tirbyoc run -m builtin:resnet18_int8 -t vta --json",
    "tune": "tirbyoc tune -m builtin:mlp_int8 -t x86_vnni --trials 16 --work-dir /tmp/tw",
    "sweep": "tirbyoc sweep -t vta -p BLOCK_OUT=8,16,32 -p ACC_KIB=64,128 -m builtin:cnn_int8\n"
             "  tirbyoc sweep -t vta -p BLOCK_OUT=8,16,32 -p ACC_KIB=32..256:x2 --search tpe --trials 8 "
             "--engine dask --jobs 2 --results vta.jsonl",
    "build": "tirbyoc build -m builtin:cnn_int8 -t vta -o dist/cnn.so   (Hexagon: -t hexagon_hvx -o dist/cnn.tar)",
}


FAST_MATH_HELP = ("compute float32 erf, tanh, exp, softmax, sigmoid, SiLU and GELU with TVM's vectorizable "
                  f"approximations (erf and tanh within {ERF_ABS:.0e}, exp within {EXP_REL:.1e} relative), in "
                  "the offloaded build and in TVM's build it is checked against alike")


def _epilog(command: str) -> str:
    """What a user can name: built-in models, templates (and for sweep, vta's parameters),
    an example, and the exit codes."""


    lines = ["built-in models (--model builtin:NAME): " + ", ".join(sorted(MODELS)),
             "templates (--template): " + ", ".join(template_names())]
    if command == "sweep":
        lines.append("sweep parameters: a template's factory arguments, e.g. vta's batch, block_in, "
                     "block_out, inp_kib, wgt_kib, acc_kib, dma_bytes_per_cycle, dma_latency, clock_mhz, "
                     "block_dma, double_buffer and fused_epilogue (true / false)")
    text = "\n".join(textwrap.fill(ln, 88, subsequent_indent="  ") for ln in lines)
    return f"{text}\n\nexample:\n  {_EXAMPLES[command]}\n\n{EXIT_CODES}"


def _version() -> str:

    try:
        return metadata.version("tirbyoc")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _model_file_args(p) -> None:
    """--object and --input-shape: how every command picks and shapes a model file."""
    p.add_argument("--object", help="which object of a .py model file (or function inside its "
                                    "module), when it defines several")
    p.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="an ONNX input's shape, fixing dynamic dimensions (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tirbyoc", description="Offload TensorIR blocks to accelerator intrinsics.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tirbyoc {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    noise = common.add_mutually_exclusive_group()
    noise.add_argument("--verbose", "-v", action="store_true",
                       help="also log each step (logging level DEBUG)")
    noise.add_argument("--quiet", "-q", action="store_true",
                       help="no progress on stderr, warnings and errors only")
    _add_intrinsics(sub, common)
    _add_match(sub, common)
    _add_run(sub, common)
    _add_tune(sub, common)
    _add_sweep(sub, common)
    _add_build(sub, common)
    return parser


def _add_intrinsics(sub, common) -> None:
    p = sub.add_parser("intrinsics", parents=[common], help="list templates and their intrinsics")
    p.add_argument("--template", "-t", action="extend", nargs="+", metavar="T",
                   help="only these templates (e.g. -t vta blas)")
    p.add_argument("--json", action="store_true", help="print a JSON list of intrinsics")


def _add_match(sub, common) -> None:
    p = sub.add_parser("match", parents=[common], help="which blocks of a workload the templates' intrinsics match, or why not")
    p.add_argument("file", help="a model or workload as --model takes it: builtin:NAME, an .onnx "
                                "file, or a .py file (PrimFuncs, Relax module, torch or relax nn model)")
    p.add_argument("--template", "-t", action="append", metavar="T",
                   help="match against this template (repeatable; default all)")
    _model_file_args(p)
    p.add_argument("--json", action="store_true", help='print {"blocks": [...]} as JSON')


def _add_run(sub, common) -> None:
    p = sub.add_parser("run", parents=[common], epilog=_epilog("run"),
                       formatter_class=argparse.RawDescriptionHelpFormatter, help="offload a model, build it and TVM's default build, run both, compare, report")
    p.add_argument("--model", "-m", help="builtin:NAME (default: an MLP suited to the template), "
                   "PATH.onnx, or PATH.py defining a Relax IRModule, a torch.nn.Module with "
                   "example_inputs, or a relax.frontend.nn.Module with spec")
    _model_file_args(p)
    p.add_argument("--template", "-t", action="extend", nargs="+", metavar="T",
                   help="templates to offload to, tried in order (default: blas for a float model; "
                        "otherwise this CPU's fastest int8 template: x86_amx (then x86_vnni), x86_vnni, x86_avx512bw or x86_avx2)")
    p.add_argument("--target", help='TVM target as JSON (e.g. \'{"kind": "llvm", "mcpu": "native"}\') '
                                    "or a kind; default: the first template's")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights")
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="the model's inputs by name (a .npy for a one-input model); inputs not in "
                        "the file are drawn in their domain (weights as torch.nn initialises them)")
    p.add_argument("--report", metavar="PATH.html",
                   help="also write a self-contained HTML page with the table and a coverage plot")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--database", metavar="DIR",
                   help="apply the tuned schedules of a `tirbyoc tune` work directory")
    p.add_argument("--baseline", choices=("default", "dlight"), default="default",
                   help="how TVM builds the untouched model, for the same target: its default CPU "
                        "pipeline (default) or with dlight's CPU schedules")
    p.add_argument("--repeat", type=int, default=10, metavar="N",
                   help="runs per timing measurement (default 10; the best of 3 is reported)")
    p.add_argument("--no-baseline", action="store_true",
                   help="do not time TVM's build (it is still built and run once to compare)")
    p.add_argument("--reference", choices=("onnxruntime",),
                   help="also run an ONNX model in ONNX Runtime on the same inputs: its latency and "
                        "agreement with tirbyoc's output (pip install 'tirbyoc[reference]')")
    p.add_argument("--profile", action="store_true",
                   help="also time each offloaded PrimFunc alone, TVM's build and the offloaded one "
                        "(ms per call, a column of the table)")
    p.add_argument("--size", action="append", metavar="NAME=V1,V2,...",
                   help="a named (symbolic) dimension of the model's inputs and the sizes to run it "
                        "at, from one build (repeatable; e.g. n=1,17,128)")
    p.add_argument("--fast-math", action="store_true", help=FAST_MATH_HELP)
    p.add_argument("--precision", choices=("bf16",), help=PRECISION_HELP)


def _add_tune(sub, common) -> None:
    p = sub.add_parser("tune", parents=[common], epilog=_epilog("tune"),
                       formatter_class=argparse.RawDescriptionHelpFormatter, help="tune a model's offloadable PrimFuncs with MetaSchedule into a database")
    p.add_argument("--model", "-m", help="as for run (default: an MLP suited to the template)")
    _model_file_args(p)
    p.add_argument("--template", "-t", help="template to offload to (default as for run)")
    p.add_argument("--trials", type=int, default=64, help="candidates to measure in all (default 64)")
    p.add_argument("--work-dir", metavar="DIR", help="where the database and logs go (default: a new "
                   "temporary directory)")
    p.add_argument("--target", help="as for run (default: the template's)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT",
                   help="measure on devices behind this TVM RPC tracker instead of this machine")
    p.add_argument("--rpc-key", metavar="KEY", help="the device key registered with the tracker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_sweep(sub, common) -> None:
    p = sub.add_parser("sweep", parents=[common], epilog=_epilog("sweep"),
                       formatter_class=argparse.RawDescriptionHelpFormatter, help="run a model on a grid of template variants (cycles, coverage, correctness)")
    p.add_argument("--template", "-t", required=True, help="a template with a factory (e.g. vta)")
    p.add_argument("--param", "-p", action="append", metavar="NAME=V1,V2,...",
                   help="a template parameter and its values (repeatable; the grid is their product)")
    p.add_argument("--model", "-m", help="as for run (default: an MLP suited to the template)")
    _model_file_args(p)
    p.add_argument("--target", help="as for run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the points as JSON")
    p.add_argument("--plot", metavar="PATH.png", help="also plot cycles and utilization per point")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="run the points in N worker processes, one process per point (default 1)")
    _add_search(p)


def _add_search(p) -> None:
    """A sweep as a search (docs/design_space.md)."""
    g = p.add_argument_group("search (the grid is the default)")
    g.add_argument("--space", metavar="FILE.json", help='parameters and their values as JSON, '
                   '{"BLOCK_OUT": [8, 16, 32], "ACC_KIB": "32..256:x2"} (with --param: the flags win)')
    g.add_argument("--search", choices=("grid", "random", "tpe", "nsga2"), default="grid",
                   help="how points are chosen: every grid point, random draws, Optuna's TPE (one "
                        "objective) or NSGA-II (several) - the last two need the search extra")
    g.add_argument("--objective", action="append", metavar="NAME",
                   help="what to minimise or maximise (repeatable; several: a Pareto front): cycles "
                        "(default), compute_busy, load_busy, dma_bytes, scratchpad_kib, or a numeric "
                        "template parameter to minimise (block_out, dma_bytes_per_cycle)")
    g.add_argument("--constraint", action="append", metavar="NAME<=V",
                   help="a bound on a parameter or an objective, e.g. scratchpad_kib<=512 (repeatable)")
    g.add_argument("--trials", type=int, metavar="N", help="points to run at most (default: the whole space)")
    g.add_argument("--time", type=float, metavar="SECONDS", help="start no point after this long")
    g.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="local worker processes (default) or a Dask cluster (the cluster extra): "
                        "one of --jobs workers started here, or the one at --address")
    g.add_argument("--address", metavar="tcp://HOST:PORT", help="a running Dask scheduler to run the points on")
    g.add_argument("--results", metavar="FILE.jsonl",
                   help="append each finished point to this file; a run given a file it wrote resumes")



def _add_build(sub, common) -> None:
    p = sub.add_parser("build", parents=[common], epilog=_epilog("build"),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="offload a model and write one shared library that TVM alone loads and runs")
    p.add_argument("--output", "-o", required=True, metavar="PATH.so",
                   help="the library (its manifest PATH.json and shared libraries it needs go beside it); "
                        "for a Hexagon target PATH.so (linked with ld.lld-16) or PATH.tar (objects + link command)")
    p.add_argument("--model", "-m", help="as for run (default: an MLP suited to the template)")
    _model_file_args(p)
    p.add_argument("--template", "-t", action="extend", nargs="+", metavar="T", help="as for run")
    p.add_argument("--target", help="as for run (a CPU target, or a Hexagon one: -t hexagon_hvx)")
    p.add_argument("--database", metavar="DIR", help="apply the tuned schedules of a `tirbyoc tune` work directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights a built-in model is built with")
    p.add_argument("--no-whole-calls", action="store_true",
                   help="call library kernels from inside PrimFuncs, never as whole Relax calls")
    p.add_argument("--size", action="append", metavar="NAME=V",
                   help="a named (symbolic) dimension's size for the sample inputs the library is checked "
                        "on; the library itself takes every size (repeatable)")
    p.add_argument("--fast-math", action="store_true", help=FAST_MATH_HELP)
    p.add_argument("--precision", choices=("bf16",), help=PRECISION_HELP)
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")


__all__ = ["EXIT_CODES", "build_parser"]
