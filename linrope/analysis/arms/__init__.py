"""Layer 8, analysis: a study run in arms, tabled side by side: ``python -m linrope report <study folder>`` when
the study's config (linrope.analysis.study_config) declares ``arms`` and the folder holds them (``steps800/``).

For each arm it writes the ordinary report (linrope.analysis.report; not with ``--no-reports``), then one table,
``<folder>/<table.file>.md`` with its ``.csv`` and ``.png``, in the sections the config asks for: the positive
control, the metric per configuration and arm, every claim as a paired difference A − B at each arm corrected over
the table's family (linrope.analysis.report.claims; no verdict where the arm's control missed its bar or a seed is
above the unigram at the claim's row), a figure, every run's value, the metric by query order and each arm's tuning
table (linrope.analysis.tuning).  An arm's label is what its runs recorded, and the runs of every arm come from one
code."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from linrope.analysis import tuning
from linrope.analysis.arms.by_order import order_lines
from linrope.analysis.arms.figures import plot_by_arm, plot_claims
from linrope.analysis.cells import fmt, higher_is_better, markdown_table, pair_record, write_csv
from linrope.analysis.clusters import cluster_text, document_clusters, holm_floor_text
from linrope.analysis.evidence import above_unigram, has_documents, read_references
from linrope.analysis.multiplicity import ALPHA
from linrope.analysis.report import build_report, provenance
from linrope.analysis.report import files as outputs
from linrope.analysis.report.claims import Boot, claim_results, corrected, value_of
from linrope.analysis.report.files import TOOL
from linrope.analysis.runs import TUNING, Run, by_seed, find_runs, group_runs
from linrope.analysis.stats import LEVEL, mean_ci
from linrope.analysis.study_config import Claim, Study


def shown(folder: Path) -> str:
    """``folder`` as its command is typed: relative to the current folder when inside it."""
    try:
        return str(Path(folder).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(folder)


def number(arm: Path, study: Study) -> int:
    return int(arm.name[len(study.arms["folder"]) :])


def label(arm: Path, study: Study) -> str:
    return study.arms["label"].replace("{n}", str(number(arm, study)))


def arm_folders(folder: Path, study: Study) -> List[Path]:
    """The arms of a study, smallest first: its folders ``<arms.folder><N>`` (steps800, width64)."""
    if study.arms is None or not Path(folder).is_dir():
        return []
    prefix = re.escape(study.arms["folder"])
    found = [p for p in Path(folder).iterdir() if p.is_dir() and re.fullmatch(rf"{prefix}\d+", p.name)]
    return sorted(found, key=lambda p: number(p, study))


def check_arms(folders: Sequence[Path], study: Study) -> None:
    """An arm's label is what its runs recorded: every run of ``<folder><N>/`` has ``arms.key`` = N, else one line
    names the first run that does not."""
    key = study.arms["key"]
    for arm in folders:
        n = number(arm, study)
        wrong = [r for r in find_runs(arm) if r.get(key) != n]
        if wrong:
            more = f" and {len(wrong) - 1} more" if len(wrong) > 1 else ""
            raise SystemExit(
                f"{TOOL}: {arm.name}/{wrong[0].path.relative_to(arm)} ran with {key}="
                f"{wrong[0].get(key)}{more}, not {n} as its folder {arm.name}/ says: move it to the arm "
                f"it belongs to"
            )


def check_code(folders: Sequence[Path], study_dir: Path, allow_mixed: bool) -> Optional[str]:
    """The runs of every arm come from one code and torch version (linrope.analysis.report.provenance), whatever the
    flags: else one line, refused unless ``allow_mixed``; returns the line for the table's top, or None."""
    runs = []
    for arm in folders:
        found = find_runs(arm)
        provenance.fill_in(found, [arm, study_dir])  # runs that predate their own provenance.json
        runs += found
    line = provenance.mixed(runs)
    if line and not allow_mixed:
        raise SystemExit(
            f"{TOOL}: across {', '.join(a.name for a in folders)}, {line}: pass --allow-mixed to "
            f"table them together, or run the older arms again"
        )
    return f"**Mixed provenance: {line}.**" if line else None


