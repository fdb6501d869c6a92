"""What a searched sweep reports: the best point, the Pareto front as a table and a plot,
and the whole search as JSON."""

from __future__ import annotations

from tirbyoc.app.sweeping.search import SearchResult
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.table import render


def _figure(objective, point) -> str:
    v = objective.value(point)
    if v is None:
        return "-"
    if objective.name.endswith("_busy"):
        return f"{v:.0%}"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def summary(result: SearchResult) -> str:
    """The trials, the best point and (with several objectives) the front, in words and a table."""
    objs = result.objectives
    read = f" ({result.resumed} read back from the results file)" if result.resumed else ""
    lines = [f"{result.trials} points{read}, {result.seconds:.0f} s; "
             f"{len(result.feasible())} feasible"
             + (f" ({len(result.skipped)} proposals broke a constraint before running)" if result.skipped else "")]
    best = result.best()
    if best is None:
        lines.append("no feasible point")
        return "\n".join(lines)
    lines.append(f"best {objs[0].name}: {_figure(objs[0], best)} at {best.label()}")
    if len(objs) > 1:
        front = result.front()
        lines.append(f"\nPareto front ({len(front)} points; " + ", ".join(f"{o.name} {o.direction[:3]}" for o in objs) + ")")
        lines.append(render(("parameters", *(o.name for o in objs), "verified"),
                            [(p.label(), *(_figure(o, p) for o in objs), "yes" if p.verified else "-")
                             for p in front]))
    return "\n".join(lines)


def to_json(result: SearchResult) -> dict:
    best = result.best()
    return {"objectives": [o.name for o in result.objectives],
            "constraints": [str(c) for c in result.constraints],
            "trials": result.trials, "seconds": round(result.seconds, 1),
            "best": None if best is None else best.to_json(),
            "front": [p.to_json() for p in result.front()],
            "skipped": [{"params": p, "constraint": c} for p, c in result.skipped]}


def plot_front(result: SearchResult, path: str, title: str = "") -> None:
    """Every feasible point by the first two objectives, the Pareto front joined and
    labelled, the infeasible ones (a constraint or no figure) left out."""
    if len(result.objectives) < 2:
        raise TirbyocError("a Pareto plot needs two objectives (--objective twice)")
    try:
        import matplotlib  # deferred: an optional dependency (the plot extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: as above
    except ImportError:
        raise TirbyocError("--plot needs matplotlib: pip install 'tirbyoc[plot]'") from None
    x_obj, y_obj = result.objectives[:2]
    ok = result.feasible()
    front = result.front()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.scatter([x_obj.value(p) for p in ok], [y_obj.value(p) for p in ok], s=18, color="#9e9e9e",
               label=f"{len(ok)} feasible points")
    fx, fy = [x_obj.value(p) for p in front], [y_obj.value(p) for p in front]
    ax.plot(fx, fy, "o-", color="#c62828", label=f"Pareto front ({len(front)})", drawstyle="steps-post")
    for p, x, y in zip(front, fx, fy):
        ax.annotate(p.label().replace(", ", "\n"), (x, y), fontsize=6, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel(f"{x_obj.name} ({x_obj.doc})", fontsize=8)
    ax.set_ylabel(f"{y_obj.name} ({y_obj.doc})", fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title(title or "searched sweep", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["plot_front", "summary", "to_json"]
