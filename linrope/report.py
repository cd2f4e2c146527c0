"""A sweep's results without wandb: ``python -m linrope.report <sweep dir> [--out DIR]``.

Reads every run under the sweep folder — ``<run>/csv/metrics.csv`` (Lightning's CSVLogger) and
``<run>/.hydra/config.yaml`` — groups runs that differ only in their seed, and writes into the
sweep folder (or ``--out``):

* ``report.md`` — per task, one row per configuration: mean ± sample standard deviation over
  seeds of the best validation value (``val/bpb`` for bytes; ``val/loss`` and ``val/acc`` for the
  tasks), the final test value and the training throughput (``train/tokens_per_sec``); and, when
  runs evaluated length extrapolation (``<run>/extrapolation.csv``), a table by length;
* ``summary.csv`` — the same numbers, machine-readable;
* ``val_curves.png`` — validation curves (mean over seeds) per configuration, one file per task
  when there are several (``val_curves_<task>.png``);
* ``extrapolation.png`` — loss (bits per byte) against evaluation length, when present.

A configuration is named by ``model.name``, followed by the settings that tell apart runs of
the same model (e.g. ``linear_rope feature_map=cosine placement=both``)."""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

# settings that do not tell configurations apart (the seed is what we average over)
IGNORED = ("seed", "data.seed", "data.eval_seed", "paths.", "hydra.", "tags", "task_name", "logger.", "callbacks.",
           "ckpt_path", "extrapolation.", "trainer.enable_progress_bar", "trainer.default_root_dir", "train", "test",
           "data.num_workers")


@dataclass
class Run:
    path: Path
    config: Dict[str, Any]  # flat: dotted key -> value
    series: Dict[str, List[Tuple[int, float]]]  # metric -> [(step, value)]
    extrapolation: List[Dict[str, Any]] = field(default_factory=list)

    def get(self, key: str, default=None):
        return self.config.get(key, default)

    @property
    def task(self) -> str:
        return str(self.get("data.task", "bytes"))

    @property
    def seed(self):
        return self.get("seed")

    def best(self, metric: str, mode: str = "min") -> Optional[float]:
        values = [v for _, v in self.series.get(metric, [])]
        return (min(values) if mode == "min" else max(values)) if values else None

    def last(self, metric: str) -> Optional[float]:
        values = self.series.get(metric, [])
        return values[-1][1] if values else None

    def mean(self, metric: str) -> Optional[float]:
        values = [v for _, v in self.series.get(metric, [])]
        return sum(values) / len(values) if values else None


# ---- reading ---------------------------------------------------------------------------------------------------
def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, dict):
        out: Dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(node, list):
        return {prefix[:-1]: tuple(node)}
    return {prefix[:-1]: node}


