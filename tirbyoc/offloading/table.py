"""Plain-text tables for the command line."""

from __future__ import annotations

import shutil
import textwrap


def terminal_width() -> int:
    """The terminal's width, or 120 columns when output is not a terminal (a pipe, a file)."""
    return shutil.get_terminal_size((120, 24)).columns


def render(headers: list[str], rows: list[list[object]], width: int | None = None) -> str:
    """Columns padded to their widest cell. When the table is wider than ``width`` (default:
    the terminal's), the widest column wraps onto continuation lines so that every row stays
    readable instead of running off the screen."""
    width = width or terminal_width()
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    wrap_col = max(range(len(widths)), key=widths.__getitem__) if widths else 0
    if over > 0 and widths[wrap_col] - over >= 24:
        widths[wrap_col] -= over
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    for r in cells:
        parts = textwrap.wrap(r[wrap_col], widths[wrap_col], break_long_words=True,
                              break_on_hyphens=False) if len(r[wrap_col]) > widths[wrap_col] else [r[wrap_col]]
        for n, part in enumerate(parts or [""]):
            row = list(r) if n == 0 else [""] * len(r)
            row[wrap_col] = part
            out.append(line(row))
    return "\n".join(out)


def group_repeats(rows: list[list[object]], column: int, min_length: int = 40):
    """``rows`` with long texts that repeat in ``column`` replaced by ``[n]``, and the notes
    ``["[n] text", ...]`` to print under the table (a reason shared by twenty PrimFuncs is read
    once)."""
    texts = [str(r[column]) for r in rows]
    repeated = [t for t in dict.fromkeys(texts) if len(t) >= min_length and texts.count(t) > 1]
    if not repeated:
        return rows, []
    label = {t: f"[{n}]" for n, t in enumerate(repeated, 1)}
    new = [list(r[:column]) + [label.get(str(r[column]), r[column])] + list(r[column + 1:]) for r in rows]
    return new, [f"{label[t]} {t}" for t in repeated]
