"""The ``tirbyoc`` command line."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import TirbyocError
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
        print(json.dumps(rows, indent=2))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tirbyoc", description="Offload TensorIR blocks to accelerator intrinsics.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("intrinsics", help="list templates and their intrinsics")
    p.add_argument("--template", "-t", action="append", help="only this template (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON list of intrinsics")
    p.set_defaults(func=cmd_intrinsics)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TirbyocError as err:
        print(f"tirbyoc: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
