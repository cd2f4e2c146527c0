"""Layer 8, analysis: a sweep's results without wandb, ``python -m linrope report <sweep dir> [--out DIR]
[--pair A:B]`` (its command line: ``command``).

Groups per task the runs under the sweep folder(s) that differ only in their seed (linrope.analysis.runs) and writes
into the sweep folder (or ``--out``), never over a file it did not write (``files``): ``report.md`` (per task the
test score over seeds with its 95% t-interval, the paired differences of the study's pairs
(linrope.analysis.study_config) and of ``--pair``, the tables by evaluation length (``lengths``), the ``caveats``,
the runs' ``provenance``, a study's tuning table (linrope.analysis.tuning), a bytes report's Evidence section
(linrope.analysis.evidence)); ``summary.csv``, ``pairs.csv``, ``runs.csv``, ``val_curves.png`` and
``extrapolation.png`` (``_<task>`` appended when there are several tasks).  A study run in arms: linrope.analysis.arms."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from linrope.analysis import evidence, study_config, tuning
from linrope.analysis.cells import (
    band_note,
    cell_n,
    fmt_p,
    higher_is_better,
    markdown_table,
    pair_record,
    seeds_text,
    write_csv,
)
from linrope.analysis.report import caveats, provenance
from linrope.analysis.report import files as outputs
from linrope.analysis.report.claims import claim_results
from linrope.analysis.report.lengths import extrapolation_section
from linrope.analysis.runs import COMPACT, TUNING, Run, by_seed, compact_index, find_runs, group_runs
from linrope.analysis.stats import LEVEL, Paired, mean_ci
from linrope.base.errors import first_names
from linrope.base.naming import LANGUAGE_TASKS
from linrope.base.plots import Curve, Panel, by_last_value, config_style, distinct_styles, plot_curves

LEGACY = {"report.md": ("# Sweep report: ", "**Mixed provenance: ")}  # report.md's first line (report.files)


def columns_for(task: str):
    """(header, metric, how, digits) of a task's table; the first is the headline (test) metric.  Text: bits per
    byte first (they compare across tokenizers), then the loss per token (within one tokenizer)."""
    bpb, speed = ("test/bpb", "test/bpb", "last", 3), ("tokens/s", "train/tokens_per_sec", "mean", 0)
    if task == "bytes":
        return [bpb, ("best val/bpb (selection metric)", "val/bpb", "min", 3), speed]
    if task == "text":
        return [
            bpb,
            ("test/loss (per token)", "test/loss", "last", 3),
            ("best val/bpb (selection metric)", "val/bpb", "min", 3),
            speed,
        ]
    return [
        ("test/acc", "test/acc", "last", 3),
        ("test/loss", "test/loss", "last", 3),
        ("best val/loss (selection metric)", "val/loss", "min", 3),
        speed,
    ]


# ---- tables ----------------------------------------------------------------------------------------------------
def summarize(groups: Dict[str, List[Run]], task: str) -> List[Dict[str, Any]]:
    """Rows (best headline mean first): label, attention, position, n, seeds, and an Interval per column."""
    cols = columns_for(task)
    rows = []
    for label, runs in groups.items():
        row: Dict[str, Any] = {
            "label": label,
            "attention": runs[0].get("model.attention.kind", "?"),
            "position": runs[0].get("model.position.name", "?"),
            "params": caveats.params_cell(runs),
        }
        for header, metric, how, _ in cols:
            values = by_seed(runs, lambda r, metric=metric, how=how: r.value(metric, how))
            row[header] = mean_ci(list(values.values()), LEVEL)
            row.setdefault("seeds", sorted(map(str, values)))  # the seeds behind the headline value
        row["n"] = len(row["seeds"])
        rows.append(row)
    first, metric = cols[0][0], cols[0][1]
    sign = -1 if higher_is_better(metric) else 1
    rows.sort(key=lambda r: (r[first].mean is None, sign * (r[first].mean or 0.0), r["label"]))
    return rows


def verdict(a: str, b: str, metric: str, r: Paired, digits: int = 3) -> str:
    d = r.diff
    head = f"**{a} − {b}** ({metric}, {d.n} matching seed{'s' if d.n != 1 else ''})"
    if d.n < 2:
        return f"- {head}: {'no interval from fewer than 2 seeds' if d.n else 'no seed in common'}."
    numbers = f"{d.mean:+.{digits}f} [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}], p {fmt_p(r.p)}"
    if not d.excludes_zero():
        return f"- {head}: {numbers} — **not resolved**: the 95% interval includes 0."
    lower = d.mean < 0
    better = lower != higher_is_better(metric)
    return (
        f"- {head}: {numbers} — **resolved**: {a} is {'lower' if lower else 'higher'} "
        f"({'better' if better else 'worse'}) than {b}."
    )


# ---- plots -----------------------------------------------------------------------------------------------------
def plot_val_curves(groups: Dict[str, List[Run]], task: str, path: Path) -> Optional[Path]:
    has_acc = any("val/acc" in r.series for runs in groups.values() for r in runs)
    metric = "val/bpb" if task in LANGUAGE_TASKS else "val/acc" if has_acc else "val/loss"
    curves = []
    for label, runs in groups.items():
        points: Dict[float, List[float]] = {}
        for r in runs:
            for step, v in r.series.get(metric, []):
                points.setdefault(step, []).append(v)
        curves.append(Curve(label, points, config_style(runs[0].config)))
    curves = distinct_styles(by_last_value(curves, descending=higher_is_better(metric)))
    return plot_curves(
        [Panel("", curves)],
        path,
        xlabel="training step",
        ylabel=metric,
        title=f"{task}: validation {metric}, {len(groups)} configurations, {seeds_text(groups)}",
        note=band_note(groups),
    )


# ---- the report ------------------------------------------------------------------------------------------------
def task_section(
    task: str,
    groups: Dict[str, List[Run]],
    pairs,
    out: Path,
    suffix: str,
    summary: list,
    pair_rows: list,
    run_rows: list,
    references: Optional[evidence.References] = None,
) -> List[str]:
    cols = columns_for(task)
    rows = summarize(groups, task)
    groups = {r["label"]: groups[r["label"]] for r in rows}  # every table of the task in this order
    run_rows += [
        {"task": task, "configuration": label, "seed": run.seed, "run": str(run.path)}
        | {c[0]: run.value(c[1], c[2]) for c in cols}
        for label, runs in groups.items()
        for run in sorted(runs, key=lambda r: str(r.seed))
    ]
    failed = caveats.failed_runs(groups, cols[0][1], cols[0][2])
    val_metric = next(c[1] for c in cols if c[1].startswith("val/"))
    still = caveats.improving(groups, val_metric)
    header = ["configuration", "attention", "position", "n (seeds)", "parameters", f"still improving ({val_metric})"]
    header += [c[0] for c in cols]
    lines = [
        [
            r["label"],
            str(r["attention"]),
            str(r["position"]),
            f"{r['n']} ({','.join(r['seeds'])})",
            r["params"],
            caveats.improving_cell(still.get(r["label"])),
            *(cell_n(r[c[0]], r["n"], c[3]) for c in cols),
        ]
        for r in rows
    ]
    first = next(run for runs in groups.values() for run in runs)
    at_test = references.row(evidence.test_key(first)) if references else {}  # through the test's own windows
    for model, value in at_test.items():  # scored on the same test bytes (linrope.evaluation.references)
        lines.append(
            [f"*{model} (train split)*", "reference", "–", "–", "–", "–", f"{value:.3f}"] + ["–"] * (len(cols) - 1)
        )
    for r in rows:
        summary.append(
            {
                "task": task,
                "configuration": r["label"],
                "attention": r["attention"],
                "position": r["position"],
                "n": r["n"],
                "seeds": " ".join(r["seeds"]),
                "parameters": r["params"],
                "failed seeds": " ".join(str(run.seed) for run, _ in failed.get(r["label"], [])),
                "still improving": (still[r["label"]]["improving"] if r["label"] in still else None),
                **{f"{c[0]} {k}": getattr(r[c[0]], k) for c in cols for k in ("mean", "lo", "hi", "std")},
            }
        )
    parts = [
        f"## Task: {task}",
        "",
        *caveats.failed_note(failed, cols[0][1]),
        *caveats.improving_note(still, val_metric),
        markdown_table(header, lines),
        "",
    ]
    if references:
        parts += [
            "*reference*: byte models fitted on the train split and scored on the same test bytes through the same "
            "windows as the test (each byte sees only the bytes before it in its window); a configuration above the "
            "unigram has collapsed (the Evidence section counts its seeds).",
            "",
        ]
    factors = {r.get("data.test_factor") for runs in groups.values() for r in runs} - {None, 1}
    if factors:
        parts += [
            f"Test sequences are {' / '.join(map(str, sorted(factors)))} × the training context (data.test_factor).",
            "",
        ]
    metric = cols[0][1]  # a test metric: its last value (claims.value_of)
    claims = [study_config.Claim(f"{a} − {b}", metric, a, b) for a, b in pairs]
    results = [(c, r) for c, r in claim_results(groups, claims, documents=False).items() if r is not None]
    if results:
        parts += [
            f"### Paired differences, {task} ({metric}, A − B over matching seeds)",
            "",
            *[verdict(c.a, c.b, metric, r, cols[0][3]) for c, r in results],
            "",
        ]
        pair_rows += [pair_record(task, metric, c.a, c.b, r) for c, r in results]
    parts += caveats.movement_section(task, groups)
    if plot_val_curves(groups, task, out / f"val_curves{suffix}.png"):
        parts += [f"![validation curves, {task}](val_curves{suffix}.png)", ""]
    return parts + extrapolation_section(task, groups, pairs, out, suffix, pair_rows, references)


def selection_sentence(runs: Sequence[Run]) -> str:
    """What the headline is: the test score of the checkpoint chosen on validation, said only of runs that
    validated; a run that logged no validation value (too short for its interval) scored its last weights."""
    chosen = "The headline is the test score of the checkpoint chosen on validation; the best validation value is "
    chosen += "the selection metric, shown for reference only;"
    unvalidated = [r for r in runs if not any(k.startswith("val/") and v for k, v in r.series.items())]
    if not unvalidated:
        return chosen
    if len(unvalidated) == len(runs):
        return (
            "No run logged a validation value (each stopped before its first validation): the headline is the "
            "test score of each run's last weights, no checkpoint was chosen on validation;"
        )
    names = first_names([r.path.name for r in unvalidated], 3)
    return (
        f"{chosen} but {len(unvalidated)} of the {len(runs)} runs logged no validation value ({names}): their test "
        f"score is of their last weights;"
    )


def tuning_only(sweeps: Sequence[Path]) -> str:
    """What a study with no main run yet has done: its tuning runs (a report never reads them), or ''."""
    parts = sorted({p.parent.parent for s in sweeps for p in Path(s).rglob(f"{TUNING}/{COMPACT}")})
    counts = [(part, len(compact_index(part / TUNING))) for part in parts]
    if not any(n for _, n in counts):
        return ""
    done = ", ".join(f"{n} in {part / TUNING}" for part, n in counts)
    return (
        f"; only tuning runs have finished ({done}): the main runs start once the tuning stage has chosen, "
        "and `python -m linrope study <part> experiment=<name> --list` shows what is left"
    )


def build_report(
    sweeps: Sequence[Path],
    out: Path,
    pairs: Sequence[Tuple[str, str]] = (),
    allow_mixed: bool = False,
    study: Optional[study_config.Study] = None,
) -> str:
    """The report of the runs under ``sweeps``, written into ``out``: the pairs ``study`` declares (default: the
    study of the runs, ``study_config.for_runs``) where both ran, and ``pairs`` (``--pair``), which must."""
    skipped: List[Path] = []
    runs = [r for s in sweeps for r in find_runs(Path(s), skipped)]
    if not runs:
        others = (
            f" ({first_names([str(p) for p in skipped], 2)}: no provenance.json or .hydra/config.yaml of a "
            f"linrope run beside {'it' if len(skipped) == 1 else 'them'})"
            if skipped
            else ""
        )
        raise SystemExit(
            f"linrope report: no linrope runs (csv/metrics.csv) under {', '.join(map(str, sweeps))}{others}"
            + tuning_only(sweeps)
        )
    provenance.fill_in(runs, [*map(Path, sweeps), out])  # runs that predate their own provenance.json
    mixed = provenance.check(runs, allow_mixed)  # one line; refused unless --allow-mixed
    declared = (study or study_config.for_runs(runs)).compared
    tasks = group_runs(runs)
    suffixes = [f"_{task}" if len(tasks) > 1 else "" for task in tasks]
    written = ["report.md", "summary.csv", "runs.csv", "pairs.csv"]
    written += [f"{kind}{x}.png" for x in suffixes for kind in ("val_curves", "extrapolation")]
    evidence_groups = tasks.get("bytes") if "bytes" in tasks and evidence.has_documents(tasks["bytes"]) else None
    if evidence_groups:  # runs that kept their loss per document: the evidence section and its files
        written += [*evidence.FILES]
    labels = {label for groups in tasks.values() for label in groups}
    for a, b in pairs:
        if a not in labels or b not in labels:
            if (a, b) not in declared:
                missing = a if a not in labels else b
                raise SystemExit(
                    f"linrope report: --pair {a}:{b}: no configuration named {missing!r} "
                    f"(have: {', '.join(sorted(labels))})"
                )
    pairs = list(dict.fromkeys([*declared, *pairs]))
    outputs.claim(out, written, LEGACY)  # never over a file a report did not write: one line
    out.mkdir(parents=True, exist_ok=True)
    n_configs = sum(len(g) for g in tasks.values())
    parts = [mixed, ""] if mixed else []
    parts += [
        f"# Sweep report: {', '.join(str(s) for s in sweeps)}",
        "",
        f"{len(runs)} runs in {n_configs} configurations.  Each cell is the mean over the configuration's "
        f"seeds ± the half-width of the 95% t-interval (t_0.975,n-1 · s / √n; the mean alone for one "
        f"seed).  {selection_sentence(runs)} tokens/s is the mean "
        f"training throughput.  Paired differences take A − B seed by seed over the seeds both ran "
        f"(same data order and initialisation) and test them with a two-sided paired t-test.",
        "",
    ]
    parts += provenance.section(runs)
    for s in sweeps:  # a study's tuning stage (its tuning.json): the values chosen on validation, and how
        record = tuning.read(Path(s))
        parts += tuning.section(record) if record is not None else []
    summary: List[Dict[str, Any]] = []
    pair_rows: List[Dict[str, Any]] = []
    run_rows: List[Dict[str, Any]] = []
    referenced = evidence.references(evidence_groups, out) if evidence_groups else (None, "")  # the same bytes'
    refs = referenced[0]
    for task, groups in tasks.items():
        parts += task_section(
            task, groups, pairs, out, f"_{task}" if len(tasks) > 1 else "", summary, pair_rows, run_rows,
            refs if task == "bytes" else None,
        )  # fmt: skip
    if evidence_groups:
        study_now = study or study_config.for_runs(runs)
        comparisons = [(c.text, c.metric, c.a, c.b) for c in study_now.claims]
        comparisons += [("", "test/bpb", a, b) for a, b in pairs if (a, b) not in {(c[2], c[3]) for c in comparisons}]
        lines, records = evidence.section(evidence_groups, comparisons, out, referenced)
        parts += ["", *lines]
        if records:
            write_csv(records, out / "evidence.csv")
    text = "\n".join(parts)
    (out / "report.md").write_text(text)
    write_csv(summary, out / "summary.csv")
    write_csv(run_rows, out / "runs.csv")
    if pair_rows:
        write_csv(pair_rows, out / "pairs.csv")
    outputs.record(out, written)
    return text
