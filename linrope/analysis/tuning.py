"""A study's tuning record, ``<study>/tuning.json`` (written by linrope.studies.study_tuning; docs/methods.md,
"Tuning"), and its table in the report: the setting tuned, its metric and rule, per configuration the values tried
(each with its run's folder, score, ``best_step``, ``last_step`` and wall time), the value chosen and whether it is
interior (False: at an edge after the extensions allowed; None: unfinished), and an optional ``note``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from linrope.analysis.cells import markdown_table
from linrope.analysis.compact import dumps
from linrope.analysis.runs import read_json
from linrope.base.atomic import atomic_write_bytes

RECORD = "tuning.json"
FORMAT = "linrope.tuning/1"
ABOUT = (
    "The study's tuning stage (linrope study): per configuration the values of the key tried on validation "
    "(never test), each one's score and steps, the value chosen and whether it is interior."
)
INTERIOR, AT_EDGE, UNFINISHED = "interior", "at edge", "unfinished"


def where(entry: Dict[str, Any]) -> str:
    """``interior``, ``at edge`` or ``unfinished``: where the chosen value sits among the values tried."""
    return {True: INTERIOR, False: AT_EDGE}.get(entry.get("interior"), UNFINISHED)


def write(folder: Path, record: Dict[str, Any]) -> None:
    """``<folder>/tuning.json``, whole or not at all."""
    atomic_write_bytes(dumps({"format": FORMAT, "about": ABOUT, **record}).encode(), folder / RECORD)


def read(folder: Path) -> Optional[Dict[str, Any]]:
    """The tuning record of a study folder, None when it has none (or not one of this format)."""
    value = read_json(folder / RECORD)
    return value if value is not None and value.get("format") == FORMAT else None


def _num(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) else f"{v:g}"


def _score(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) or not math.isfinite(v) else f"{v:.4f}"


def section(record: Dict[str, Any], title: str = "Tuning (validation only)") -> List[str]:
    """report.md's lines for the record: the rule in one paragraph, then one row per configuration."""
    key, metric, rule = record.get("key", "?"), record.get("metric", "?"), record.get("protocol") or {}
    best = "lowest" if record.get("mode", "min") == "min" else "highest"
    steps = rule.get("max_steps")
    lines = [
        f"## {title}",
        "",
        f"`{key}` was chosen per configuration before the main runs: each configuration trained at every value "
        f"at seed {rule.get('seed', '?')} with the main runs' steps and schedule"
        + (f" ({steps} steps)" if steps is not None else " (its own steps)")
        + f", test and extrapolation off, and was scored by its {best} {metric} over the run; grid "
        f"{', '.join(_num(v) for v in rule.get('grid') or [])}; a best at an edge of the values tried added the "
        f"next value beyond it (× or ÷ {_num(rule.get('factor'))}), at most {rule.get('max_extensions', '?')} "
        f"times.  The main runs trained at the chosen value (**bold**).  *at edge*: the best stayed at an edge "
        f"after every extension allowed, so the range may not hold the optimum.",
        "",
    ]
    header = ["configuration", f"{key} tried", f"{best} {metric}", "chosen", "where", "last step logged", "wall (min)"]
    body = []
    for entry in record.get("configurations") or []:
        tried = entry.get("tried") or []
        chosen = entry.get("chosen")
        scores = [
            f"**{_score(t.get('score'))}**" if t.get("value") == chosen else _score(t.get("score")) for t in tried
        ]
        wall = sum(t.get("wall_s") or 0 for t in tried)
        ran = sorted({t.get("last_step") for t in tried if isinstance(t.get("last_step"), int)})
        body.append(
            [
                entry.get("configuration", "?"),
                ", ".join(_num(t.get("value")) for t in tried),
                ", ".join(scores),
                _num(chosen),
                where(entry),
                ", ".join(map(str, ran)) or "–",
                f"{wall / 60:.1f}",
            ]
        )
    lines.append(markdown_table(header, body))
    notes = [(e.get("configuration", "?"), e["note"]) for e in record.get("configurations") or [] if e.get("note")]
    if notes:  # a configuration whose choice went beyond the protocol says how, under the table
        lines += ["", *(f"- **{name}**: {note}" for name, note in notes)]
    return [*lines, ""]
