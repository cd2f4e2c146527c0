"""Plotting helpers shared by the sweep report (and open to ``linrope evaluate``).

One encoding everywhere: the **hue names the position scheme** (the same colour for a scheme in
every figure), the **line style names the attention kind** (softmax solid, linear elu+1 dashed,
linear 1+cos dotted) and the **marker the variant** (RoPE in numerator and denominator, pi / ntk
scaling).  A curve is the mean over seeds with a shaded band from the lowest to the highest seed;
legends sit outside the axes and figures are saved with ``bbox_inches="tight"`` so nothing is cut.

``plot_curves`` draws panels of ``Curve`` objects (x -> values over seeds); ``config_style`` gives the
style of a run from its flat (dotted-key) config."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

# matplotlib (~0.5 s) is imported inside the functions that draw: `python -m linrope report --help` stays fast

# a qualitative palette, one hue per position scheme (tab10's ten plus two that stay apart from them)
POSITION_COLOURS = {
    "none": "#000000",
    "rope": "#d62728",
    "alibi": "#1f77b4",
    "t5": "#2ca02c",
    "xl": "#9467bd",
    "learned": "#ff7f0e",
    "sinusoidal": "#8c564b",
    "floater": "#e377c2",
    "multiplicative": "#17becf",
    "shaw": "#bcbd22",
    "deberta": "#7f7f7f",
    "tupe": "#0b3d91",
}
EXTRA_COLOURS = ("#b8860b", "#006d5b", "#8b0a50", "#4b0082", "#556b2f", "#cc5500")
ATTENTION_STYLES = {("softmax", None): "-", ("linear", "elu"): "--", ("linear", "cosine"): ":"}
VARIANT_MARKERS = {"both": "D", "pi": "^", "ntk": "v"}
# a RoPE model evaluated as trained / scaled
SCALING_STYLES = {"none": "-", "pi": "--", "ntk": ":", "yarn": (0, (6, 2, 1, 2, 1, 2)), "dynamic": (0, (1, 4))}
# tab10, for lines that are not one per position scheme
SERIES_COLOURS = tuple("#d62728 #1f77b4 #2ca02c #9467bd #ff7f0e #8c564b #e377c2 #17becf #bcbd22 #7f7f7f".split())
BAND_ALPHA = 0.15
CONTROL_COLOUR = "#000000"  # a length table's context-limited control (attention to the last L0 keys)


def position_colour(name: Optional[str]) -> str:
    """The hue of a position scheme; unknown names get a stable colour from EXTRA_COLOURS."""
    name = str(name or "none")
    if name in POSITION_COLOURS:
        return POSITION_COLOURS[name]
    return EXTRA_COLOURS[sum(map(ord, name)) % len(EXTRA_COLOURS)]


def series_colour(i: int) -> str:
    return SERIES_COLOURS[i % len(SERIES_COLOURS)]


def config_style(config: Mapping[str, Any]) -> Dict[str, Any]:
    """colour / linestyle / marker for a run from its flat config (``model.attention.kind`` …)."""
    kind = str(config.get("model.attention.kind") or "softmax")
    feature_map = config.get("model.attention.feature_map") if kind == "linear" else None
    linestyle = ATTENTION_STYLES.get((kind, feature_map), ATTENTION_STYLES.get((kind, "elu"), "-."))
    position = config.get("model.position.name")
    variant = config.get("model.position.scaling") if position == "rope" else None
    if kind == "linear" and position == "rope" and config.get("model.attention.placement") == "both":
        variant = "both"
    return {"color": position_colour(position), "linestyle": linestyle, "marker": VARIANT_MARKERS.get(variant, "o")}


DISTINCT_MARKERS = ("s", "^", "v", "D", "P", "X", "*")


def distinct_styles(curves: Sequence["Curve"]) -> List["Curve"]:
    """The curves, those drawn alike (configurations that differ only in what ``config_style`` does not see:
    a learning rate, a precision) told apart by their markers and shades, in order."""
    seen: Dict[Tuple, int] = {}
    out = []
    for c in curves:
        key = (c.style.get("color"), c.style.get("linestyle"), c.style.get("marker"))
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k:
            marker = DISTINCT_MARKERS[(k - 1) % len(DISTINCT_MARKERS)]
            c = Curve(c.label, c.points, {**c.style, "marker": marker, "alpha": max(0.45, 1.0 - 0.2 * k)})
        out.append(c)
    return out


@dataclass
class Curve:
    """One line: ``points`` maps x to the values of the seeds at x; drawn as mean with a min–max band, over the seeds
    whose value at x is finite (a diverged seed, NaN from its step on, is left out there and counted: ``diverged``)."""

    label: str
    points: Dict[float, List[float]]
    style: Dict[str, Any] = field(default_factory=dict)

    def finite(self, x: float) -> List[float]:
        return [v for v in self.points[x] if math.isfinite(v)]

    def summary(self):
        finite = {x: vs for x in sorted(self.points) if (vs := self.finite(x))}
        return (
            list(finite),
            [statistics.fmean(vs) for vs in finite.values()],
            [min(vs) for vs in finite.values()],
            [max(vs) for vs in finite.values()],
        )

    def diverged(self) -> int:
        """The most seeds with a value that is not finite at one x."""
        return max((len(vs) - len(self.finite(x)) for x, vs in self.points.items()), default=0)

    def legend(self) -> str:
        k = self.diverged()
        return self.label + (f" ({k} seed{'s' * (k > 1)} diverged: left out)" if k else "")


def by_last_value(curves: Sequence[Curve], descending: bool = False) -> List[Curve]:
    """The curves ordered by their mean at the largest x (so the legend reads in the order the lines end)."""

    def last(c: Curve):
        means = c.summary()[1]
        return (not means, (-means[-1] if descending else means[-1]) if means else 0.0)

    return sorted(curves, key=last)


@dataclass
class Panel:
    title: str
    curves: List[Curve]


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


BAND_NOTE = "line: mean over seeds; band: lowest to highest seed"  # what a curve with several x shows


def draw(ax, curve: Curve, shift: float = 1.0, point: bool = False) -> bool:
    """The mean as a line with its min–max band; ``point`` (a panel where no curve has a second x, so there is no
    line or band to draw): its mean with a bar from the lowest to the highest seed and every seed's value as a
    circle, at x × ``shift`` (make_figure sets curves that share their only x side by side)."""
    xs, mean, lo, hi = curve.summary()
    if not xs:
        return False
    style = {"marker": "o", **curve.style}
    if point and len(xs) == 1:
        x = xs[0] * shift
        colour = style.get("color")
        ax.errorbar([x], mean, yerr=[[mean[0] - lo[0]], [hi[0] - mean[0]]], label=curve.legend(), capsize=4,
                    markersize=5, linewidth=1.4, **{k: v for k, v in style.items() if k != "linestyle"})  # fmt: skip
        seeds = curve.finite(xs[0])
        ax.plot([x] * len(seeds), seeds, linestyle="none", marker="o", markersize=3.5, markerfacecolor="none",
                color=colour, alpha=0.7)  # fmt: skip
        return True
    ax.plot(xs, mean, label=curve.legend(), linewidth=1.6, markersize=3.5, **style)
    if any(h > l_ for l_, h in zip(lo, hi)):
        ax.fill_between(xs, lo, hi, color=style.get("color"), alpha=BAND_ALPHA, linewidth=0)
    return True


def only_points(curves: Sequence[Curve]) -> bool:
    """No curve has a second x: nothing to join into a line or fill into a band (``draw``'s ``point``)."""
    return all(len(c.summary()[0]) <= 1 for c in curves)


def single_x_shifts(curves: Sequence[Curve], log2_x: bool) -> List[float]:
    """x multipliers that set curves with one and the same x side by side, so their bars do not hide each other;
    1.0 (no shift) for every curve when any has another x."""
    xs = {x for c in curves for x in c.summary()[0]}
    if len(xs) != 1 or not only_points(curves):
        return [1.0] * len(curves)
    n = len(curves)
    steps = [k - (n - 1) / 2 for k in range(n)]
    return [2 ** (0.05 * s) if log2_x else 1 + 0.03 * s for s in steps]


def save(fig, path: Path, dpi: int = 130) -> Path:
    """Write a figure with everything drawn outside the axes (legends, titles) kept in the image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return path


def make_figure(
    panels: Sequence[Panel],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    log2_x: bool = False,
    vlines: Sequence[float] = (),
    vline_label: str = "",
    note: str = BAND_NOTE,
    hlines: Optional[Mapping[str, float]] = None,
):
    """Panels one above the other, each with its legend to its right (constrained layout makes room for it);
    ``hlines``: label -> y of a reference level drawn across every panel (a reference model's score); None when no
    curve has a point."""
    panels = [p for p in panels if any(c.summary()[0] for c in p.curves)]
    if not panels:
        return None
    if all(only_points(p.curves) for p in panels):  # no lines: each curve is one point (draw)
        note = note.replace(BAND_NOTE, "point: mean over seeds; bar: lowest to highest seed; circles: each seed")
    plt = pyplot()
    import matplotlib.ticker

    wide = max(len(p.curves) for p in panels) > 14  # legends in two columns
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9.8 if wide else 8.4, 4.6 * len(panels)), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes[:, 0], panels):
        shifts, point = single_x_shifts(panel.curves, log2_x), only_points(panel.curves)
        for curve, shift in zip(panel.curves, shifts):
            draw(ax, curve, shift, point)
        if any(s != 1.0 for s in shifts):  # one shared x: a window around it, not around the shifted points
            x = next(c.summary()[0][0] for c in panel.curves if c.summary()[0])
            ax.set_xlim(*((x / 2**0.5, x * 2**0.5) if log2_x else (x * 0.8, x * 1.2)))
        for i, x in enumerate(sorted(set(vlines))):
            label = vline_label if i == 0 and vline_label else None
            ax.axvline(x, color="grey", linestyle=(0, (4, 3)), linewidth=1, label=label)
        for k, (label, y) in enumerate((hlines or {}).items()):
            ax.axhline(y, color="black" if k == 0 else "dimgrey", linestyle=(0, (1, 2)) if k == 0 else "-.",
                       linewidth=1, label=label)  # fmt: skip
        if log2_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if panel.title:
            ax.set_title(panel.title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ncol = 2 if len(panel.curves) > 14 else 1
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=ncol, fontsize=8, handlelength=3.2, frameon=False)
    heading = "\n".join(t for t in (title, f"({note})" if note else "") if t)
    if heading:
        fig.suptitle(heading, fontsize=11)
    return fig


def plot_curves(panels: Sequence[Panel], path: Path, **kwargs) -> Optional[Path]:
    """``make_figure`` saved to ``path``; None (and no file) when nothing is drawn."""
    fig = make_figure(panels, **kwargs)
    return None if fig is None else save(fig, path)


def plot_length_table(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    train_context: Optional[int] = None,
    title: str = "",
    name: Optional[Callable[[Mapping[str, Any]], str]] = None,
) -> Optional[Path]:
    """One model's length table (``linrope.evaluation.extrapolation.length_table`` rows: length, scaling, bpb / acc / loss,
    status) against length, one line per row name (``name(row)``; default its scaling) in the shared scaling styles
    (a scaling's style for a name that is one), the context-limited control in black; n/a rows left out."""
    metric = next((k for k in ("bpb", "acc", "loss") if any(r.get(k) is not None for r in rows)), "loss")
    name = name or (lambda r: r["scaling"])
    curves = []
    labels = list(dict.fromkeys(map(name, rows)))
    controls = [label for label in labels if any(r.get("window") for r in rows if name(r) == label)]
    series = [label for label in labels if label not in controls]
    for label in labels:
        points = {r["length"]: [r[metric]] for r in rows if name(r) == label and r.get(metric) is not None}
        if label in controls:  # the context-limited control: black, a colour no other row has
            style = {"color": CONTROL_COLOUR, "linestyle": (0, (3, 1, 1, 1))}
        else:
            i = series.index(label)
            style = {"color": series_colour(i), "linestyle": SCALING_STYLES.get(label, "-" if i == 0 else "-.")}
            if i >= len(SERIES_COLOURS):  # more rows than colours: a marker tells the repeats apart
                style["marker"] = "s^vD"[(i // len(SERIES_COLOURS) - 1) % 4]
        curves.append(Curve("as trained" if label == "none" else str(label), points, style))
    ylabel = {"bpb": "bits per byte", "acc": "accuracy (scored positions)"}.get(metric, "loss (scored positions)")
    return plot_curves(
        [Panel("", curves)],
        path,
        xlabel="evaluation length (tokens)",
        ylabel=ylabel,
        log2_x=True,
        vlines=[train_context] if train_context else [],
        vline_label="training context",
        title=title or "length extrapolation",
        note="",
    )