def read_metrics(path: Path) -> Dict[str, List[Tuple[int, float]]]:
    series: Dict[str, List[Tuple[int, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(float(row.get("step") or 0))
            for k, v in row.items():
                if k in ("step", "epoch") or v in (None, ""):
                    continue
                try:
                    series[k].append((step, float(v)))
                except ValueError:
                    pass
    return dict(series)


def find_runs(sweep: Path) -> List[Run]:
    from omegaconf import OmegaConf

    from linrope.evaluate import read_csv

    runs = []
    for metrics in sorted(sweep.rglob("metrics.csv")):
        run_dir = metrics.parent.parent if metrics.parent.name == "csv" else metrics.parent
        config_path = run_dir / ".hydra" / "config.yaml"
        config = {}
        if config_path.exists():
            config = flatten(OmegaConf.to_container(OmegaConf.load(config_path), resolve=False))
        extrap = run_dir / "extrapolation.csv"
        runs.append(Run(run_dir, config, read_metrics(metrics), read_csv(extrap) if extrap.exists() else []))
    return runs


# ---- grouping --------------------------------------------------------------------------------------------------
def _ignored(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in IGNORED)


def signature(run: Run) -> Tuple:
    return tuple(sorted((k, repr(v)) for k, v in run.config.items() if not _ignored(k)))


def base_label(run: Run) -> str:
    name = run.get("model.name")
    if name:
        return str(name)
    att, pos = run.get("model.attention.kind"), run.get("model.position.name")
    return f"{att}-{pos}" if att or pos else run.path.name


def group_runs(runs: List[Run]) -> Dict[str, List[Run]]:
    """label -> runs that differ only in their seed; labels made unique by the settings that differ."""
    groups: Dict[Tuple, List[Run]] = {}
    for r in runs:
        groups.setdefault((r.task, signature(r)), []).append(r)
    by_label: Dict[str, List[Tuple]] = defaultdict(list)
    for key, rs in groups.items():
        by_label[(key[0], base_label(rs[0]))].append(key)
    named: Dict[str, List[Run]] = {}
    for (task, label), keys in by_label.items():
        if len(keys) == 1:
            named[_unique(named, label)] = groups[keys[0]]
            continue
        configs = [dict(k[1]) for k in keys]
        differ = [k for k in dict.fromkeys(k for c in configs for k in c) if len({c.get(k) for c in configs}) > 1]
        leaves = [k.split(".")[-1] for k in differ]
        short = [leaf if leaves.count(leaf) == 1 else k.removeprefix("model.") for k, leaf in zip(differ, leaves)]
        for key, c in zip(keys, configs):
            extra = " ".join(f"{s}={_plain(c.get(k))}" for k, s in zip(differ, short))
            named[_unique(named, f"{label} {extra}".strip())] = groups[key]
    return named


def _plain(v: Optional[str]) -> str:
    if v is None:
        return "-"
    return v.strip("'\"")


def _unique(existing: Dict[str, Any], label: str) -> str:
    out, i = label, 2
    while out in existing:
        out, i = f"{label} ({i})", i + 1
    return out


# ---- statistics ------------------------------------------------------------------------------------------------
def mean_std(values: Sequence[Optional[float]]) -> Tuple[Optional[float], Optional[float], int]:
    """Mean and sample standard deviation (n - 1; None for a single value) of the values present."""
    vs = [v for v in values if v is not None and not math.isnan(v)]
    if not vs:
        return None, None, 0
    return statistics.fmean(vs), (statistics.stdev(vs) if len(vs) > 1 else None), len(vs)


def fmt(mean: Optional[float], std: Optional[float], digits: int = 3) -> str:
    if mean is None:
        return "–"
    if std is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def columns_for(task: str):
    """(header, metric, how, digits) of the report's columns for a task."""
    if task == "bytes":
        return [("best val/bpb", "val/bpb", "min", 3), ("test/bpb", "test/bpb", "last", 3),
                ("tokens/s", "train/tokens_per_sec", "mean", 0)]
    return [("best val/loss", "val/loss", "min", 3), ("best val/acc", "val/acc", "max", 3),
            ("test/loss", "test/loss", "last", 3), ("test/acc", "test/acc", "last", 3),
            ("tokens/s", "train/tokens_per_sec", "mean", 0)]


def run_value(run: Run, metric: str, how: str) -> Optional[float]:
    if how == "min":
        return run.best(metric, "min")
    if how == "max":
        return run.best(metric, "max")
    if how == "last":
        return run.last(metric)
    return run.mean(metric)


def summarize(groups: Dict[str, List[Run]]) -> Dict[str, List[Dict[str, Any]]]:
    """task -> rows (sorted by the first column, best first): label, attention, position, n, seeds and
    for each column (mean, std)."""
    tables: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for label, runs in groups.items():
        task = runs[0].task
        row: Dict[str, Any] = {"label": label, "task": task, "n": len(runs),
                               "attention": runs[0].get("model.attention.kind", "?"),
                               "position": runs[0].get("model.position.name", "?"),
                               "seeds": sorted(str(r.seed) for r in runs)}
        for header, metric, how, _ in columns_for(task):
            row[header] = mean_std([run_value(r, metric, how) for r in runs])[:2]
        tables[task].append(row)
    for task, rows in tables.items():
        first, _, how, _ = columns_for(task)[0]
        sign = -1 if how == "max" else 1
        rows.sort(key=lambda r: (r[first][0] is None, sign * (r[first][0] or 0.0), r["label"]))
    return dict(tables)


def extrapolation_table(groups: Dict[str, List[Run]]) -> Tuple[List[int], List[Dict[str, Any]]]:
    """Lengths, and rows (label, task, scaling, metric name, {length: mean}) averaged over seeds."""
    lengths = sorted({r["length"] for runs in groups.values() for run in runs for r in run.extrapolation})
    rows = []
    for label, runs in groups.items():
        if not any(run.extrapolation for run in runs):
            continue
        bytes_like = runs[0].task == "bytes"
        key = "bpb" if bytes_like else "loss"
        scalings = list(dict.fromkeys(r["scaling"] for run in runs for r in run.extrapolation))
        for scaling in scalings:
            values = {}
            for n in lengths:
                vs = [r[key] for run in runs for r in run.extrapolation
                      if r["scaling"] == scaling and r["length"] == n and r[key] is not None]
                values[n] = statistics.fmean(vs) if vs else None
            rows.append({"label": label, "task": runs[0].task, "scaling": scaling, "metric": key, "values": values})
    return lengths, rows


# ---- plots -----------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def matplotlib_ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def plot_val_curves(groups: Dict[str, List[Run]], task: str, path: Path) -> Optional[Path]:
    metric = "val/bpb" if task == "bytes" else "val/loss"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5))
    colours = plt.get_cmap("tab20").colors
    drawn = 0
    for label, runs in groups.items():
        if runs[0].task != task:
            continue
        # softmax solid, linear dashed; 20 colours before any repeats
        by_step: Dict[int, List[float]] = defaultdict(list)
        for r in runs:
            for step, v in r.series.get(metric, []):
                by_step[step].append(v)
        if by_step:
            steps = sorted(by_step)
            linear = runs[0].get("model.attention.kind") == "linear"
            ax.plot(steps, [statistics.fmean(by_step[s]) for s in steps], marker=".", label=label,
                    color=colours[drawn % len(colours)], linestyle="--" if linear else "-")
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(metric + " (mean over seeds)")
    ax.set_title(f"validation — {task} (solid: softmax, dashed: linear)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if drawn > 12 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_extrapolation(rows: List[Dict[str, Any]], path: Path, train_contexts: Sequence[int] = ()) -> Optional[Path]:
    if not rows:
        return None
    plt = _plt()
    scaled = [r for r in rows if r["scaling"] != "none"]
    panels = [("as trained", [r for r in rows if r["scaling"] == "none"])]
    if scaled:
        rope_labels = {r["label"] for r in scaled}
        panels.append(("RoPE: as trained / pi / ntk", [r for r in rows if r["label"] in rope_labels]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    styles = {"none": "-", "pi": "--", "ntk": ":"}
    cycle = plt.get_cmap("tab20").colors  # 20 colours before any repeats
    colour = {label: cycle[i % len(cycle)] for i, label in enumerate(dict.fromkeys(r["label"] for r in rows))}
    for ax, (title, rs) in zip(axes[0], panels):
        for r in rs:
            pts = [(n, v) for n, v in r["values"].items() if v is not None]
            if pts:
                name = r["label"] if title == "as trained" else \
                    f"{r['label']} {'as trained' if r['scaling'] == 'none' else r['scaling']}"
                ax.plot(*zip(*pts), linestyle=styles.get(r["scaling"], "-."), color=colour[r["label"]], marker="o",
                        markersize=3, label=name)
        for c in set(train_contexts):
            ax.axvline(c, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib_ticker().ScalarFormatter())
        ax.set_xlabel("evaluation length (tokens); dashed grey: training context")
        ax.set_ylabel(rows[0]["metric"] if all(r["metric"] == rows[0]["metric"] for r in rows) else "loss / bpb")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- the report ------------------------------------------------------------------------------------------------
def markdown_table(header: List[str], lines: List[List[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def build_report(sweeps: Sequence[Path], out: Path) -> str:
    runs = [r for s in sweeps for r in find_runs(Path(s))]
    if not runs:
        raise SystemExit(f"linrope.report: no runs (csv/metrics.csv) under {', '.join(map(str, sweeps))}")
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    tables = summarize(groups)
    parts = [f"# Sweep report: {', '.join(str(s) for s in sweeps)}", "",
             f"{len(runs)} runs in {len(groups)} configurations; each cell is the mean ± sample standard "
             f"deviation over the configuration's runs (n; seeds listed).  Best val: the best validation value "
             f"of a run; test: its final test value (the best checkpoint); tokens/s: mean training throughput.", ""]
    summary_rows = []
    for task, rows in tables.items():
        cols = columns_for(task)
        header = ["configuration", "attention", "position", "n (seeds)"] + [c[0] for c in cols]
        lines = []
        for r in rows:
            lines.append([r["label"], str(r["attention"]), str(r["position"]), f"{r['n']} ({','.join(r['seeds'])})"]
                         + [fmt(*r[c[0]], digits=c[3]) for c in cols])
            summary_rows.append({"task": task, "configuration": r["label"], "attention": r["attention"],
                                 "position": r["position"], "n": r["n"], "seeds": " ".join(r["seeds"]),
                                 **{f"{c[0]} mean": r[c[0]][0] for c in cols},
                                 **{f"{c[0]} std": r[c[0]][1] for c in cols}})
        parts += [f"## Task: {task}", "", markdown_table(header, lines), ""]
        name = "val_curves.png" if len(tables) == 1 else f"val_curves_{task}.png"
        if plot_val_curves(groups, task, out / name):
            parts += [f"![validation curves, {task}]({name})", ""]
    lengths, ext = extrapolation_table(groups)
    if ext:
        header = ["configuration", "scaling", "metric"] + [str(n) for n in lengths]
        lines = [[r["label"], "as trained" if r["scaling"] == "none" else r["scaling"], r["metric"]]
                 + ["n/a" if r["values"][n] is None else f"{r['values'][n]:.3f}" for n in lengths] for r in ext]
        contexts = sorted({run.get("context") for runs in groups.values() for run in runs
                           if run.extrapolation and isinstance(run.get("context"), int)})
        parts += ["## Length extrapolation", "",
                  "Mean over seeds of the evaluation loss (bits per byte for bytes) by evaluation length; RoPE models "
                  "also with position interpolation (pi) and NTK-aware scaling (ntk) at the matching factor.  n/a: "
                  "the scheme cannot go that far (a learned table).", "", markdown_table(header, lines), ""]
        if plot_extrapolation(ext, out / "extrapolation.png", contexts):
            parts += ["![length extrapolation](extrapolation.png)", ""]
    text = "\n".join(parts)
    (out / "report.md").write_text(text)
    if summary_rows:
        keys = list(dict.fromkeys(k for r in summary_rows for k in r))
        with open(out / "summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows({k: ("" if r.get(k) is None else r.get(k)) for k in keys} for r in summary_rows)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m linrope.report", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Summarise a sweep without wandb: reads <run>/csv/metrics.csv and <run>/.hydra/config.yaml\n"
                    "of every run under the folder(s); writes report.md (mean ± std over seeds per configuration),\n"
                    "summary.csv, val_curves.png and, when runs evaluated length extrapolation, extrapolation.png.",
        epilog="example:\n  python -m linrope.report logs/pe_compare/multiruns/2025-01-01_12-00-00")
    p.add_argument("sweeps", nargs="+", type=Path, help="sweep folder(s) (e.g. logs/<task_name>/multiruns/<time>)")
    p.add_argument("--out", type=Path, default=None, help="where to write (default: the first sweep folder)")
    args = p.parse_args(argv)
    for s in args.sweeps:
        if not s.is_dir():
            p.error(f"{s}: not a folder")
    out = args.out or args.sweeps[0]
    print(build_report(args.sweeps, out))
    print(f"\nwrote {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