# ---- the positive control (``control``: a configuration and its bar on the study's metric in every seed) ----
def _worst(study: Study, by_arm: Dict[Any, Dict[Any, float]]) -> Tuple[bool, float, Dict[Any, Tuple[float, bool]]]:
    """(an ``at_least`` bar, the bar, {arm that has run: (its worst seed, whether that seed misses the bar)}).  A seed
    that diverged (NaN or infinite: ``by_seed(..., finite=False)``) is the worst and misses."""
    low = "at_least" in study.control
    bar = study.control["at_least" if low else "at_most"]
    worst = {}
    for a, seeds in by_arm.items():
        diverged = [v for v in seeds.values() if not math.isfinite(v)]
        if seeds:
            worst[a] = diverged[0] if diverged else (min if low else max)(seeds.values())
    return low, bar, {a: (v, not math.isfinite(v) or (v < bar if low else v > bar)) for a, v in worst.items()}


def control_missed(study: Study, by_arm: Dict[Any, Dict[Any, float]]) -> List[Any]:
    """The arms where some seed of the control misses its bar."""
    return [a for a, (_, missed) in _worst(study, by_arm)[2].items() if missed]


def control_text(study: Study, by_arm: Dict[str, Dict[Any, float]]) -> str:
    """Whether the control met its bar in every seed, arm by arm."""
    low, bar, ran = _worst(study, by_arm)
    what, name = study.control.get("what", study.metric), study.control["configuration"]
    seed_word = "lowest" if low else "highest"
    missed = [
        f"{a} ({f'{seed_word} seed {v:.3f}' if math.isfinite(v) else f'a seed diverged: {v}'})"
        for a, (v, miss) in ran.items()
        if miss
    ]
    met = [f"{a} ({seed_word} seed {v:.3f})" for a, (v, miss) in ran.items() if not miss]
    missing = [a for a in by_arm if a not in ran]
    verb = ("reach", "reached") if low else ("stay at or below", "stayed at or below")
    parts = []
    if missed:
        parts.append(
            f"Positive control NOT met: {name} must {verb[0]} {bar} {what} in every seed; it does not at "
            f"{', '.join(missed)}."
        )
    if met:
        parts.append(f"Positive control: {name} {verb[1]} {bar} {what} in every seed at {', '.join(met)}.")
    if missing:
        parts.append(f"{name} has not run yet at {', '.join(missing)}.")
    return " ".join(parts)


# the kinds of "no verdict" a table explains below it (Corrected.why)
NO_VERDICT = {
    "control": "an arm whose positive control missed its bar, where the probe cannot tell",
    "collapsed": "a row where a seed of A or B scores above the unigram byte model (collapsed there: the difference "
    "would measure how badly two models fail)",
}


def sign(r) -> int:
    """+1 / -1 when resolved after Holm's correction, 0 when not (or missing)."""
    if r is None or r.diff.n < 2 or not r.resolved:
        return 0
    return 1 if r.diff.mean > 0 else -1


def outcome(results: Sequence[Any]) -> str:
    """What became of a claim across the arms, first to last (study_config.OUTCOMES)."""
    if any(r is None or r.diff.n < 2 for r in results):
        return "unpaired"
    if len(results) < 2:
        return "single"
    signs = [sign(r) for r in results]
    first, last = signs[0], signs[-1]
    if first and last:
        return "same" if all(s == first for s in signs) else "opposite"
    return "first_only" if first else "last_only" if last else "none"


def cell(r) -> str:
    """``**mean [lo, hi]** (n=3; Holm p 0.004; simultaneous [lo, hi])``: bold when Holm resolves it."""
    if r is None:
        return "–"
    d = r.diff
    if d.n < 2 or r.p_holm is None:
        return f"{d.mean:+.3f} (n={d.n})" if d.n else "–"
    star = "**" if r.resolved else ""
    s = r.simultaneous
    why = f"; no verdict: {r.withheld}" if r.withheld else ""
    return (
        f"{star}{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]{star} (n={d.n}; Holm p {r.adjusted.p_text(r.p_holm)}; "
        f"simultaneous [{s.lo:+.3f}, {s.hi:+.3f}]{why})"
    )


def value_cell(seeds: Dict[Any, float]) -> str:
    """mean ± the 95% t half-width over seeds, the lowest seed and n."""
    if not seeds:
        return "–"
    iv = mean_ci(list(seeds.values()), LEVEL)
    return f"{fmt(iv)} (min {min(seeds.values()):.3f}, n={iv.n})"


