"""The cells of a report's tables: a mean ± half-width, a p-value, a paired difference, a markdown table, and the
record of a pair in pairs.csv (linrope.analysis.report and the tables beside it share them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from linrope.analysis.runs import Run
from linrope.analysis.stats import Interval, Paired, p_text
from linrope.base.csv_files import write_rows
from linrope.base.naming import higher_is_better  # noqa: F401 - the report's and the arms' tables read it here

# RoPE's scalings of the extrapolation table's rows, as the tables and the dashboard name them
SCALINGS = {"pi": "position interpolation", "ntk": "NTK-aware scaling", "yarn": "YaRN", "dynamic": "dynamic NTK"}


def fmt(iv: Interval, digits: int = 3) -> str:
    """mean ± half-width of the interval; the mean alone for one seed; – for none."""
    if iv.mean is None:
        return "–"
    if iv.lo is None:
        return f"{iv.mean:.{digits}f}"
    return f"{iv.mean:.{digits}f} ± {iv.half_width:.{digits}f}"


def cell_n(iv: Interval, n: int, digits: int = 3) -> str:
    """``fmt``, with the number of seeds behind the value when it is not the row's n (a run without it)."""
    return fmt(iv, digits) + (f" (n={iv.n})" if iv.mean is not None and iv.n != n else "")


def fmt_p(p: Optional[float]) -> str:
    """A paired t's p after "p " in a cell: "= 0.012", "< 0.001" (stats.p_text, its floor)."""
    text = p_text(p)
    return text if text[0] in "<–" else f"= {text}"


def markdown_table(header: List[str], lines: List[List[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def write_csv(rows: List[Dict[str, Any]], path: Path) -> None:
    """The rows as a CSV file, atomically, the columns in the order the rows first name them (None: an empty cell)."""
    write_rows(rows, list(dict.fromkeys(k for r in rows for k in r)), path)


def seeds_text(groups: Dict[str, List[Run]]) -> str:
    seeds = sorted({str(r.seed) for runs in groups.values() for r in runs}, key=lambda s: (len(s), s))
    return f"seed{'s' if len(seeds) != 1 else ''} {','.join(seeds)}"


def band_note(groups: Dict[str, List[Run]]) -> str:
    several = any(len({r.seed for r in runs}) > 1 for runs in groups.values())
    return "line: mean over seeds; band: lowest to highest seed" if several else ""


def cell(r: Paired) -> str:
    if r.diff.n < 2:
        return "–" if r.diff.mean is None else f"{r.diff.mean:+.3f} (n=1)"
    text = f"{r.diff.mean:+.3f} ± {r.diff.half_width:.3f}, p {fmt_p(r.p)}"
    return f"**{text}**" if r.diff.excludes_zero() else text


def pair_record(task: str, metric: str, a: str, b: str, r: Paired) -> Dict[str, Any]:
    return {
        "task": task,
        "metric": metric,
        "a": a,
        "b": b,
        "n": r.diff.n,
        "seeds": " ".join(map(str, r.seeds)),
        "mean difference": r.diff.mean,
        "ci low": r.diff.lo,
        "ci high": r.diff.hi,
        "t": r.t,
        "p": r.p,
        "resolved": r.diff.excludes_zero(),
    }
