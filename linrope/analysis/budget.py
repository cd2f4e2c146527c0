"""Does each headline claim survive more training?  The claims of the bytes comparison at every budget a study
ran (``conf/experiment/budget.yaml``: ``<dir>/steps800``, ``<dir>/steps3200``), side by side.

    python -m linrope.analysis.budget docs/results/budget

For each budget folder it writes the ordinary report (``linrope.report``: report.md, summary.csv, pairs.csv,
runs.csv and figures, in that folder), then one table, ``<dir>/budget.md`` and ``budget.csv``: every claim of
``CLAIMS`` as a paired difference A − B over the seeds both configurations finished, at each budget, and what
became of it:

* **holds** — resolved (95% interval excludes 0) with the same sign at every budget;
* **flips** — resolved with opposite signs;
* **budget artefact** — resolved at the smallest budget, not at the largest;
* **emerges** — not resolved at the smallest budget, resolved at the largest;
* **undecided** — resolved at no budget.

Light: no torch; reads the run folders (``linrope.analysis.runs``)."""
from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from linrope.analysis import report_files as outputs
from linrope.analysis import report_provenance as provenance
from linrope.analysis.report import PAIRS, build_report, pair_record
from linrope.analysis.runs import by_seed, find_runs, group_runs
from linrope.analysis.stats import LEVEL, paired

WRITTEN = ("budget.md", "budget.csv", "budget.png")
LEGACY = {"budget.md": ("# Headline claims against the training budget",)}  # before the manifest (report_files)


@dataclass(frozen=True)
class Claim:
    text: str       # the claim, as README words it
    metric: str     # test/bpb, or bpb@<length> (the extrapolation table, as trained: no scaling)
    a: str
    b: str


CLAIMS = (
    Claim("RoPE in the numerator helps linear attention", "test/bpb", "linear_rope", "linear"),
    Claim("numerator-only RoPE against numerator and denominator", "test/bpb", "linear_rope", "linear_rope_both"),
    Claim("linear attention with RoPE stays behind softmax with RoPE", "test/bpb", "linear_rope", "softmax_rope"),
    Claim("RoPE's gain for linear attention at 2× the training length", "bpb@256", "linear_rope", "linear"),
    Claim("RoPE's gain for linear attention reverses at 16×", "bpb@2048", "linear_rope", "linear"),
    Claim("ALiBi against RoPE for linear attention", "test/bpb", "linear_alibi", "linear_rope"),
    Claim("ALiBi against RoPE for linear attention at 16×", "bpb@2048", "linear_alibi", "linear_rope"),
    Claim("linear against softmax attention, both with ALiBi", "test/bpb", "linear_alibi", "softmax_alibi"),
    Claim("T5's learned bias against ALiBi (softmax)", "test/bpb", "softmax_t5", "softmax_alibi"),
    Claim("RoPE against ALiBi for softmax at 16×", "bpb@2048", "softmax_rope", "softmax_alibi"),
)
EXTRA_PAIRS = tuple(dict.fromkeys((c.a, c.b) for c in CLAIMS if (c.a, c.b) not in PAIRS))


