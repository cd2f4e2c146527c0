"""The length-extrapolation table on disk and on the console: its columns, ``extrapolation.csv`` /
``evaluate.csv`` written and read back, one console line per row.  No torch here: ``linrope report``
reads these files without loading a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from linrope.base.csv_files import read_rows, write_rows

COLUMNS = (
    "length factor protocol scaling window loss bpb acc examples scored bytes documents stride scored_hash seconds "
    "status"
).split()
HEADER = (
    f"{'length':>7} {'factor':>7}  {'row':<18} {'loss':>7}  {'metric':<12} {'scored':>7} {'docs':>5} {'seconds':>8}"
    "  status"
)


def _fmt(v, digits=4):
    return "" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def _blank(v):
    return "" if v is None else v


def format_row(row: Dict[str, Any]) -> str:
    """One line of the table that ``HEADER`` heads."""
    ok = row["status"] == "ok"
    metric = (f"bpb {_fmt(row['bpb'])}" if row.get("bpb") is not None else f"acc {_fmt(row['acc'])}") if ok else "n/a"
    loss = _fmt(row["loss"]) if ok else "n/a"
    return (
        f"{row['length']:>7} {row['factor']:>7g}  {row_name(row):<18} {loss:>7}  {metric:<12} "
        f"{row['scored']:>7} {_blank(row.get('documents')):>5} {row['seconds']:>8.1f}  {row['status']}"
    )


def row_name(row: Dict[str, Any]) -> str:
    """A row's name besides its length: ``none`` for the model as trained under sliding windows (an older table's
    every plain row), else its protocol, RoPE scaling and attention window (``windows``, ``pi``, ``windows
    window128``) — the suffix of its metric in a study's results (``bpb@2048 windows``)."""
    protocol, scaling, window = row.get("protocol") or "sliding", row.get("scaling") or "none", row.get("window")
    named = [protocol if protocol != "sliding" else "", scaling if scaling != "none" else ""]
    named.append(f"window{window}" if window else "")
    return " ".join(p for p in named if p) or "none"


def format_table(rows: List[Dict[str, Any]]) -> str:
    return "\n".join([HEADER, *map(format_row, rows)])


def write_csv(rows: List[Dict[str, Any]], path: Path) -> Path:
    """The rows as ``path``, written atomically (``linrope.base.csv_files``)."""
    return write_rows(rows, COLUMNS, path)


def read_csv(path: Path) -> List[Dict[str, Any]]:
    rows = read_rows(path)[1]
    for r in rows:
        for k in ("length", "examples", "scored", "stride", "window", "documents", "bytes"):
            r[k] = int(r[k]) if r.get(k) else (0 if k in ("examples", "scored") else None)
        r["protocol"] = r.get("protocol") or "sliding"  # a table from before the protocols were named
        r.update({k: float(r[k]) if r.get(k) else None for k in ("factor", "loss", "bpb", "acc", "seconds")})
    return rows


DETAILS = {  # text rows also give the tokens behind each line's bytes (bytes rows: a token is a byte, left blank)
    "documents": ("per_document", ["document", "bytes", "nats", "tokens"]),
    "positions": ("per_position", ["start", "end", "bytes", "nats", "tokens"]),
}
KEY = ["length", "protocol", "scaling", "window"]


def write_details(rows: List[Dict[str, Any]], path: Path, which: str) -> Path:
    """Each row's loss per document (``which="documents"``) or per position bucket (``"positions"``), one line
    per (row, document or bucket), keyed by the row's length, protocol, scaling and window; atomically."""
    field, columns = DETAILS[which]
    lines = ({**{k: r.get(k) for k in KEY}, **d} for r in rows for d in r.get(field) or [])
    return write_rows(lines, KEY + columns, path)


def read_details(path: Path) -> List[Dict[str, Any]]:
    """The lines ``write_details`` wrote, with numbers as numbers."""
    lines = read_rows(path)[1]
    for d in lines:
        ints = [k for k in ("length", "bytes", "start", "end", "window", "tokens") if k in d]
        d.update({k: int(d[k]) if d[k] else None for k in ints})
        d["nats"] = float(d["nats"])
        d.setdefault("tokens", None)  # files written before text runs had the column: bytes rows, blank there
    return lines
