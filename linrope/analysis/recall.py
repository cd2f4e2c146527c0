"""Recall against model width: the calibrated recall probe (``conf/experiment/recall.yaml``) at every width a
study ran (``<dir>/width64``, ``<dir>/width128``), side by side, as Zoology draws it.

    python -m linrope.analysis.recall docs/results/recall

Writes each width's own report (``linrope.report``, beside its runs), then ``<dir>/recall.md`` and
``recall.csv``: test accuracy per configuration and width (mean ± the 95% t half-width, the lowest seed, n),
whether the positive control (``softmax_rope``) reached ``CONTROL_BAR`` in every seed at every width, and
the paired differences ``PAIRS_ASKED`` per width.  Light: no torch."""
from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from linrope.analysis import report_files as outputs
from linrope.analysis.budget import Claim, arms, arms_main, cell, check_arms, check_code, claim_results, shown, write_reports
from linrope.base.plots import Curve, Panel, by_last_value, config_style, plot_curves
from linrope.analysis.runs import Run, by_seed, find_runs, group_runs
from linrope.analysis.stats import mean_ci

TASK, METRIC = "mqar", "test/acc"
CONTROL, CONTROL_BAR = "softmax_rope", 0.95
PAIRS_ASKED = (("linear_rope", "linear"), ("linear_rope", "linear_rope_both"), ("linear_rope", "softmax_rope"))
WRITTEN = ("recall.md", "recall.csv", "recall.png")
CLAIMS = tuple(Claim(f"{a} − {b}", METRIC, a, b) for a, b in PAIRS_ASKED)


def accuracies(groups: Dict[str, List[Run]]) -> Dict[str, Dict[Any, float]]:
    """configuration -> seed -> test accuracy, from one width's runs grouped by configuration."""
    return {label: by_seed(runs, lambda r: r.value(METRIC, "last")) for label, runs in groups.items()}


def plot_recall(widths: Sequence[Path], groups: Dict[str, Dict[str, List[Run]]], acc: Dict[str, Dict[str, Dict[Any, float]]],
                path: Path) -> Optional[Path]:
    """Zoology's picture: test accuracy against model width, one line per configuration (the report's styles:
    hue the position scheme, line style the attention kind), mean over seeds with a lowest-to-highest band."""
    curves = []
    for c in dict.fromkeys(c for w in widths for c in acc[w.name]):
        points = {int(w.name[5:]): list(acc[w.name][c].values()) for w in widths if acc[w.name].get(c)}
        first = next(groups[w.name][c][0] for w in widths if groups[w.name].get(c))
        curves.append(Curve(c, points, config_style(first.config)))
    return plot_curves([Panel("", by_last_value(curves, descending=True))], path, xlabel="model width (d_model)",
                       ylabel=f"{METRIC} (mqar)", log2_x=True, title="Recall against model width",
                       vlines=[], note="line: mean over seeds; band: lowest to highest seed")


def acc_cell(seeds: Dict[Any, float]) -> str:
    if not seeds:
        return "–"
    iv = mean_ci(list(seeds.values()))
    spread = f" ± {iv.half_width:.3f}" if iv.n > 1 else ""
    return f"{iv.mean:.3f}{spread} (min {min(seeds.values()):.3f}, n={iv.n})"


def control_text(by_width: Dict[str, Dict[Any, float]]) -> str:
    """Whether the positive control reached ``CONTROL_BAR`` in every seed, width by width."""
    ran = {w: min(seeds.values()) for w, seeds in by_width.items() if seeds}
    missing = [w for w in by_width if w not in ran]
    low = [f"{w} (lowest seed {v:.3f})" for w, v in ran.items() if v < CONTROL_BAR]
    high = [f"{w} (lowest seed {v:.3f})" for w, v in ran.items() if v >= CONTROL_BAR]
    parts = []
    if low:
        parts.append(f"Positive control NOT met: {CONTROL} must reach {CONTROL_BAR} test accuracy in every seed; it "
                     f"does not at {', '.join(low)}.")
    if high:
        parts.append(f"Positive control: {CONTROL} reached {CONTROL_BAR} test accuracy in every seed at "
                     f"{', '.join(high)}.")
    if missing:
        parts.append(f"{CONTROL} has not run yet at {', '.join(missing)}.")
    return " ".join(parts)