def verdict_legend(study: Study, names: Sequence[str]) -> str:
    v = study.verdict
    if v is None:
        return ""
    if len(names) < 2:
        return v["single"][1]
    legends = [
        f"{v[k][0]} ({v[k][1].replace('{first}', names[0]).replace('{last}', names[-1])})"
        for k in ("same", "opposite", "first_only", "last_only", "none", "unpaired")
    ]
    return f"'{v['column']}': {', '.join(legends)}."


def per_run_lines(study: Study, groups: Dict[str, Dict[str, List[Run]]], arms: Sequence[Path]) -> List[str]:
    """One row per configuration and seed: each claim metric at each arm (what every interval is made of)."""
    metrics = list(dict.fromkeys(c.metric for c in study.claims))
    configs = list(dict.fromkeys(x for c in study.claims for x in (c.a, c.b)))
    values = {
        (a.name, m, c): by_seed(groups[a.name].get(c, []), value_of(m), finite=False)
        for a in arms
        for m in metrics
        for c in configs
    }
    header = ["configuration", "seed", *(f"{m} at {number(a, study)}" for m in metrics for a in arms)]
    lines = []
    for c in configs:
        for seed in sorted({s for arm in arms for s in values[(arm.name, metrics[0], c)]}, key=str):
            got = [values[(a.name, m, c)].get(seed) for m in metrics for a in arms]
            lines.append(
                [c, str(seed), *("–" if v is None else f"{v:.4f}" if math.isfinite(v) else "diverged" for v in got)]
            )
    return [markdown_table(header, lines), ""]


def configuration_lines(
    study: Study,
    values: Dict[str, Dict[str, Dict[Any, float]]],
    arms: Sequence[Path],
    names: Sequence[str],
    rows: List[Dict[str, Any]],
) -> List[str]:
    """The study's metric per configuration (best first) and arm; each run's value joins ``rows``."""
    configs = list(dict.fromkeys(c for a in arms for c in values[a.name]))
    sign = -1 if higher_is_better(study.metric) else 1
    configs.sort(
        key=lambda c: min(sign * mean_ci(list(values[a.name][c].values())).mean for a in arms if values[a.name].get(c))
    )
    lines = [[c, *(value_cell(values[a.name].get(c, {})) for a in arms)] for c in configs]
    rows += [
        {"kind": "run", "configuration": c, "arm": a.name, "seed": seed, study.metric: v}
        for c in configs
        for a in arms
        for seed, v in sorted(values[a.name].get(c, {}).items(), key=lambda kv: str(kv[0]))
    ]
    return [markdown_table(["configuration", *names], lines), ""]


