"""The length-extrapolation table on disk and on the console: its columns, ``extrapolation.csv`` /
``evaluate.csv`` written and read back, one console line per row.  No torch here: ``linrope.report``
reads these files without loading a model."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Dict, List

COLUMNS = [
    "length",
    "factor",
    "scaling",
    "loss",
    "bpb",
    "acc",
    "examples",
    "scored",
    "stride",
    "scored_hash",
    "seconds",
    "status",
]
HEADER = f"{'length':>7} {'factor':>7}  {'scaling':<7} {'loss':>7}  {'metric':<12} {'scored':>7} {'seconds':>8}  status"


def _fmt(v, digits=4):
    return "" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def format_row(row: Dict[str, Any]) -> str:
    """One line of the table that ``HEADER`` heads."""
    ok = row["status"] == "ok"
    metric = (f"bpb {_fmt(row['bpb'])}" if row.get("bpb") is not None else f"acc {_fmt(row['acc'])}") if ok else "n/a"
    loss = _fmt(row["loss"]) if ok else "n/a"
    return (
        f"{row['length']:>7} {row['factor']:>7g}  {row['scaling']:<7} {loss:>7}  {metric:<12} "
        f"{row['scored']:>7} {row['seconds']:>8.1f}  {row['status']}"
    )


def format_table(rows: List[Dict[str, Any]]) -> str:
    return "\n".join([HEADER, *map(format_row, rows)])


def write_csv(rows: List[Dict[str, Any]], path: Path) -> Path:
    """The rows as ``path``, written atomically (``linrope.base.atomic``): the table is rewritten after each row, and
    a process stopped at any moment leaves the rows done so far, whole."""
    from linrope.base.atomic import atomic_write_bytes

    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    atomic_write_bytes(f.getvalue().encode("utf-8"), path)
    return path


def read_csv(path: Path) -> List[Dict[str, Any]]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row: Dict[str, Any] = dict(r)
            for k in ("length", "examples", "scored", "stride"):
                row[k] = int(r[k]) if r.get(k) else (None if k == "stride" else 0)
            for k in ("factor", "loss", "bpb", "acc", "seconds"):
                row[k] = float(r[k]) if r.get(k) not in (None, "") else None
            rows.append(row)
    return rows
