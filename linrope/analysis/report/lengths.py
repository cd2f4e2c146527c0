"""A report's length-extrapolation tables and figure (linrope.analysis.report): per task and metric a table by
evaluation length (the rows as trained, RoPE's scalings, non-overlapping windows, the context-limited control and
the reference rows, where the runs and the report have them), the declared pairs at each length, and the figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from linrope.analysis.cells import SCALINGS, band_note, cell, fmt, markdown_table, pair_record, seeds_text
from linrope.analysis.evidence import References, row_key
from linrope.analysis.runs import Run, by_seed, extrapolation_row
from linrope.analysis.stats import LEVEL, mean_ci, paired
from linrope.base.plots import (
    SCALING_STYLES,
    Curve,
    Panel,
    by_last_value,
    config_style,
    distinct_styles,
    plot_curves,
    series_colour,
)
from linrope.evaluation.tables import row_name

# the extrapolation figure's panel of RoPE models with their scaling rows (their line styles: SCALING_STYLES)
SCALED_PANEL = "RoPE models: as trained (solid), pi (dashed), ntk (dotted), yarn (dash-dots), dynamic (sparse dots)"


def extrapolation_metrics(task: str) -> List[str]:
    """The extrapolation tables of a task: bits per byte for bytes; for text also the loss per token; else acc."""
    return {"bytes": ["bpb"], "text": ["bpb", "loss"]}.get(task, ["acc"])


def finite_seeds(values: Dict[Any, float]) -> Dict[Any, float]:
    """{seed: value} without the seeds that diverged (NaN or infinite)."""
    return {s: v for s, v in values.items() if math.isfinite(v)}


def finite(values: Dict[Any, float]) -> List[float]:
    return list(finite_seeds(values).values())


def extrapolation_rows(groups: Dict[str, List[Run]], task: str, metric: Optional[str] = None):
    """Lengths, the metric (default: the task's first, ``extrapolation_metrics``) and rows (label, scaling, name,
    {length: {seed: value}}): one row per configuration and row name (linrope.evaluation.tables.row_name: ``none``
    for the model as trained under sliding windows, a RoPE scaling, ``windows``, ``windows window128``)."""
    metric = metric or extrapolation_metrics(task)[0]
    lengths = sorted({r["length"] for runs in groups.values() for run in runs for r in run.extrapolation})
    rows = []
    for label, runs in groups.items():
        if not any(run.extrapolation for run in runs):
            continue
        named = dict.fromkeys((row_name(r), r["scaling"]) for run in runs for r in run.extrapolation)
        for name, scaling in named:
            values = {  # a seed that diverged at a length kept (NaN): the table counts it
                n: by_seed(
                    runs,
                    lambda one, n=n, name=name: (extrapolation_row(one.extrapolation, n, name) or {}).get(metric),
                    finite=False,
                )
                for n in lengths
            }
            rows.append({"label": label, "scaling": scaling, "name": name, "values": values})
    return lengths, metric, rows


def reference_at(refs: Optional[References], model: str, runs: List[Run], name: str, length: int) -> Optional[float]:
    """``model``'s bpb through the windows of the runs' row ``name`` at ``length`` (None: no such row)."""
    row = next((r for r in (extrapolation_row(run.extrapolation, length, name) for run in runs) if r), None)
    return refs.at(model, row_key(row)) if refs and row else None


def reference_rows(groups: Dict[str, List[Run]], rows: list, lengths: list, refs: Optional[References]) -> list:
    """(model, protocol row, {length: bpb}) per reference model and protocol row of the table (its rows as trained:
    sliding, windows, the control): the reference scored through that row's windows at each length."""
    out = []
    for name in dict.fromkeys(r["name"] for r in rows if r["scaling"] == "none"):
        runs = [run for r in rows if r["name"] == name for run in groups[r["label"]]]
        for model in refs.models if refs else []:
            values = {n: reference_at(refs, model, runs, name, n) for n in lengths}
            out.append((model, {"scaling": "none", "name": name}, values))
    return out