def recall_table(folder: Path, reports: bool = True, allow_mixed: bool = False, write: bool = True) -> str:
    widths = arms(folder, "width")
    if not widths:
        raise SystemExit(f"linrope.analysis.recall: no width folders (width<N>/) in {folder}")
    found = {w.name: group_runs(find_runs(w)) for w in widths}
    other = sorted({task for g in found.values() for task in g} - {TASK})
    if not any(g.get(TASK) for g in found.values()) and other:
        raise SystemExit(f"linrope.analysis.recall: the runs under {folder} are {', '.join(other)} runs, not {TASK}: "
                         f"linrope.analysis.recall tables the recall probe (experiment=recall); use linrope.report")
    check_arms(widths, "width", "model.d_model", "linrope.analysis.recall")
    mixed = check_code(widths, folder, allow_mixed, "linrope.analysis.recall")
    if write:
        outputs.claim(folder, WRITTEN, "linrope.analysis.recall", {"recall.md": ("# Recall (mqar) against model width",)})
    if reports:
        write_reports(widths, TASK, PAIRS_ASKED, allow_mixed)
    groups = {name: g.get(TASK, {}) for name, g in found.items()}
    acc = {name: accuracies(g) for name, g in groups.items()}
    names = [f"width {int(w.name[5:])}" for w in widths]
    configs = list(dict.fromkeys(c for w in widths for c in acc[w.name]))
    configs.sort(key=lambda c: -max((mean_ci(list(acc[w.name][c].values())).mean for w in widths
                                    if acc[w.name].get(c)), default=0.0))
    rows: List[Dict[str, Any]] = []
    lines = [f"| configuration | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for c in configs:
        lines.append(f"| {c} | " + " | ".join(acc_cell(acc[w.name].get(c, {})) for w in widths) + " |")
        for w in widths:
            for seed, v in sorted(acc[w.name].get(c, {}).items(), key=lambda kv: str(kv[0])):
                rows.append({"kind": "run", "configuration": c, "width": w.name, "seed": seed, METRIC: v})
    control_line = control_text({n: acc[w.name].get(CONTROL, {}) for n, w in zip(names, widths)})
    pair_lines = [f"| A − B | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    results = {w.name: claim_results(w, CLAIMS, TASK) for w in widths}
    for c in CLAIMS:
        pair_lines.append(f"| {c.text} | " + " | ".join(cell(results[w.name][c]) for w in widths) + " |")
        for w in widths:
            r = results[w.name][c]
            if r is not None:
                rows.append({"kind": "pair", "configuration": c.text, "width": w.name, "seed": " ".join(map(str, r.seeds)),
                             METRIC: r.diff.mean, "ci low": r.diff.lo, "ci high": r.diff.hi, "n": r.diff.n})
    text = "\n".join([
        "# Recall (mqar) against model width", "", *([mixed, ""] if mixed else []),
        f"Test accuracy on {TASK} (the fixed test set), mean over seeds ± the 95% t half-width, with the lowest "
        f"seed and the number of seeds; each width's report.md is in its folder.  Written by "
        f"`python -m linrope.analysis.recall {shown(folder)}`.", "", control_line, "", *lines, "",
        "Paired differences of test accuracy, A − B over matching seeds, mean [95% t-interval]; **bold**: the "
        "interval excludes 0.", "", *pair_lines, "", "![test accuracy against model width](recall.png)", ""])
    if not write:  # tests/analysis/test_results.py: recomputed from the committed runs, compared with the files
        return text
    (folder / "recall.md").write_text(text)
    plot_recall(widths, groups, acc, folder / "recall.png")
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(folder / "recall.csv", "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=keys)
            out.writeheader()
            out.writerows(rows)
    outputs.record(folder, WRITTEN)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    return arms_main("linrope.analysis.recall", __doc__, "width", recall_table, "recall.md", argv)


if __name__ == "__main__":
    sys.exit(main())