def shown(folder: Path) -> str:
    """``folder`` as its command is typed: relative to the current folder when inside it."""
    try:
        return str(Path(folder).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(folder)


def arms(folder: Path, prefix: str = "steps") -> List[Path]:
    """The arms of a study, smallest first: its folders ``<prefix><N>`` (steps800, width64)."""
    found = [p for p in folder.iterdir() if p.is_dir() and re.fullmatch(rf"{prefix}\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name[len(prefix):]))


def check_arms(folders: Sequence[Path], prefix: str, key: str, tool: str) -> None:
    """An arm's label is what its runs recorded: every run of ``<prefix><N>/`` has ``key`` = N (budget:
    ``trainer.max_steps``; recall: ``model.d_model``), else one line names the first run that does not."""
    for arm in folders:
        n = int(arm.name[len(prefix):])
        wrong = [r for r in find_runs(arm) if r.get(key) != n]
        if wrong:
            more = f" and {len(wrong) - 1} more" if len(wrong) > 1 else ""
            raise SystemExit(f"{tool}: {arm.name}/{wrong[0].path.relative_to(arm)} ran with {key}="
                             f"{wrong[0].get(key)}{more}, not {n} as its folder {arm.name}/ says: move it to the arm "
                             f"it belongs to")


def check_code(folders: Sequence[Path], study: Path, allow_mixed: bool, tool: str) -> Optional[str]:
    """The runs of every arm come from one code and torch version (linrope.analysis.report_provenance), whatever the
    flags: else one line, refused unless ``allow_mixed``; returns the line for the table's top, or None."""
    runs = []
    for arm in folders:
        found = find_runs(arm)
        provenance.fill_in(found, [arm, study])  # runs that predate their own provenance.json
        runs += found
    line = provenance.mixed(runs)
    if line and not allow_mixed:
        raise SystemExit(f"{tool}: across {', '.join(a.name for a in folders)}, {line}: pass --allow-mixed to "
                         f"table them together, or run the older arms again")
    return f"**Mixed provenance: {line}.**" if line else None


def write_reports(folders: Sequence[Path], task: str, pairs: Sequence, allow_mixed: bool = False) -> None:
    """Each arm's own linrope.report beside its runs, with the ``pairs`` both of whose configurations ran."""
    for arm in folders:
        have = set(group_runs(find_runs(arm)).get(task, {}))
        extra = [(a, b) for a, b in pairs if a in have and b in have and (a, b) not in PAIRS]  # a study still running
        build_report([arm], arm, [*PAIRS, *extra], allow_mixed=allow_mixed)


def value_of(metric: str):
    """run -> its value of ``metric``: the logged test score, or the extrapolation table's bpb at a length."""
    if metric.startswith("bpb@"):
        length = int(metric[4:])
        return lambda run: next((r["bpb"] for r in run.extrapolation if r["scaling"] == "none"
                                 and r["length"] == length and r["status"] == "ok"), None)
    return lambda run: run.value(metric, "last")


def claim_results(folder: Path, claims: Sequence[Claim] = CLAIMS, task: str = "bytes") -> Dict[Claim, Any]:
    """claim -> Paired in this arm (None when a configuration is missing)."""
    groups = group_runs(find_runs(folder)).get(task, {})
    out = {}
    for c in claims:
        if c.a in groups and c.b in groups:
            value = value_of(c.metric)
            out[c] = paired(by_seed(groups[c.a], value), by_seed(groups[c.b], value), LEVEL)
        else:
            out[c] = None
    return out


def sign(r) -> int:
    """+1 / -1 when resolved, 0 when not (or missing)."""
    if r is None or r.diff.n < 2 or not r.diff.excludes_zero():
        return 0
    return 1 if r.diff.mean > 0 else -1


def fate(results: Sequence[Any]) -> str:
    signs = [sign(r) for r in results]
    if any(r is None or r.diff.n < 2 for r in results):
        return "incomplete"
    if len(results) < 2:
        return "one budget so far"
    first, last = signs[0], signs[-1]
    if first and last:
        return "holds" if first == last and all(s == first for s in signs) else "flips"
    if first:
        return "budget artefact"
    if last:
        return "emerges"
    return "undecided"


def cell(r) -> str:
    if r is None:
        return "–"
    d = r.diff
    if d.n < 2:
        return f"{d.mean:+.3f} (n={d.n})" if d.n else "–"
    star = "**" if d.excludes_zero() else ""
    return f"{star}{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]{star} (n={d.n})"


def per_run_lines(budgets: Sequence[Path], task: str = "bytes") -> List[str]:
    """One row per configuration and seed: each claim metric at each budget (what every interval is made of)."""
    metrics = list(dict.fromkeys(c.metric for c in CLAIMS))
    configs = list(dict.fromkeys(x for c in CLAIMS for x in (c.a, c.b)))
    groups = {arm.name: group_runs(find_runs(arm)).get(task, {}) for arm in budgets}
    values = {(arm.name, m, label): by_seed(groups[arm.name].get(label, []), value_of(m))
              for arm in budgets for m in metrics for label in configs}
    header = ["configuration", "seed", *(f"{m} at {int(a.name[5:])}" for m in metrics for a in budgets)]
    lines = [f"| {' | '.join(header)} |", "|" + "|".join("---" for _ in header) + "|"]
    for label in configs:
        seeds = sorted({s for arm in budgets for s in values[(arm.name, metrics[0], label)]}, key=str)
        for seed in seeds:
            got = [values[(a.name, m, label)].get(seed) for m in metrics for a in budgets]
            lines.append(f"| {label} | {seed} | " + " | ".join("–" if v is None else f"{v:.4f}" for v in got) + " |")
    return lines


def plot_claims(claims: Sequence[Claim], per_arm: Sequence[Dict[Claim, Any]], names: Sequence[str], path: Path,
                title: str) -> Optional[Path]:
    """A forest plot: each claim's paired interval A − B (bpb) at every arm, one row per claim, the arms from
    light (smallest) to dark; a panel per scale (the training length; bpb@L beyond it, whose differences are
    ten times larger).  None (and no file) when no arm has an interval."""
    from matplotlib.lines import Line2D

    from linrope.base.plots import pyplot, save

    panels = [(t, [c for c in claims if c.metric.startswith("bpb@") == beyond])
              for t, beyond in (("at the training length", False), ("beyond it (bpb@L, as trained)", True))]
    panels = [(t, cs) for t, cs in panels if any(r.get(c) is not None for r in per_arm for c in cs)]
    if not panels:
        return None
    plt = pyplot()
    colours = [plt.cm.Blues(0.45 + 0.5 * k / max(1, len(names) - 1)) for k in range(len(names))]
    rows = max(len(cs) for _, cs in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 0.62 * rows + 1.6), squeeze=False,
                             layout="constrained")
    for ax, (panel_title, cs) in zip(axes[0], panels):
        for k, (colour, results) in enumerate(zip(colours, per_arm)):
            offset = ((len(names) - 1) / 2 - k) * 0.22  # the first arm on top
            for i, c in enumerate(cs):
                r = results.get(c)
                if r is None or r.diff.n == 0:
                    continue
                d, y = r.diff, len(cs) - 1 - i + offset
                if d.n > 1:
                    ax.plot([d.lo, d.hi], [y, y], color=colour, linewidth=2.2)
                ax.plot([d.mean], [y], marker="o", markersize=6, color=colour,
                        markerfacecolor=colour if d.n > 1 and d.excludes_zero() else "white")
        ax.axvline(0, color="grey", linewidth=1)
        ax.set_yticks(range(len(cs)))
        ax.set_yticklabels([f"{c.a} − {c.b}" + (f" ({c.metric})" if c.metric.startswith("bpb@") else "")
                            for c in reversed(cs)], fontsize=8)
        ax.set_ylim(-0.6, len(cs) - 0.4)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("A − B (bpb)")
        ax.grid(True, axis="x", alpha=0.3)
    handles = [Line2D([], [], color=c, marker="o", linewidth=2.2, label=n) for c, n in zip(colours, names)]
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(f"{title}\n(dot: mean over seeds, filled where the 95% interval excludes 0; line: the interval)",
                 fontsize=11)
    return save(fig, path)


def budget_table(folder: Path, reports: bool = True, allow_mixed: bool = False, write: bool = True) -> str:
    budgets = arms(folder)
    if not budgets:
        raise SystemExit(f"linrope.analysis.budget: no budget folders (steps<N>/) in {folder}")
    check_arms(budgets, "steps", "trainer.max_steps", "linrope.analysis.budget")
    mixed = check_code(budgets, folder, allow_mixed, "linrope.analysis.budget")
    if write:
        outputs.claim(folder, WRITTEN, "linrope.analysis.budget", LEGACY)
    if reports:
        write_reports(budgets, "bytes", EXTRA_PAIRS, allow_mixed)
    results = {arm.name: claim_results(arm) for arm in budgets}
    names = [f"{int(a.name[5:])} steps" for a in budgets]
    header = ["claim", "A − B", "metric", *names, "with more budget"]
    lines = [f"| {' | '.join(header)} |", "|" + "|".join("---" for _ in header) + "|"]
    rows: List[Dict[str, Any]] = []
    for c in CLAIMS:
        per = [results[a.name][c] for a in budgets]
        what = fate(per)
        lines.append(f"| {c.text} | {c.a} − {c.b} | {c.metric} | " + " | ".join(cell(r) for r in per) + f" | {what} |")
        for arm, r in zip(budgets, per):
            if r is not None:
                rows.append({"claim": c.text, "budget": arm.name, "fate": what, **pair_record("bytes", c.metric, c.a,
                                                                                              c.b, r)})
    text = "\n".join([
        "# Headline claims against the training budget",
        "", *([mixed, ""] if mixed else []),
        f"Paired differences A − B (lower bpb is better), mean [95% t-interval] over the seeds both configurations "
        f"finished; **bold**: the interval excludes 0.  Budgets: {', '.join(names)} "
        f"(folders {', '.join(a.name for a in budgets)}, each with its own report.md).  " + (
            f"'with more budget': holds (same resolved sign at every budget), flips (opposite signs), budget "
            f"artefact (resolved at {names[0]} only), emerges (resolved at {names[-1]} only), undecided (resolved "
            f"at none), incomplete (a budget lacks two seeds).  " if len(budgets) > 1 else
            "Only one budget has run so far: no claim can be followed yet.  ") +
        f"Written by `python -m linrope.analysis.budget {shown(folder)}`.",
        "", *lines, "",
        "![each claim's paired interval at every budget](budget.png)", "",
        "## Per-run values", "",
        "What every interval above is made of: each run's value, by configuration and seed (bpb@<length>: the "
        "extrapolation table as trained, no scaling; –: the run has not finished).", "",
        *per_run_lines(budgets), ""])
    if not write:  # tests/analysis/test_results.py: recomputed from the committed runs, compared with the files
        return text
    (folder / "budget.md").write_text(text)
    plot_claims(CLAIMS, [results[a.name] for a in budgets], names, folder / "budget.png",
                "Headline claims of the bytes comparison against the training budget: A − B in bpb (below 0: A better)")
    if rows:
        with open(folder / "budget.csv", "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]))
            out.writeheader()
            out.writerows(rows)
    outputs.record(folder, WRITTEN)
    return text


def arms_main(module: str, doc: str, prefix: str, table, written: str, argv: Optional[Sequence[str]] = None) -> int:
    """The command line of a table over a study's arms (linrope.analysis.budget, linrope.analysis.recall)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=f"example:\n  python -m {module} docs/results/{module.split('.')[-1]}")
    ap.add_argument("folder", type=Path, help=f"the study folder holding {prefix}<N>/ folders of runs")
    ap.add_argument("--no-reports", action="store_true", help="only the table, not each arm's own report")
    ap.add_argument("--allow-mixed", action="store_true", help="passed to each arm's report")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"{args.folder}: not a folder")
    print(table(args.folder, reports=not args.no_reports, allow_mixed=args.allow_mixed))
    print(f"wrote {args.folder / written}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return arms_main("linrope.analysis.budget", __doc__, "steps", budget_table, "budget.md", argv)


if __name__ == "__main__":
    sys.exit(main())
