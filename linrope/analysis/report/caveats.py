"""What a reader of a sweep report must know beside its numbers (docs/methods.md, "A report says what its numbers
cannot"): failed runs (headline NaN, infinite or missing: named above the table, behind no value), configurations
still improving (validation still falling over the last ``WINDOW`` evaluations by more than the final values'
spread across seeds), parameter counts, and how far learned position parameters moved (linrope.training.movement)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Tuple

from linrope.analysis.cells import markdown_table
from linrope.analysis.runs import Run

WINDOW = 3  # "its last evaluations": the change from the third-last validation to the last


# ---- failed runs -------------------------------------------------------------------------------------------------
def failure(run: Run, metric: str, how: str) -> Optional[str]:
    """Why ``run`` has no usable ``metric`` ("NaN", "infinite", "missing"), or None when it has one."""
    v = run.value(metric, how)
    if v is None:
        return "missing"
    if math.isnan(v):
        return "NaN"
    return None if math.isfinite(v) else "infinite"


def failed_runs(groups: Dict[str, List[Run]], metric: str, how: str) -> Dict[str, List[Tuple[Run, str]]]:
    """label -> [(run, why)] for the runs of each configuration that have no usable ``metric``."""
    out: Dict[str, List[Tuple[Run, str]]] = {}
    for label, runs in groups.items():
        bad = [(r, why) for r in sorted(runs, key=lambda r: str(r.seed)) if (why := failure(r, metric, how))]
        if bad:
            out[label] = bad
    return out


def failed_note(failed: Dict[str, List[Tuple[Run, str]]], metric: str) -> List[str]:
    if not failed:
        return []
    n = sum(len(v) for v in failed.values())
    lines = [
        f"**{n} failed run{'s' if n != 1 else ''}** ({metric} NaN, infinite or missing: a diverged or "
        f"unfinished run). They are in no mean below; `n` counts only the runs behind each value, and "
        f"paired differences use only the seeds where both configurations have one:",
        "",
    ]
    lines += [
        f"- {label}: " + "; ".join(f"seed {r.seed} ({metric} {why}, `{r.path}`)" for r, why in bad)
        for label, bad in failed.items()
    ]
    return lines + [""]


# ---- still improving ---------------------------------------------------------------------------------------------
def improvement(runs: List[Run], metric: str, window: int = WINDOW) -> Optional[Dict[str, Any]]:
    """How much ``metric`` (lower is better) fell over each run's last ``window`` evaluations, averaged over
    the runs ("drop"), against the spread of the runs' final values (sample standard deviation across
    seeds; None for one run); ``improving`` when the drop exceeds the spread (or, with one run, 0).  None
    when no run has two evaluations."""
    drops, finals, steps = [], [], []
    for r in runs:
        points = [(s, v) for s, v in r.series.get(metric, []) if math.isfinite(v)]
        if len(points) < 2:
            continue
        first = points[-min(window, len(points))]
        drops.append(first[1] - points[-1][1])
        finals.append(points[-1][1])
        steps.append((first[0], points[-1][0]))
    if not drops:
        return None
    drop = statistics.fmean(drops)
    spread = statistics.stdev(finals) if len(finals) > 1 else None
    return {
        "drop": drop,
        "spread": spread,
        "n": len(drops),
        "improving": drop > (spread or 0.0),
        "from": min(s for s, _ in steps),
        "to": max(s for _, s in steps),
    }


def improving(groups: Dict[str, List[Run]], metric: str) -> Dict[str, Dict[str, Any]]:
    """label -> ``improvement`` of every configuration with at least two evaluations."""
    return {label: imp for label, runs in groups.items() if (imp := improvement(runs, metric)) is not None}


def improving_cell(imp: Optional[Dict[str, Any]], digits: int = 3) -> str:
    if imp is None:
        return "?"
    return f"{'yes' if imp['improving'] else 'no'} ({-imp['drop']:+.{digits}f})"


def improving_note(found: Dict[str, Dict[str, Any]], metric: str, digits: int = 3) -> List[str]:
    still = {label: imp for label, imp in found.items() if imp["improving"]}
    if not still:
        return []
    lines = [
        f"**Still improving at the end of training: {len(still)} of {len(found)} configurations.** Their "
        f"validation {metric} was still falling over the last {WINDOW} evaluations by more than its final "
        f"values spread across seeds, so a longer budget may change their numbers and their order:",
        "",
    ]
    for label, imp in still.items():
        spread = "one seed: no spread" if imp["spread"] is None else f"spread across seeds {imp['spread']:.{digits}f}"
        lines.append(
            f"- {label}: fell {imp['drop']:.{digits}f} from step {imp['from']} to {imp['to']} "
            f"(mean over {imp['n']} seed{'s' if imp['n'] != 1 else ''}; {spread})"
        )
    return lines + [""]


# ---- parameter counts --------------------------------------------------------------------------------------------
def params_cell(runs: List[Run]) -> str:
    """The configuration's parameter count ("428 544"); several counts joined by " / "; "?" when unknown."""
    counts = sorted({r.n_params for r in runs if r.n_params is not None})
    return " / ".join(f"{c:,}".replace(",", " ") for c in counts) if counts else "?"


# ---- how far learned position parameters moved -------------------------------------------------------------------
def movement_rows(groups: Dict[str, List[Run]]) -> List[Dict[str, Any]]:
    """One row per (configuration, position parameter), means over the seeds that recorded it."""
    rows = []
    for label, runs in groups.items():
        for name in dict.fromkeys(n for r in runs for n in r.position):
            recs = [r.position[name] for r in runs if name in r.position]
            rel = [
                x["change_norm"] / x["init_norm"]
                for x in recs
                if x.get("change_norm") is not None and x.get("init_norm")
            ]
            row = {"configuration": label, "parameter": name, "shape": recs[0].get("shape"), "n": len(recs)}
            for key in ("init_min", "init_max", "min", "max", "change_norm", "change_max"):
                vs = [x[key] for x in recs if x.get(key) is not None]
                row[key] = statistics.fmean(vs) if vs else None
            rows.append({**row, "relative_change": statistics.fmean(rel) if rel else None})
    return rows


def movement_section(task: str, groups: Dict[str, List[Run]]) -> List[str]:
    rows = movement_rows(groups)
    if not rows:
        return []

    def num(v):
        return "?" if v is None else f"{v:.3f}"

    def span(lo, hi):
        return "?" if lo is None or hi is None else f"[{lo:+.3f}, {hi:+.3f}] ({hi - lo:.3f})"

    header = ["configuration", "parameter", "shape", "n", "range at init (width)", "range at end (width)", "‖Δ‖"]
    header += ["‖Δ‖ / ‖init‖", "max \\|Δ\\|"]
    lines = [
        [
            r["configuration"],
            f"`{r['parameter']}`",
            "×".join(map(str, r["shape"] or [])),
            str(r["n"]),
            span(r["init_min"], r["init_max"]),
            span(r["min"], r["max"]),
            *(num(r[k]) for k in ("change_norm", "relative_change", "change_max")),
        ]
        for r in rows
    ]
    return [
        f"### Learned position parameters: how far they moved ({task})",
        "",
        "Per configuration with learned position parameters, each parameter's range at initialisation and "
        "at the end of training, the norm of its change ‖Δ‖ (Frobenius), that norm relative to the initial "
        "one, and the largest change of one entry; means over the seeds that recorded them (n). A scheme "
        "whose parameters barely moved had no budget to express itself.",
        "",
        markdown_table(header, lines),
        "",
    ]