def claim_lines(
    study: Study,
    results: Dict[str, Dict[Claim, Any]],
    arms: Sequence[Path],
    names: Sequence[str],
    rows: List[Dict[str, Any]],
    clusters_text: str = "",
) -> List[str]:
    """Every claim at every arm, with its verdict when the study names them; each (claim, arm) joins ``rows``;
    ``clusters_text``: what the bootstrap drew (``cluster_text``), said below the table."""
    texts = any(c.text != f"{c.a} − {c.b}" for c in study.claims)
    metrics = len({c.metric for c in study.claims}) > 1 or texts
    v = study.verdict
    header = [*(["claim"] * texts), "A − B", *(["metric"] * metrics), *names, *([v["column"]] if v else [])]
    lines = []
    for c in study.claims:
        per = [results[a.name][c] for a in arms]
        said = v[outcome(per)][0] if v else None
        lines.append(
            [*([c.text] * texts), f"{c.a} − {c.b}", *([c.metric] * metrics), *map(cell, per), *([said] if v else [])]
        )
        rows += [
            {
                "kind": "claim",
                "claim": c.text,
                "arm": a.name,
                **({"verdict": said} if v else {}),
                **pair_record(study.arms["task"], c.metric, c.a, c.b, r.raw),
                "p holm": r.p_holm,
                "resolved after holm": r.adjusted.resolved,
                "no verdict": r.withheld or None,
                "simultaneous low": r.simultaneous.lo if r.simultaneous is not None else None,
                "simultaneous high": r.simultaneous.hi if r.simultaneous is not None else None,
                "family size": r.m,
                "interval": "bootstrap over seeds and document clusters" if isinstance(r.raw, Boot) else "t over seeds",
                "p floor": r.adjusted.p_floor,  # the smallest p printed as a number (bootstrap.p_floor)
                **({"clusters": r.raw.estimate.clusters} if isinstance(r.raw, Boot) else {}),  # blank: none known
            }
            for a, r in zip(arms, per)
            if r is not None
        ]
    intro = [study.table["claims_intro"], ""] if study.table.get("claims_intro") else []
    m = next((r.m for arm in results.values() for r in arm.values() if r is not None), 0)
    family = (
        "No comparison has its two configurations finished yet: nothing to correct, nothing resolved."
        if not m
        else f"Over the table's {m} comparisons with a test (every claim at every arm): **bold** where Holm's adjusted p "
        f"≤ {ALPHA:g} (the verdicts rest on it); *simultaneous*: all {m} intervals at level 1 − {ALPHA:g}/{m} "
        f"(Bonferroni) cover together with probability ≥ {1 - ALPHA:g}; the first interval is each one's own 95%."
    )
    whys = {r.why for arm in results.values() for r in arm.values() if r is not None and r.withheld}
    reasons = [text for why, text in NO_VERDICT.items() if why in whys]
    if reasons:
        family += (
            f" *No verdict*: {'; '.join(reasons)}; such comparisons keep their place in the family (dropping them "
            "cannot ease the others) but are never bold."
        )
    floors = {r.adjusted.p_floor for arm in results.values() for r in arm.values() if r and r.p_holm is not None}
    return [*intro, markdown_table(header, lines), "", family + holm_floor_text(floors) + clusters_text, ""]