def row_text(row) -> str:
    """A row's cell in the table's second column: ``as trained`` (sliding windows), the RoPE scaling, and the
    protocol and window where not the default (``as trained, windows``; ``as trained, windows, last 128 keys``)."""
    scaling = row["scaling"]
    words = [w for w in row.get("name", scaling).split() if w not in ("none", scaling)]
    extra = [f"last {w[len('window') :]} keys" if w.startswith("window") and w != "windows" else w for w in words]
    return ", ".join(["as trained" if scaling == "none" else scaling, *extra])


def plot_extrapolation(
    groups: Dict[str, List[Run]], task: str, path: Path, references: Optional[References] = None
) -> Optional[Path]:
    """The metric against evaluation length, sliding windows as trained (and each RoPE scaling in a second panel);
    ``references``: each reference scored through the sliding rows' windows, a level across the panels where it is
    the same at every length (a line above the unigram's has collapsed), else a grey dashed line of its own."""
    lengths, metric, rows = extrapolation_rows(groups, task)
    if not rows:
        return None
    levels, ref_curves = {}, []
    for model, _, values in reference_rows(groups, [r for r in rows if r["name"] == "none"], lengths, references):
        found = {n: v for n, v in values.items() if v is not None}
        if len(set(found.values())) == 1:
            levels[f"{model} (train split, reference)"] = next(iter(found.values()))
        elif found:
            name, style = f"{model} (train split, reference, same windows)", {"color": "grey", "linestyle": "--"}
            ref_curves.append(Curve(name, {n: [v] for n, v in found.items()}, style))

    def points(row):
        return {n: f for n, by in row["values"].items() if (f := finite(by))}

    rows = [r for r in rows if r["name"] == r["scaling"]]  # sliding windows: the protocols' rows are in the table
    plain = [
        Curve(r["label"], points(r), config_style(groups[r["label"]][0].config)) for r in rows if r["scaling"] == "none"
    ]
    styled = distinct_styles(by_last_value(plain, descending=metric == "acc"))
    panels = [Panel("as trained", styled + ref_curves)]
    scaled_labels = list(dict.fromkeys(r["label"] for r in rows if r["scaling"] != "none"))
    if scaled_labels:
        scaled = [
            Curve(
                f"{r['label']} {'as trained' if r['scaling'] == 'none' else r['scaling']}",
                points(r),
                {
                    "color": series_colour(scaled_labels.index(r["label"])),
                    "linestyle": SCALING_STYLES.get(r["scaling"], "-."),
                },
            )
            for r in rows
            if r["label"] in scaled_labels
        ]
        panels.append(Panel(SCALED_PANEL, scaled))
    runs = [run for runs in groups.values() for run in runs if run.extrapolation]
    contexts = sorted({run.get("context") for run in runs if isinstance(run.get("context"), int)})
    ylabel = "bits per byte" if metric == "bpb" else "accuracy (scored positions)"
    return plot_curves(
        panels,
        path,
        xlabel="evaluation length (tokens)",
        ylabel=ylabel,
        log2_x=True,
        vlines=contexts,
        vline_label="training context",
        title=f"{task}: length extrapolation, {len(plain)} configurations, {seeds_text(groups)}",
        note=band_note(groups),
        hlines=levels if metric == "bpb" and levels else None,
    )


def scaling_caption(scalings) -> str:
    """The caption's clause naming the scaling rows the table has, e.g. "; RoPE models also with position
    interpolation (pi) and NTK-aware scaling (ntk) at the matching factor" (no such rows: "")."""
    order = ("pi", "ntk", "yarn", "dynamic", *sorted(scalings))
    named = list(
        dict.fromkeys(f"{SCALINGS[s]} ({s})" if s in SCALINGS else s for s in order if s in scalings and s != "none")
    )
    if not named:
        return ""
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return f"; RoPE models also with {listed} at the matching factor"


def extrapolation_section(task, groups, pairs, out: Path, suffix: str, pair_rows: list, references=None) -> List[str]:
    """``references``: the reference rows (linrope.analysis.evidence.references), rows of the bits-per-byte table,
    each scored through the windows of the model rows it stands beside."""
    parts: List[str] = []
    for k, metric in enumerate(extrapolation_metrics(task)):
        refs = references if metric == "bpb" else None
        parts += extrapolation_table(task, groups, pairs, pair_rows, metric, heading=k == 0, references=refs)
    name = f"extrapolation{suffix}.png"
    if parts and plot_extrapolation(groups, task, out / name, references):
        parts += [f"![length extrapolation, {task}]({name})", ""]
    return parts


