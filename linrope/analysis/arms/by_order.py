"""A metric by the order of its item within each example, per configuration and arm (``table.by_order`` of a study
in arms, linrope.analysis.arms): ``test/acc_q`` tables ``test/acc_q1``, ``test/acc_q2``, … beside the study's
metric, averaged over the seeds that did not fail on it (linrope.analysis.seed_outcomes; failed ones counted)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from linrope.analysis.cells import markdown_table
from linrope.analysis.runs import Run
from linrope.analysis.seed_outcomes import SeedOutcome, seed_outcomes
from linrope.analysis.study_config import Study


def orders(runs: Sequence[Run], prefix: str) -> List[int]:
    """The orders k of ``<prefix><k>`` any of ``runs`` logged, ascending."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)")
    return sorted({int(m.group(1)) for r in runs for key in r.series for m in [pattern.fullmatch(key)] if m})


def bar(study: Study, configuration: str) -> Optional[float]:
    """Below it a seed of ``configuration`` fails: the control's bar for the control, else ``collapse_below``."""
    ctl = study.control
    if ctl and ctl["configuration"] == configuration and "at_least" in ctl:
        return float(ctl["at_least"])
    below = study.table.get("collapse_below")
    return None if below is None else float(below)


def outcome(study: Study, configuration: str, runs: Sequence[Run]) -> SeedOutcome:
    """The seeds of ``configuration`` on the study's metric (its last logged value; None: the run has none)."""
    values: Dict[Any, Optional[float]] = {r.seed: r.value(study.metric, "last") for r in runs}
    is_control = bool(study.control) and study.control["configuration"] == configuration
    return seed_outcomes(
        values, worse_below=bar(study, configuration), fails="fall short" if is_control else "collapse"
    )


def order_lines(
    study: Study,
    groups: Dict[str, Dict[str, List[Run]]],
    arms: Sequence[Path],
    names: Sequence[str],
    rows: List[Dict[str, Any]],
) -> List[str]:
    """One table per arm: each configuration's seeds (failed ones counted), its metric, and the mean of each order
    over the seeds that did not fail; each run's order values join ``rows``."""
    prefix = study.table["by_order"]
    below = study.table.get("collapse_below")
    rule = f"a seed of another configuration below {below} has collapsed; " if below is not None else ""
    control = f"a seed of {study.control['configuration']} below its bar fails; " if study.control else ""
    lines = [
        f"## {study.metric} by query order",
        "",
        f"`{prefix}<k>`: the metric at each example's k-th query (in order of appearance), the mean over the seeds "
        f"that did not fail ({control}{rule}failed seeds are counted, never averaged).  A model that answers the "
        "last query well and the first ones near chance has learned an elimination shortcut, not the lookup.",
        "",
    ]
    for arm, name in zip(arms, names):
        found = groups[arm.name]
        ks = orders([r for runs in found.values() for r in runs], prefix)
        table = []
        for configuration, runs in sorted(found.items()):
            out = outcome(study, configuration, runs)
            kept = [r for r in runs if r.seed in out.kept]
            cells = []
            for k in ks:
                values = [v for r in kept for v in [r.value(f"{prefix}{k}", "last")] if v is not None]
                cells.append(f"{statistics.fmean(values):.3f}" if values else "–")
                rows += [
                    {
                        "kind": "order",
                        "configuration": configuration,
                        "arm": arm.name,
                        "seed": r.seed,
                        "order": k,
                        f"{prefix}<k>": v,
                    }
                    for r in runs
                    for v in [r.value(f"{prefix}{k}", "last")]
                    if v is not None
                ]
            failed = f"{out.k} of {out.n}" + (
                f" ({', '.join(f'seed {s}: {why}' for s, why in out.failed.items())})" if out.failed else ""
            )
            table.append([configuration, failed, out.text(), *cells])
        header = ["configuration", "failed seeds", study.metric, *(f"q{k}" for k in ks)]
        lines += [f"### {name}", "", markdown_table(header, table), ""]
    return lines
