"""The figures of a study's table over its arms (linrope.analysis.arms), as its config asks (``table.figure``):
``claims``, each claim's paired interval A − B at every arm (a panel per scale of metric), or ``by_arm``, the study's
metric against the arm's number, a line per configuration with a lowest-to-highest seed band.  Each returns None (and
writes no file) when there is nothing to draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from linrope.analysis.cells import higher_is_better
from linrope.analysis.runs import Run
from linrope.base.plots import Curve, Panel, by_last_value, config_style, plot_curves


def resolved(r) -> bool:
    """A claim's verdict at one arm (report.claims.Corrected): Holm's, none where the control missed its bar: the table's
    bold."""
    return bool(r.resolved)


def plot_claims(
    claims: Sequence[Any], per_arm: Sequence[Dict[Any, Any]], names: Sequence[str], path: Path, title: str
) -> Optional[Path]:
    """The forest plot of ``claims`` (study_config.Claim) with each arm's report.claims.Corrected (or None) in ``per_arm``."""
    from matplotlib.lines import Line2D

    from linrope.base.plots import pyplot, save

    unit = next((c.metric.split("@")[0].split("/")[-1] for c in claims), "")
    panels = [
        (t, [c for c in claims if ("@" in c.metric) == beyond])
        for t, beyond in (("at the training length", False), (f"at evaluation length L ({unit}@L, as trained)", True))
    ]
    panels = [(t, cs) for t, cs in panels if any(r.get(c) is not None for r in per_arm for c in cs)]
    if not panels:
        return None
    plt = pyplot()
    withheld = any(getattr(r, "withheld", "") for results in per_arm for r in results.values() if r is not None)
    colours = [plt.cm.Blues(0.45 + 0.5 * k / max(1, len(names) - 1)) for k in range(len(names))]
    rows = max(len(cs) for _, cs in panels)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.2 * len(panels), 0.62 * rows + 1.6), squeeze=False, layout="constrained"
    )
    for ax, (panel_title, cs) in zip(axes[0], panels):
        for k, (colour, results) in enumerate(zip(colours, per_arm)):
            offset = ((len(names) - 1) / 2 - k) * 0.22  # the first arm on top
            for i, c in enumerate(cs):
                r = results.get(c)
                if r is None or r.diff.n == 0:
                    continue
                d, y = r.diff, len(cs) - 1 - i + offset
                none = bool(getattr(r, "withheld", ""))  # no verdict there: a cross on a dashed line
                if d.n > 1:
                    ax.plot([d.lo, d.hi], [y, y], color=colour, linewidth=2.2, linestyle="--" if none else "-")
                face = colour if d.n > 1 and resolved(r) else "white"
                ax.plot([d.mean], [y], marker="X" if none else "o", markersize=6, color=colour, markerfacecolor=face)
        ax.axvline(0, color="grey", linewidth=1)
        ax.set_yticks(range(len(cs)))
        ax.set_yticklabels(
            [f"{c.a} − {c.b}" + (f" ({c.metric})" if "@" in c.metric else "") for c in reversed(cs)], fontsize=8
        )
        ax.set_ylim(-0.6, len(cs) - 0.4)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(f"A − B ({unit})")
        ax.grid(True, axis="x", alpha=0.3)
    handles = [Line2D([], [], color=c, marker="o", linewidth=2.2, label=n) for c, n in zip(colours, names)]
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(
        f"{title}\n(dot: mean over seeds, filled where resolved after Holm's correction, as bold in the table; "
        "line: its own 95% interval"
        + ("; cross on a dashed line: no verdict, as the table says why)" if withheld else ")"),
        fontsize=11,
    )
    return save(fig, path)


def plot_by_arm(
    numbers: Sequence[int],
    groups: Dict[str, Dict[str, List[Run]]],
    values: Dict[str, Dict[str, Dict[Any, float]]],
    path: Path,
    study: Any,
    title: str,
    control_missed: Sequence[int] = (),
) -> Optional[Path]:
    """The study's metric against the arm's number; ``groups`` / ``values``: arm folder name -> configuration ->
    runs / seed -> value, in the order of ``numbers``; ``control_missed``: the numbers where a seed of the
    positive control missed its bar (a dashed line each: no verdict there)."""
    arms = list(groups)
    curves = []
    for c in dict.fromkeys(c for a in arms for c in values[a]):
        points = {n: list(values[a][c].values()) for n, a in zip(numbers, arms) if values[a].get(c)}
        first = next(groups[a][c][0] for a in arms if groups[a].get(c))
        curves.append(Curve(c, points, config_style(first.config)))
    return plot_curves(
        [Panel("", by_last_value(curves, descending=higher_is_better(study.metric)))],
        path,
        xlabel=study.arms.get("axis", study.arms["key"]),
        ylabel=f"{study.metric} ({study.arms['task']})",
        log2_x=True,
        title=title,
        vlines=list(control_missed),
        vline_label=f"{study.control['configuration']} (control) missed its bar" if control_missed else "",
        note="line: mean over seeds; band: lowest to highest seed",
    )