METRIC_CAPTIONS = {"bpb": "Bits per byte", "loss": "Loss per token (nats)", "acc": "Accuracy"}


PROTOCOL_CAPTION = (
    "; *as trained*: sliding windows of the length (stride half of it: each scored byte sees at least half the "
    "length before it), *windows*: non-overlapping windows (a byte sees only its window's bytes before it), *last N keys*: "
    "the context-limited control (non-overlapping windows, attention to the last N keys only)"
)


def extrapolation_table(
    task, groups, pairs, pair_rows: list, metric: str, heading: bool = True, references=None
) -> List[str]:
    lengths, metric, rows = extrapolation_rows(groups, task, metric)
    if not rows:
        return []
    contexts = {run.get("context") for runs in groups.values() for run in runs if run.extrapolation}
    context = contexts.pop() if len(contexts) == 1 else None
    names = [f"{n} ({n / context:g}×)" if isinstance(context, int) else str(n) for n in lengths]
    header = ["configuration", "scaling"] + names

    def value(by_seed, bar):
        if not by_seed:
            return "n/a"
        kept, failed = finite(by_seed), f" of {len(by_seed)} seeds diverged"
        if not kept:
            return f"collapsed: {len(by_seed)}{failed}"
        iv = mean_ci(kept, LEVEL)
        if len(kept) < len(by_seed):  # the mean is over the others, and the row has collapsed there
            return f"{fmt(iv)} (collapsed: {len(by_seed) - len(kept)}{failed}, left out)"
        return fmt(iv) + (" (collapsed)" if bar is not None and not iv.mean <= bar else "")

    def bar(r, n):  # the unigram through this row's windows at this length
        return reference_at(references, "unigram", groups[r["label"]], r["name"], n)

    lines = [[r["label"], row_text(r)] + [value(r["values"][n], bar(r, n)) for n in lengths] for r in rows]
    protocols = any(r["name"] != r["scaling"] for r in rows)
    for model, row, values in reference_rows(groups, rows, lengths, references):  # through each row's windows
        lines.append(
            [f"*{model} (train split)*", f"reference, {row_text(row)}"]
            + ["–" if values[n] is None else f"{values[n]:.3f}" for n in lengths]
        )
    parts = [f"## Length extrapolation: {task}", ""] if heading else []
    parts += [
        f"{METRIC_CAPTIONS[metric]} at each evaluation length in tokens (× the "
        f"training context), mean ± 95% t-interval half-width over seeds"
        + scaling_caption({r["scaling"] for r in rows})
        + (PROTOCOL_CAPTION if protocols else "")
        + (
            "; *reference*: byte models fitted on the train split and scored on the same bytes through the same "
            "windows as that protocol's rows (a byte sees no more context than the models saw; a mean above the "
            "unigram of its row is marked *collapsed*)"
            if references
            else ""
        )
        + ".  n/a: the scheme cannot go that far"
        + (", or the control at the training context (where it is the windows row)." if protocols else "."),
        "",
        markdown_table(header, lines),
        "",
    ]
    plain = {r["label"]: r["values"] for r in rows if r["name"] == "none"}
    found = [
        (a, b, {n: paired(finite_seeds(plain[a][n]), finite_seeds(plain[b][n]), LEVEL) for n in lengths})
        for a, b in pairs
        if a in plain and b in plain
    ]
    if found:
        cells = [[f"{a} − {b}"] + [cell(res[n]) for n in lengths] for a, b, res in found]
        parts += ["Paired differences A − B as trained (mean ± half-width, p; bold: the interval excludes 0):", ""]
        parts += [markdown_table(["pair"] + names, cells), ""]
        pair_rows += [pair_record(task, f"{metric}@{n}", a, b, res[n]) for a, b, res in found for n in lengths]
    return parts
