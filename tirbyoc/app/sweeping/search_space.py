"""What a searched sweep may vary: each template parameter's values, and the constraints a
point must meet.

On the command line a parameter is ``-p NAME=V1,V2,...`` (choices, as a grid sweep takes
them) or ``-p NAME=LO..HI`` (every integer between, inclusive), ``-p NAME=LO..HI:STEP`` (every
STEP-th) or ``-p NAME=LO..HI:x2`` (LO, 2 LO, 4 LO, ... up to HI: sizes in powers of two). A
``--space FILE.json`` says the same as ``{"BLOCK_OUT": [8, 16, 32], "ACC_KIB": "32..256:x2"}``.
Every parameter has finitely many values, so the grid is the space itself and a search draws
from it: a point of a search is a point of the grid, with the same row.

A constraint is ``NAME<=VALUE`` (or ``<``, ``>=``, ``>``, ``==``) on a parameter or on an
objective the point reports (`tirbyoc.app.sweeping.objectives`), e.g. ``scratchpad_kib<=256``.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from dataclasses import dataclass
from math import prod
from pathlib import Path

from tirbyoc.errors import TirbyocError

_OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "<": operator.lt, ">": operator.gt}


def parse_value(text: str):
    """One value as a template factory takes it: an int, a bool (true / false), or the text."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _range(name: str, text: str) -> list[int]:
    """``LO..HI``, ``LO..HI:STEP`` or ``LO..HI:xF`` as its values."""
    m = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(x?)(\d+))?\s*", text)
    if not m:
        raise TirbyocError(f"--param {name}={text}: a range is LO..HI, LO..HI:STEP or LO..HI:xFACTOR")
    lo, hi, times, step = int(m[1]), int(m[2]), m[3] == "x", int(m[4] or 1)
    if hi < lo or step < 1 or (times and (step < 2 or lo < 1)):
        raise TirbyocError(f"--param {name}={text}: need LO <= HI, a step >= 1 (a factor >= 2 from LO >= 1)")
    if not times:
        return list(range(lo, hi + 1, step))
    values, v = [], lo
    while v <= hi:
        values.append(v)
        v *= step
    return values


def _values(name: str, spec) -> list:
    if isinstance(spec, list):
        values = [parse_value(v) if isinstance(v, str) else v for v in spec]
    elif isinstance(spec, str) and ".." in spec:
        values = _range(name, spec)
    elif isinstance(spec, str):
        values = [parse_value(v) for v in spec.split(",") if v.strip()]
    else:
        values = [spec]
    if not values:
        raise TirbyocError(f"--param {name}: no values")
    if len(set(map(repr, values))) != len(values):
        raise TirbyocError(f"--param {name}: a value is given twice ({values})")
    return values


@dataclass(frozen=True)
class Constraint:
    """``name op value``: a parameter's or an objective's bound."""

    name: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> "Constraint":
        m = re.fullmatch(r"\s*([A-Za-z_][\w]*)\s*(<=|>=|==|<|>)\s*(-?[\d.]+)\s*", text)
        if not m:
            raise TirbyocError(f"--constraint {text!r}: write NAME<=VALUE (or <, >=, >, ==), "
                               "e.g. scratchpad_kib<=256")
        return cls(m[1].lower(), m[2], float(m[3]))

    def holds(self, value) -> bool:
        return value is not None and _OPS[self.op](value, self.value)

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value:g}"


@dataclass(frozen=True)
class SearchSpace:
    """Parameter name -> its values (in the order given); the grid is their product."""

    params: dict

    @classmethod
    def parse(cls, specs=(), path: str | None = None) -> "SearchSpace":
        """From ``-p`` specs and a ``--space`` file (the flags win where both name one)."""
        raw: dict = {}
        if path is not None:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError) as err:
                raise TirbyocError(f"--space {path}: {err}") from None
            if not isinstance(data, dict):
                raise TirbyocError(f"--space {path}: a JSON object of NAME: values")
            raw.update({k.lower(): v for k, v in data.items()})
        for spec in specs or ():
            name, sep, values = spec.partition("=")
            if not sep or not name.strip() or not values.strip():
                raise TirbyocError(f"--param {spec!r}: write NAME=V1,V2,... or NAME=LO..HI[:STEP]")
            raw[name.strip().lower()] = values
        return cls({name: _values(name, spec) for name, spec in raw.items()})

    @property
    def size(self) -> int:
        return prod(len(v) for v in self.params.values())

    def grid(self) -> list[dict]:
        """Every point, the first parameter varying slowest (a grid sweep's order)."""
        names = list(self.params)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.params[n] for n in names))]

    def check(self, known) -> None:
        """Every parameter is one of ``known`` (the template's), before anything is built."""
        unknown = [n for n in self.params if n not in known]
        if unknown:
            raise TirbyocError(f"the template has no parameter {unknown[0]!r}; its parameters are "
                               f"{sorted(k for k in known if k != 'name')}")


def point_key(params: dict) -> str:
    """A point's identity, whatever order its parameters come in (the results file's key)."""
    return json.dumps(params, sort_keys=True)


__all__ = ["Constraint", "SearchSpace", "parse_value", "point_key"]