def arms_table(folder: Path, study: Study, reports: bool = True, allow_mixed: bool = False, write: bool = True) -> str:
    """The study's table over its arms in ``folder`` (module docstring); ``write=False``: the text only."""
    arms = arm_folders(folder, study)
    if not arms:
        raise SystemExit(f"{TOOL}: no arm folders ({study.arms['folder']}<N>/) in {folder}, as {study.path} declares")
    found = {a.name: group_runs(find_runs(a)) for a in arms}
    # an arm whose tuning stage has run but none of its main runs yet: named, its tuning shown, not tabled
    tuning_only = [a for a in arms if not found[a.name] and tuning.read(a) is not None]
    arms = [a for a in arms if a not in tuning_only]
    found = {a.name: found[a.name] for a in arms}
    if not arms:
        raise SystemExit(
            f"{TOOL}: no main runs yet in any arm of {folder}: only the tuning stage of "
            f"{', '.join(a.name for a in tuning_only)} has run"
        )
    task, table = study.arms["task"], study.table
    other = sorted({t for g in found.values() for t in g} - {task})
    if not any(g.get(task) for g in found.values()) and other:
        raise SystemExit(
            f"{TOOL}: the runs under {folder} are {', '.join(other)} runs, not {task}: the study of "
            f"{study.path} tables {task} runs; choose another with --study"
        )
    check_arms(arms, study)
    mixed = check_code(arms, folder, allow_mixed)
    written = [f"{table['file']}.{ext}" for ext in ("md", "csv", "png")]
    if write:
        outputs.claim(folder, written, {written[0]: (f"# {table['title']}",)})
    if reports:
        for arm in arms:  # each arm's own report beside its runs, with the pairs of the study
            build_report([arm], arm, allow_mixed=allow_mixed, study=study)
    groups = {name: g.get(task, {}) for name, g in found.items()}
    names = [label(a, study) for a in arms]
    intro = (
        table.get("intro", "").replace("{arms}", ", ".join(names)).replace("{folders}", ", ".join(a.name for a in arms))
    )
    intro = intro.replace("{verdicts}", verdict_legend(study, names))
    rows: List[Dict[str, Any]] = []
    parts = [
        f"# {table['title']}",
        "",
        *([mixed, ""] if mixed else []),
        f"{intro.rstrip()}  Written by `python -m {TOOL} {shown(folder)}{' --allow-mixed' if mixed else ''}`.".lstrip(),
        "",
    ]
    if tuning_only:
        waiting = [
            f"{label(a, study)} (only its tuning stage has run: {len(find_runs(a / TUNING))} tuning runs, below)"
            for a in tuning_only
        ]
        parts += [f"Not in the tables yet: {'; '.join(waiting)}.", ""]
    value = value_of(study.metric) if study.metric else None
    values = {a.name: {c: by_seed(rs, value) for c, rs in groups[a.name].items()} for a in arms} if value else {}
    ctl = (study.control or {}).get("configuration")
    # the control's seeds, a diverged one kept: it misses the bar (the tables count it as failed)
    control = {a.name: by_seed(groups[a.name].get(ctl, []), value, finite=False) for a in arms} if value else {}
    if study.control:
        parts += [control_text(study, {n: control.get(a.name, {}) for n, a in zip(names, arms)}), ""]
    if table.get("configurations"):
        parts += configuration_lines(study, values, arms, names, rows)
    if table.get("by_order"):
        parts += order_lines(study, groups, arms, names, rows)
    grouping = {a.name: document_clusters(groups[a.name], a, False) for a in arms if has_documents(groups[a.name])}
    clusters_of = {name: g[0] for name, g in grouping.items()}
    results = {a.name: claim_results(groups[a.name], study.claims, LEVEL, clusters_of.get(a.name)) for a in arms}
    missed, withheld = [], {}  # the arms whose control missed its bar: the probe could not tell there (no verdict)
    if study.control:
        missed = control_missed(study, {a.name: control.get(a.name, {}) for a in arms})
        withheld = {(a, c): ("control", f"{ctl} (the control) missed its bar") for a in missed for c in study.claims}
    for arm in arms:  # a bpb claim at a row where a seed of A or B is above the unigram: no verdict (evidence.py)
        refs = read_references(arm)
        for c in [c for c in study.claims if "bpb" in c.metric]:
            if counts := above_unigram(groups[arm.name], refs, c.metric, (c.a, c.b)):
                withheld.setdefault((arm.name, c), ("collapsed", f"above the unigram at this row ({counts})"))
    if study.claims:
        results = corrected(results, study.claims, withheld)  # the figure fills what the table bolds
        parts += claim_lines(study, results, arms, names, rows, cluster_text(groups, grouping, arms))
        parts += provenance.mixed_pairs(groups, study.claims, [a.name for a in arms], names)
    png = folder / written[2]
    if table.get("figure", "claims") == "claims":  # what the figure below will draw (none: no link to it)
        drawn = any(r is not None for a in arms for r in results[a.name].values())
    else:
        drawn = any(seeds for a in arms for seeds in values.get(a.name, {}).values())
    if table.get("caption") and drawn:
        parts += [f"![{table['caption']}]({written[2]})", ""]
    if table.get("per_run") and study.claims:
        at = "/".join(sorted({c.metric.split("@")[0] for c in study.claims if "@" in c.metric}))
        at = f"{at}@<length>: the extrapolation table as trained, no scaling; " if at else ""
        parts += [
            "## Per-run values",
            "",
            f"What every interval above is made of: each run's value, by configuration "
            f"and seed ({at}–: the run has not finished; diverged: its value is not a finite number).",
            "",
            *per_run_lines(study, groups, arms),
        ]
    shown_arms = sorted([*arms, *tuning_only], key=lambda a: number(a, study))
    for arm, name in zip(shown_arms, [label(a, study) for a in shown_arms]):  # each arm's tuning (tuning.json)
        record = tuning.read(arm)
        parts += ["", *tuning.section(record, f"Tuning (validation only): {name}")] if record is not None else []
    text = "\n".join(parts)
    if not write:  # tests/analysis/test_results.py: recomputed from the committed runs, compared with the files
        return text
    (folder / written[0]).write_text(text)
    if table.get("figure", "claims") == "claims":
        plot_claims(study.claims, [results[a.name] for a in arms], names, png, table.get("figure_title", ""))
    else:
        numbers = [number(a, study) for a in arms]
        at = [n for n, a in zip(numbers, arms) if a.name in missed]
        plot_by_arm(numbers, groups, values, png, study, table.get("figure_title", ""), at)
    if rows:
        write_csv(rows, folder / written[1])
    outputs.record(folder, written)
    return text
