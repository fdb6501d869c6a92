"""A sweep's results file: one JSON line per finished point, written as it finishes.

A long search is interrupted (a machine goes away, a budget ends); its file keeps every row
already finished, and a sweep given the same file again skips those points and appends the
rest (``--results FILE``). A row is written whole (one ``write`` of one line, then flushed
and synced), so a killed sweep leaves whole rows; a line cut short by a crash mid-write is
ignored when the file is read back, and its point runs again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tirbyoc.app.sweeping.search_space import point_key
from tirbyoc.errors import TirbyocError


class ResultsFile:
    """Rows by point (`point_key` of their params), read from and appended to ``path``."""

    def __init__(self, path: str | os.PathLike, header: dict):
        self.path = Path(path)
        self.header = header
        self.rows: dict[str, dict] = {}
        if self.path.exists():
            self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write({"sweep": header})

    def _read(self) -> None:
        lines = self.path.read_text().splitlines()
        for n, line in enumerate(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a row cut short by a crash: its point runs again
            if "sweep" in record:
                if n == 0 and record["sweep"] != self.header:
                    raise TirbyocError(
                        f"{self.path} holds another sweep ({_differs(record['sweep'], self.header)}); "
                        "give a new results file, or the same model, template and target")
                continue
            self.rows[point_key(record["params"])] = record

    def _write(self, record: dict) -> None:
        line = json.dumps(record) + "\n"  # params in their own order; `point_key` sorts them
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def __contains__(self, params: dict) -> bool:
        return point_key(params) in self.rows

    def add(self, row: dict) -> None:
        """Append ``row`` (a point's JSON, with its ``params``) unless its point has one."""
        key = point_key(row["params"])
        if key in self.rows:
            return
        self.rows[key] = row
        self._write(row)


def _differs(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} here" for k in keys[:3])


__all__ = ["ResultsFile"]
