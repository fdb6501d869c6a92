"""Run a library `tirbyoc build` wrote, with TVM alone::

    python -m tirbyoc.app.building.runner model.so --input x.npy [--output y.npy]
    python -m tirbyoc.app.building.runner model.so --input x=x.npy --input mask=m.npy

This module imports nothing of tirbyoc's: copy it next to the library to run it where tirbyoc
is not installed. The entry function and its inputs come from the manifest ``model.json``
beside the library when there is one (else ``--entry``, default ``forward`` or ``main``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax


def _inputs(specs: list[str], names: list[str]) -> list[np.ndarray]:
    """Arrays in the entry's parameter order from ``NAME=FILE.npy`` or, positionally, ``FILE.npy``."""
    named, positional = {}, []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if sep and not name.endswith(".npy"):
            named[name] = np.load(path)
        else:
            positional.append(np.load(spec))
    if named and positional:
        raise SystemExit("runner: give every input as NAME=FILE.npy, or all of them in order")
    if named:
        missing = [n for n in names if n not in named]
        if missing:
            raise SystemExit(f"runner: no value for input(s) {missing}; the library takes {names}")
        return [named[n] for n in names]
    if names and len(positional) != len(names):
        raise SystemExit(f"runner: the library takes {len(names)} input(s) {names}, got {len(positional)}")
    return positional


def _flatten(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in _flatten(v)]


def run(library: str, inputs: list[np.ndarray], entry: str | None = None) -> list[np.ndarray]:
    """Load ``library`` and call its entry function on ``inputs``; the outputs, flattened."""
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    if entry is None:
        entry = next((e for e in ("forward", "main") if vm.module.implements_function(e)), "main")
    return _flatten(vm[entry](*[tvm.runtime.tensor(a) for a in inputs]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tirbyoc.app.building.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("library", help="the .so that `tirbyoc build` wrote")
    parser.add_argument("--input", "-i", action="append", default=[], metavar="[NAME=]FILE.npy")
    parser.add_argument("--entry", help="the function to call (default: the manifest's)")
    parser.add_argument("--output", "-o", metavar="FILE.npy", help="save the (first) output here")
    args = parser.parse_args(argv)
    manifest = Path(args.library).with_suffix(".json")
    spec = json.loads(manifest.read_text()) if manifest.exists() else {}
    if spec.get("runs_here") is False:
        raise SystemExit(f"runner: {args.library} is a {spec.get('kind', 'library for another processor')}; "
                         "it runs where that processor's TVM runtime loads it, not here")
    names = [p["name"] for p in spec.get("inputs", [])]
    outputs = run(args.library, _inputs(args.input, names), args.entry or spec.get("entry"))
    for i, out in enumerate(outputs):
        print(f"output {i}: {out.dtype}{list(out.shape)}  min {out.min():.6g}  max {out.max():.6g}  "
              f"mean {out.astype(np.float64).mean():.6g}")
    if args.output:
        np.save(args.output, outputs[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
