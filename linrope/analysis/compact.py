"""A study's results in compact form, in place of a folder per run (``python -m linrope study <part> --compact``;
docs/methods.md, "Studies that outlive a session"): ``runs.json`` (per run its folder's name, its study record
``study_job.json`` and ``folder_record``), ``curves.csv`` (every row of every run's ``metrics.csv``), ``results.csv``
(a row per run for a reader) and, for bytes runs with details, ``documents.csv`` and ``positions.csv``, the run's
name in front.  ``linrope.analysis.runs.find_runs`` reads them into the same runs as the folders (a folder still
there wins); the raw logs are not kept: nothing is computed from them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

from linrope.analysis import runs
from linrope.analysis.runs import COMPACT, CURVES, FORMAT, flatten, read_json
from linrope.base.atomic import atomic_write_bytes
from linrope.base.csv_files import csv_text, write_rows
from linrope.evaluation.tables import DETAILS, KEY, row_name

STUDY_RECORD = "study_job.json"  # what linrope study writes into a job's folder when the job has finished
RESULTS = "results.csv"
FILES = (COMPACT, CURVES, RESULTS, "documents.csv", "positions.csv")  # the last two: bytes runs with details
ABOUT = (
    "The runs of this folder (linrope.analysis.compact): each run's study record, saved config, parameters, "
    "provenance and extrapolation rows; curves.csv holds every logged value, results.csv one row per run."
)
Entry = Tuple[Dict[str, Any], List[str], List[Dict[str, str]]]  # record, its curves' columns, its curves' rows


def gather(folder: Path, finished_only: bool = False) -> Dict[str, Entry]:
    """run name (its folder relative to ``folder``) -> entry: every run folder under ``folder`` (only those with
    a study record when ``finished_only``), then every run of the compact files already there whose folder is gone."""
    found: Dict[str, Entry] = {}
    for run_dir, metrics in runs.run_folders(folder):
        study = read_json(run_dir / STUDY_RECORD)
        if finished_only and study is None:
            continue
        name = run_dir.relative_to(folder).as_posix()
        columns, rows = runs.metrics_rows(metrics)
        found[name] = (
            {"run": name, **({"study": study} if study is not None else {}), **runs.folder_record(run_dir, metrics)},
            columns,
            rows,
        )
    for record, rows in runs.compact_records(folder):
        found.setdefault(record["run"], (record, list(dict.fromkeys(k for r in rows for k in r)), rows))
    return dict(sorted(found.items(), key=lambda kv: (folder / kv[0] / kv[1][0]["metrics"]).parts))


def write(folder: Path, finished_only: bool = False) -> int:
    """Write ``runs.json``, ``curves.csv`` and ``results.csv`` of ``folder`` (each whole or not at all); returns
    the number of runs (0: nothing written)."""
    entries = gather(folder, finished_only)
    if not entries:
        return 0
    records = [record for record, _, _ in entries.values()]
    details = {which: [] for which in DETAILS}  # each row's per-document and per-position loss: CSV, not JSON
    kept = []
    for record in records:
        rows = []
        for r in record.get("extrapolation") or []:
            for which, (field_name, _) in DETAILS.items():
                details[which] += [
                    {"run": record["run"], **{k: r.get(k) for k in KEY}, **d} for d in r.get(field_name) or []
                ]
            rows.append({k: v for k, v in r.items() if k not in ("per_document", "per_position")})
        kept.append({**record, "extrapolation": rows} if "extrapolation" in record else record)
    atomic_write_bytes(dumps({"format": FORMAT, "about": ABOUT, "runs": kept}).encode(), folder / COMPACT)
    for which, lines in details.items():
        if lines:
            write_rows(lines, ["run", *KEY, *DETAILS[which][1]], folder / f"{which}.csv", "\n")
    columns = ["run", *dict.fromkeys(c for _, cols, _ in entries.values() for c in cols if c != "run")]
    curves = [{"run": name, **row} for name, (_, _, rows) in entries.items() for row in rows]
    write_rows(curves, columns, folder / CURVES, "\n")
    atomic_write_bytes(results_csv([(record, rows) for record, _, rows in entries.values()]).encode(), folder / RESULTS)
    return len(entries)


def results_csv(runs: List[Tuple[Mapping[str, Any], List[Dict[str, str]]]]) -> str:
    """``results.csv`` of (record, curve rows) pairs: a ``results_row`` each, the columns in its three parts."""
    table = [results_row(record, rows) for record, rows in runs]
    columns = [k for part in range(3) for k in dict.fromkeys(k for r in table for k in r[part])]
    return csv_text([{**who, **values, **where} for who, values, where in table], columns, "\n")


def dumps(value: Any) -> str:
    """JSON, one key a line, a list of plain values on one line (``"factors": [1, 2, 4]``)."""
    text = json.dumps(value, indent=1)
    short = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    return (short if json.loads(short) == value else text) + "\n"


def results_row(record: Mapping[str, Any], rows: List[Dict[str, str]]) -> Tuple[Dict[str, Any], ...]:
    """The reader's row of one run, in three parts: who it is; every metric's last logged value and the
    extrapolation table's values at each length (``bpb@256``; ``bpb@256 pi`` under a scaling); where and how it ran."""
    config = flatten(record.get("config", {}))
    study = record.get("study") or {}
    prov = record.get("provenance") or {}
    code, versions, machine = prov.get("linrope") or {}, prov.get("versions") or {}, prov.get("machine") or {}
    who = {
        "run": record["run"],
        "model": record.get("model_name") or config.get("model.name"),
        "task": config.get("data.task", "bytes"),
        "seed": config.get("seed"),
        "job": " ".join(study.get("job") or prov.get("overrides") or []),
        "steps": config.get("trainer.max_steps"),
        "n_params": (record.get("parameters") or {}).get("n_params"),
    }
    last: Dict[str, str] = {}
    for r in rows:
        last.update({k: v for k, v in r.items() if k not in ("step", "epoch") and v not in ("", None)})
    values: Dict[str, Any] = dict(sorted(last.items(), key=lambda kv: (_rank(kv[0]), kv[0])))
    for r in sorted(record.get("extrapolation") or [], key=lambda r: row_name(r) != "none"):
        if r.get("status") == "ok":
            where = f"@{r['length']}" + ("" if row_name(r) == "none" else f" {row_name(r)}")
            values.update({f"{m}{where}": r[m] for m in ("bpb", "acc") if r.get(m) is not None})
    ran = {k: code.get(k) for k in ("commit", "dirty", "code")}
    ran.update({k: versions.get(k) for k in ("python", "torch", "lightning", "fla")})
    ran.update(
        machine=machine.get("gpu") or machine.get("cpu"),
        threads=study.get("threads", machine.get("threads")),
        precision=prov.get("precision"),
        started=prov.get("started"),
        finished=study.get("finished"),
        wall_s=study.get("wall_s"),
    )
    return who, values, ran


def _rank(metric: str) -> int:
    return next(i for i, p in enumerate(("test/", "val/", "train/", "")) if metric.startswith(p))
