"""The ``tirbyoc`` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile

from tirbyoc.app.commands.cli_parser import build_parser
from tirbyoc.app.building.deploy import build_library
from tirbyoc.app.commands.html_report import write
from tirbyoc.app.jsonout import dumps
from tirbyoc.app.model_in.loaders import legalize
from tirbyoc.app.model_in.model_inputs import load_inputs
from tirbyoc.app.options import RunOptions, from_flags
from tirbyoc.app.model_in.preparation import integer_module
from tirbyoc.app.model_in.sizes import named_integers, parse_sizes
from tirbyoc.app.model_in.frontends import load_model
from tirbyoc.app.model_in.legalize import importing, legalized_model
from tirbyoc.app.running.run import Progress, default_templates, run_model
from tirbyoc.app.sweeping import sweep_report
from tirbyoc.app.sweeping.search import SearchPlan
from tirbyoc.app.sweeping.search_space import SearchSpace
from tirbyoc.app.sweeping.sweep import plot, search_model, table
from tirbyoc.decl.registry import get_template, template_names
from tirbyoc.errors import TirbyocError
from tirbyoc.matching.chain import match_chains
from tirbyoc.matching.matcher import explain
from tirbyoc.offloading.table import render
from tirbyoc.rewrite.cpu.winograd import MIN_CHANNELS
from tirbyoc.tuning.tuner import rpc_runner, tune


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
    kernels = [[t.name, g.name, g.kernel.describe()] for t in (get_template(n) for n in names)
               for g in t.groups if g.kernel is not None]
    if kernels:  # the declared tensor-core kernels the groups' GEMMs are scheduled as
        print()
        print(render(["template", "group", "tensor-core kernel"], kernels))
    for t in (get_template(n) for n in names):
        if getattr(t, "winograd", 0):  # a whole-function form the template's core computes
            print(f"\n{t.name}: float 3x3 convolutions of stride 1 (constant weight, {MIN_CHANNELS} channels or more) in "
                  f"Winograd's form, up to F({t.winograd}x{t.winograd}, 3x3)")
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
               "mismatch": None, "mapping": None, "padding": None, "staging": None, "fused_into": None}
        if m is not None:
            row["mapping"] = {a: list(v) for a, v in m.mapping.items()}
            row["padding"] = {a: list(v) for a, v in m.padding.items()}
            row["staging"] = {o.operand: [str(x) for x in o.staging] for o in m.operands if o.staging}
            row["outer"] = list(m.outer)
            row["template"] = m.template
        elif (r.function, r.block) in fused:
            intrin, into = fused[(r.function, r.block)]
            row.update(intrinsic=intrin, fused_into=into)
        else:
            row["reason"] = r.reason
            row["mismatch"] = r.mismatch.to_json() if r.mismatch is not None else None
        rows.append(row)
    return rows


def cmd_match(args) -> int:

    names = args.template or template_names()
    templates = [get_template(n) for n in names]
    mod = load_model(args.file, templates, args.object, _shapes_arg(args.input_shape))[1]
    mod = legalize(integer_module(mod, templates))  # what `run` offloads: the integer cores
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
    shapes = named_integers(specs, "--input-shape", "NAME=D0,D1,...", "input=1,3,224,224")
    return None if shapes is None else {k: list(v) for k, v in shapes.items()}


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


def _options(args, **flags) -> RunOptions:
    """The `RunOptions` of the flags every model command has (target, seed, object, input
    shapes, fast math where it has it) and those given."""
    return from_flags(target=_target_arg(args.target), seed=args.seed, obj=args.object,
                      input_shapes=_shapes_arg(args.input_shape), fast_math=getattr(args, "fast_math", None),
                      precision=getattr(args, "precision", None),
                      **flags)


def cmd_run(args) -> int:


    options = _options(args, inputs=load_inputs(args.inputs) if args.inputs else None, database=args.database,
                       baseline=args.baseline, repeat=args.repeat, time_baseline=not args.no_baseline,
                       profile=args.profile, reference=args.reference, sizes=parse_sizes(args.size))
    result = run_model(args.model, args.template, options, progress=Progress(enabled=not args.quiet))
    if args.json:
        print(dumps(result.to_json()))
    else:
        print(f"{result.model} on {', '.join(result.templates)}\n")
        print(result.table())
    if args.report:

        path = write(result, args.report)
        print(f"report written to {path}", file=sys.stderr)
    return 0 if result.verified is not False else 1


def cmd_tune(args) -> int:


    template = get_template(args.template or default_templates()[0])
    if bool(args.rpc_tracker) != bool(args.rpc_key):
        raise TirbyocError("give --rpc-tracker HOST:PORT and --rpc-key KEY together")
    runner = rpc_runner(args.rpc_tracker, args.rpc_key) if args.rpc_tracker else None
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tirbyoc-tune-")
    os.makedirs(work_dir, exist_ok=True)
    bar = Progress(enabled=not args.quiet, label="tune")
    bar.phase(importing(args.model))
    options = _options(args)
    prepared = legalized_model(args.model, [template], options)
    spec, mod = prepared.spec, prepared.mod
    bar.phase(f"tuning the PrimFuncs {template.name} can offload, {args.trials} trials")
    result = tune(mod, template, trials=args.trials, work_dir=work_dir, runner=runner,
                  target=options.target, progress=bar.step, seed=options.seed)
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
    space = SearchSpace.parse(args.param, args.space)
    if not space.params:
        raise TirbyocError("give at least one --param NAME=V1,V2,... (or --space FILE.json) to sweep")
    if args.jobs < 1:
        raise TirbyocError(f"--jobs {args.jobs}: give a number of worker processes >= 1")
    objectives = args.objective or ["cycles"]
    searched = args.search != "grid" or args.objective or args.constraint or args.trials or args.time
    bar = Progress(enabled=not args.quiet)
    plan = SearchPlan(strategy=args.search, objectives=tuple(objectives), constraints=tuple(args.constraint or ()),
                      trials=args.trials, seconds=args.time, engine=args.engine, jobs=args.jobs,
                      address=args.address, results=args.results)
    result = search_model(args.model, args.template, space, _options(args), plan=plan, progress=bar.step)
    points = result.points
    if args.json:
        doc = {"model": args.model, "template": args.template, "points": [p.to_json() for p in points]}
        print(dumps({**doc, "search": sweep_report.to_json(result)} if searched else doc))
    else:
        print(f"{args.model or 'the built-in model'} on {args.template} variants\n")
        print(table(points))
        if searched:
            print("\n" + sweep_report.summary(result))
    if args.plot:
        title = f"{args.model or 'built-in model'} on {args.template}"
        if len(objectives) > 1:
            sweep_report.plot_front(result, args.plot, title)
        else:
            plot(points, args.plot, title=title)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(p.verified is False for p in points) else 0


def cmd_build(args) -> int:
    options = _options(args, database=args.database, sizes=parse_sizes(args.size))
    built = build_library(args.model, args.template, options, output=args.output,
                          whole_calls=not args.no_whole_calls, progress=Progress(enabled=not args.quiet),
                          run_check=False)
    if args.json:
        print(dumps(built.to_json()))
        return 0
    r = built.report
    inputs = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in built.inputs)
    done = [f for f in r.functions if f.offloaded]
    verified = sum(1 for f in done if f.verified is True)
    s = built.sized
    macs = (f"{s.offloaded_macs:,} of {s.total_macs:,} MACs at {', '.join(f'{k}={v}' for k, v in s.sizes.items())}"
            if s is not None else f"{r.offloaded_macs:,} of {r.total_macs:,} MACs")
    print(f"{built.model} on {', '.join(built.templates)}: {macs} "
          f"offloaded; {verified} of {len(done)} offloaded functions verified on this machine")
    for f in done:
        if f.verified is not True:
            print(f"  {f.name}: {'DISAGREES with TVM' if f.verified is False else 'not verified'}"
                  f"{' - ' + f.check_note if f.check_note else ''}")
    if built.fast_math is not None:
        print(f"  {built.fast_math.describe()}")
    for name, instruction in built.emulates.items():
        print(f"  {name} emulates {instruction} in portable code: for checking, not for shipping")
    if built.cross is not None:
        _print_cross(built, inputs)
        return 0 if all(f.verified is not False for f in r.functions) else 1
    print(f"wrote {built.path} (entry {built.entry}({inputs}); weights inside)")
    if built.linked:
        print(f"  linked in: {', '.join(built.linked)}")
    for lib in built.shipped:
        print(f"  ships with: {lib} (keep it beside the library)")
    print(f"  manifest: {built.path.with_suffix('.json')}")
    print(f"run it with TVM alone: python -m tirbyoc.app.building.runner {built.path} --input x.npy")
    return 0 if all(f.verified is not False for f in r.functions) else 1


def _print_cross(built, inputs: str) -> None:
    """What a library for another processor is, how to link it, where it runs."""
    cross = built.cross
    print(f"wrote {built.path}: {cross.kind} (entry {built.entry}({inputs}); weights inside)")
    if built.path.suffix == ".tar":
        print(f"  link it: tar -xf {built.path.name} && {' '.join(cross.link)}   (or the Hexagon SDK's "
              "hexagon-link with the same arguments)")
    if cross.undefined:
        print(f"  takes from the device's process: {', '.join(cross.undefined)}")
    done = [f for f in built.report.functions if f.offloaded]
    checked = ("each offloaded function was verified under qemu-hexagon" if all(f.verified is True for f in done)
               else "its offloaded functions were not all verified: see above")
    print(f"  not run here: TVM's Hexagon runtime loads it on the device ({checked})")
    print(f"  manifest: {built.path.with_suffix('.json')}")


def main(argv: list[str] | None = None) -> int:

    args = build_parser().parse_args(argv)
    commands = {"intrinsics": cmd_intrinsics, "match": cmd_match, "run": cmd_run, "tune": cmd_tune,
                "sweep": cmd_sweep, "build": cmd_build}
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="tirbyoc: %(message)s", stream=sys.stderr)
    logging.getLogger("tirbyoc").setLevel(level)
    try:
        return commands[args.command](args)
    except TirbyocError as err:
        print(f"tirbyoc: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
