"""CSV files: rows written whole or not at all (``linrope.base.atomic``: a table rewritten after each row leaves,
stopped at any moment, the rows done so far), and read back as text."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from linrope.base.atomic import atomic_write_bytes


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], line_end: str = "\r\n") -> str:
    """A header of ``columns``, then a line per row: its value of each column (missing or None: an empty cell),
    each line ended by ``line_end`` (csv's default, or ``"\\n"``)."""
    f = io.StringIO(newline="")
    w = csv.writer(f, lineterminator=line_end)
    w.writerow(columns)
    w.writerows([r.get(k) for k in columns] for r in rows)
    return f.getvalue()


def write_rows(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], path: Path, line_end: str = "\r\n") -> Path:
    """``csv_text`` of the rows as ``path``, atomically; returns ``path``."""
    atomic_write_bytes(csv_text(rows, columns, line_end).encode("utf-8"), path)
    return path


def read_rows(path: Path) -> Tuple[List[str], List[Dict[str, str]]]:
    """(the header, a {column: text} per line) of a CSV file; cells beyond the header are dropped."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [{k: v for k, v in row.items() if k is not None} for row in reader]
        return list(reader.fieldnames or []), rows
