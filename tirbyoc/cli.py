"""The ``tirbyoc`` command line."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import TirbyocError
from .jsonout import dumps
from .registry import get_template, template_names
from .table import render


def _intrinsic_rows(names: list[str]) -> list[dict]:
    rows = []
    for tname in names:
        template = get_template(tname)
        for intrin in template.intrinsics():
            rows.append({
                "template": template.name,
                "name": intrin.name,
                "role": intrin.role.value,
                "shape": list(intrin.shape),
                "iters": intrin.iter_kinds,
                "dtypes": intrin.dtypes,
                "scopes": intrin.scopes,
                "layouts": {o.name: o.layout.describe() for o in intrin.operands},
                "cycles": intrin.cost.cycles,
                "bytes": intrin.bytes_moved,
                "runtime": template.runtime.value,
                "runs_here": template.runs_here(),
                "doc": intrin.doc,
            })
    return rows


def cmd_intrinsics(args) -> int:
    names = args.template or template_names()
    for n in names:
        get_template(n)  # unknown names fail before any output
    rows = _intrinsic_rows(names)
    if args.json:
        print(dumps(rows))
        return 0
    print(render(
        ["template", "intrinsic", "role", "shape", "dtypes", "scopes"],
        [[r["template"], r["name"].split(".", 1)[1], r["role"],
          "x".join(map(str, r["shape"])) + f" {r['iters']}",
          ",".join(f"{k}:{v}" for k, v in r["dtypes"].items()),
          ",".join(sorted(set(r["scopes"].values())))] for r in rows],
    ))
    print()
    print(render(
        ["template", "runtime", "target", "runs here"],
        [[t.name, t.runtime.value, t.target["kind"], "yes" if t.runs_here() else f"no: {t.unavailable_reason()}"]
         for t in (get_template(n) for n in names)],
    ))
    return 0


def _match_rows(results, chains) -> list[dict]:
    fused = {}
    for c in chains:
        for b, i in zip(c.blocks[1:], c.intrinsics[1:]):
            fused[(c.compute.function, b)] = (i, c.compute.block)
    rows = []
    for r in results:
        m = r.best
        row = {"function": r.function, "block": r.block, "macs": r.macs,
               "intrinsic": m.intrinsic.name if m else None, "reason": None,
               "mapping": None, "padding": None, "staging": None, "fused_into": None}
        if m is not None:
            row["mapping"] = {a: list(v) for a, v in m.mapping.items()}
            row["padding"] = {a: list(v) for a, v in m.padding.items()}
            row["staging"] = {o.operand: list(o.staging) for o in m.operands if o.staging}
            row["outer"] = list(m.outer)
            row["template"] = m.template
        elif (r.function, r.block) in fused:
            intrin, into = fused[(r.function, r.block)]
            row.update(intrinsic=intrin, fused_into=into)
        else:
            row["reason"] = r.reason
        rows.append(row)
    return rows


def cmd_match(args) -> int:
    from .chain import match_chains
    from .loaders import legalize
    from .matcher import explain
    from .run import load_model

    names = args.template or template_names()
    templates = [get_template(n) for n in names]
    mod = legalize(load_model(args.file, templates, args.object, _shapes_arg(args.input_shape))[1])
    try:
        results = explain(mod, templates)
    except ValueError as err:
        raise TirbyocError(f"{args.file}: {err}") from None
    rows = _match_rows(results, match_chains(mod, templates))
    if args.json:
        print(dumps({"file": str(args.file), "templates": names, "blocks": rows}))
        return 0
    table = []
    for r in rows:
        if r["fused_into"]:
            what = f"{r['intrinsic']} (epilogue of {r['fused_into']})"
        elif r["intrinsic"]:
            m = next(x for x in results if x.function == r["function"] and x.block == r["block"]).best
            what = f"{r['intrinsic']}  {m.describe()}"
        else:
            what = f"- {r['reason']}"
        table.append([r["function"], r["block"], f"{r['macs']:,}" if r["macs"] else "-", what])
    print(render(["function", "block", "MACs", "intrinsic and mapping, or why not"], table))
    matched = sum(1 for r in rows if r["intrinsic"])
    print(f"\n{matched} of {len(rows)} blocks match ({', '.join(names)})")
    return 0


def _shapes_arg(specs) -> dict | None:
    """--input-shape NAME=D0,D1,... (repeatable) -> {NAME: [D0, D1, ...]}."""
    if not specs:
        return None
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")] if sep and dims.strip() else None
        except ValueError:
            shape = None
        if not name.strip() or shape is None or any(d <= 0 for d in shape):
            raise TirbyocError(f"--input-shape {spec!r}: write NAME=D0,D1,... with positive "
                               "integers, e.g. input=1,3,224,224")
        shapes[name.strip()] = shape
    return shapes


def _target_arg(text: str | None):
    """--target: a JSON target dict, or a bare kind ("llvm")."""
    if not text:
        return None
    if not text.lstrip().startswith("{"):
        return {"kind": text.strip()}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise TirbyocError(f"--target {text!r} is not valid JSON ({err.msg} at character "
                           f"{err.pos}); write it as '{{\"kind\": \"llvm\", \"mcpu\": "
                           "\"cascadelake\"}' (keys and strings in double quotes), or give a "
                           "bare kind such as llvm") from None
    if not isinstance(value, dict):
        raise TirbyocError(f"--target {text!r}: a JSON object is needed, e.g. '{{\"kind\": \"llvm\"}}'")
    return value


def cmd_run(args) -> int:
    from .run import Progress, run_model

    from .model_inputs import load_inputs

    target = _target_arg(args.target)
    inputs = load_inputs(args.inputs) if args.inputs else None
    result = run_model(args.model, args.template, target=target, seed=args.seed,
                       progress=Progress(enabled=not args.quiet), database=args.database,
                       inputs=inputs, baseline=args.baseline, repeat=args.repeat,
                       time_baseline=not args.no_baseline, obj=args.object,
                       input_shapes=_shapes_arg(args.input_shape), profile=args.profile)
    if args.json:
        print(dumps(result.to_json()))
    else:
        print(f"{result.model} on {', '.join(result.templates)}\n")
        print(result.table())
    if args.report:
        from .html_report import write

        path = write(result, args.report)
        print(f"report written to {path}", file=sys.stderr)
    return 0 if result.verified is not False else 1


def cmd_tune(args) -> int:
    import os
    import tempfile

    from .run import Progress, default_templates, legalized_model
    from .tuning.tuner import rpc_runner, tune

    template = get_template(args.template or default_templates()[0])
    if bool(args.rpc_tracker) != bool(args.rpc_key):
        raise TirbyocError("give --rpc-tracker HOST:PORT and --rpc-key KEY together")
    runner = rpc_runner(args.rpc_tracker, args.rpc_key) if args.rpc_tracker else None
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tirbyoc-tune-")
    os.makedirs(work_dir, exist_ok=True)
    bar = Progress(enabled=not args.quiet, label="tune")
    bar.phase(f"importing {args.model or 'the built-in model'}")
    spec, mod, _, _ = legalized_model(args.model, [template], args.seed, obj=args.object,
                                      input_shapes=_shapes_arg(args.input_shape))
    bar.phase(f"tuning the PrimFuncs {template.name} can offload, {args.trials} trials")
    result = tune(mod, template, trials=args.trials, work_dir=work_dir, runner=runner,
                  target=_target_arg(args.target), progress=bar.step, seed=args.seed)
    if args.json:
        print(dumps({"model": spec, **result.to_json()}))
        return 0 if result.tasks else 1
    print(f"{spec} on {template.name}: {len(result.tasks)} tasks, {result.trials} candidates measured, "
          f"{result.valid} valid ({result.valid_fraction:.0%}), {result.seconds:.0f} s\n")
    print(result.table())
    if not result.tasks:
        print(f"\nnothing to tune: {template.name} offloads no PrimFunc of this model", file=sys.stderr)
        return 1
    print(f"\ndatabase in {work_dir}; apply it with: tirbyoc run -m {spec} -t {template.name} "
          f"--database {work_dir}")
    return 0


def cmd_sweep(args) -> int:
    from .run import Progress
    from .sweep import parse_params, plot, sweep, table

    grid = parse_params(args.param)
    if not grid:
        raise TirbyocError("give at least one --param NAME=V1,V2,... to sweep")
    target = _target_arg(args.target)
    bar = Progress(enabled=not args.quiet)
    points = sweep(args.model, args.template, grid, target=target, seed=args.seed, progress=bar.step,
                   obj=args.object, input_shapes=_shapes_arg(args.input_shape))
    if args.json:
        print(dumps({"model": args.model, "template": args.template,
                      "points": [p.to_json() for p in points]}))
    else:
        print(f"{args.model or 'the built-in model'} on {args.template} variants\n")
        print(table(points))
    if args.plot:
        plot(points, args.plot, title=f"{args.model or 'built-in model'} on {args.template}")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(p.verified is False for p in points) else 0


EXIT_CODES = """exit status:
  0  done (for run and sweep: the outputs match, or were not compared)
  1  run / sweep: the offloaded model's outputs differ from TVM's build
  2  usage error: bad arguments, model file, template or target
  3  TVM could not import or build the model itself (not the offload)"""


_EXAMPLES = {
    "run": "tirbyoc run -m builtin:resnet18_int8 -t vta --json",
    "tune": "tirbyoc tune -m builtin:mlp_int8 -t x86_vnni --trials 16 --work-dir /tmp/tw",
    "sweep": "tirbyoc sweep -t vta -p BLOCK_OUT=8,16,32 -p ACC_KIB=64,128 -m builtin:cnn_int8",
}


def _epilog(command: str) -> str:
    """What a user can name: built-in models, templates (and for sweep, vta's parameters),
    an example, and the exit codes."""
    import textwrap

    from .models import MODELS

    lines = ["built-in models (--model builtin:NAME): " + ", ".join(sorted(MODELS)),
             "templates (--template): " + ", ".join(template_names())]
    if command == "sweep":
        lines.append("sweep parameters: a template's factory arguments, e.g. vta's batch, block_in, "
                     "block_out, inp_kib, wgt_kib, acc_kib, dma_bytes_per_cycle, dma_latency, clock_mhz")
    text = "\n".join(textwrap.fill(ln, 88, subsequent_indent="  ") for ln in lines)
    return f"{text}\n\nexample:\n  {_EXAMPLES[command]}\n\n{EXIT_CODES}"


def _version() -> str:
    from importlib import metadata

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
    p = sub.add_parser("intrinsics", parents=[common], help="list templates and their intrinsics")
    p.add_argument("--template", "-t", action="extend", nargs="+", metavar="T",
                   help="only these templates (e.g. -t vta blas)")
    p.add_argument("--json", action="store_true", help="print a JSON list of intrinsics")
    p.set_defaults(func=cmd_intrinsics)
    p = sub.add_parser("match", parents=[common], help="which blocks of a workload the templates' intrinsics match, or why not")
    p.add_argument("file", help="a model or workload as --model takes it: builtin:NAME, an .onnx "
                                "file, or a .py file (PrimFuncs, Relax module, torch or relax nn model)")
    p.add_argument("--template", "-t", action="append", metavar="T",
                   help="match against this template (repeatable; default all)")
    _model_file_args(p)
    p.add_argument("--json", action="store_true", help='print {"blocks": [...]} as JSON')
    p.set_defaults(func=cmd_match)
    p = sub.add_parser("run", parents=[common], epilog=_epilog("run"),
                       formatter_class=argparse.RawDescriptionHelpFormatter, help="offload a model, build it and TVM's default build, run both, compare, report")
    p.add_argument("--model", "-m", help="builtin:NAME (default: an MLP suited to the template), "
                   "PATH.onnx, or PATH.py defining a Relax IRModule, a torch.nn.Module with "
                   "example_inputs, or a relax.frontend.nn.Module with spec")
    _model_file_args(p)
    p.add_argument("--template", "-t", action="extend", nargs="+", metavar="T",
                   help="templates to offload to, tried in order (default: x86_vnni if this CPU "
                        "has VNNI, else blas)")
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
    p.add_argument("--profile", action="store_true",
                   help="also time each offloaded PrimFunc alone, TVM's build and the offloaded one "
                        "(ms per call, a column of the table)")
    p.set_defaults(func=cmd_run)
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
    p.set_defaults(func=cmd_tune)
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
    p.set_defaults(func=cmd_sweep)
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="tirbyoc: %(message)s", stream=sys.stderr)
    logging.getLogger("tirbyoc").setLevel(level)
    try:
        return args.func(args)
    except TirbyocError as err:
        print(f"tirbyoc: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
