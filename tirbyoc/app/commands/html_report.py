"""`tirbyoc run --report PATH.html`: one self-contained page (no scripts, no downloads).

The page has the run's summary (model, templates, coverage, latencies, error), a coverage
plot - one horizontal bar per PrimFunc with multiply-accumulates, its length the function's
MACs over all its call sites, the offloaded part filled - drawn as inline SVG, and the per-function table with the
intrinsic or library kernel used or the reason the function stayed.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-top: 1em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.kept td { color: #777; }
.ok { color: #1a7f37; } .bad { color: #c62828; }
"""


def _bars(report, width: int = 640, row: int = 18) -> str:
    rows = [f for f in report.shown() if f.macs]
    if not rows:
        return "<p>No multiply-accumulates in this model.</p>"
    label_w, longest = 150, max(f.total_macs for f in rows)
    height = row * len(rows) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + width + 90}" '
             f'height="{height}" role="img" aria-label="MACs per PrimFunc, offloaded part filled">']
    for n, f in enumerate(rows):
        y = n * row
        full = width * f.total_macs / longest
        done = width * f.offloaded_macs * f.calls / longest
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" font-size="12">'
                     f'{escape(f.name)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{full:.1f}" height="{row - 5}" '
                     'fill="#eee" stroke="#999"/>')
        if done:
            parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{done:.1f}" height="{row - 5}" '
                         'fill="#2e7d32"/>')
        parts.append(f'<text x="{label_w + full + 4:.1f}" y="{y + 13}" font-size="11">'
                     f'{f.total_macs:,}</text>')
    parts.append(f'<text x="{label_w}" y="{height - 6}" font-size="11">filled: offloaded MACs; '
                 'outline: all MACs of the function</text></svg>')
    return "".join(parts)


def render(result) -> str:
    """The HTML page for a `tirbyoc.app.running.run.RunResult`."""
    r = result.report
    lat = result.latency_ms
    css = {True: "ok", False: "bad"}.get(result.verified, "")
    outcome = f'<span class="{css}">{escape(result.outcome())}</span>'
    summary = [
        ("model", escape(result.model)), ("templates", escape(", ".join(result.templates))),
        ("target", escape(str(result.target))),
        ("MAC coverage", f"{r.coverage:.1%} ({r.offloaded_macs:,} of {r.total_macs:,})"),
        ("latency, offloaded", f"{lat['offloaded']:.3f} ms" if "offloaded" in lat else
         escape(f"not measured: {', '.join(result.emulates)} emulates an instruction")
         if result.emulates else "-"),
        ("latency, TVM default", f"{lat['baseline']:.3f} ms" if "baseline" in lat else "-"),
        ("outputs", outcome),
    ]
    if result.not_run:
        summary.append(("not run", escape(result.not_run)))
    rows = [f'<tr class="{"" if f.offloaded else "kept"}"><td>{escape(f.name)}</td>'
            f'<td class="num">{f.calls}</td><td class="num">{f.total_macs:,}</td>'
            f'<td class="num">{f.offloaded_macs * f.calls:,}</td>'
            f'<td>{escape(f.kernel())}</td><td>{escape(f.note())}</td></tr>' for f in r.shown()]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tirbyoc run: {escape(result.model)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>tirbyoc run: {escape(result.model)}</h1><table>"
        + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in summary)
        + "</table><h2>Coverage</h2>" + _bars(r)
        + "<h2>PrimFuncs with multiply-accumulates</h2><table><tr><th>PrimFunc</th><th>calls</th><th>MACs</th>"
        "<th>offloaded MACs</th><th>intrinsic or library kernel</th><th>note</th></tr>"
        + "".join(rows) + "</table>"
        f"<p>{r.others} other PrimFuncs (no multiply-accumulates) were left to TVM.</p></body></html>\n"
    )


def write(result, path) -> Path:
    path = Path(path)
    path.write_text(render(result), encoding="utf-8")
    return path


__all__ = ["render", "write"]
