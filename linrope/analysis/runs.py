"""The runs of a sweep folder, read back for ``linrope report``: each run's metrics (``<run>/csv/metrics.csv``), its
composed config (``.hydra/config.yaml``, flattened to dotted keys), its extrapolation table and its parameter record,
grouped per task into configurations that differ only in their seed; a run in compact form
(linrope.analysis.compact) is read into the same ``Run``.  A value that is NaN or infinite counts as no value.  A
study's tuning runs (``<study>/tuning/``) are never among its runs: read that folder itself to see them."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import yaml
from omegaconf import OmegaConf

from linrope.base.csv_files import read_rows
from linrope.base.nested import flatten
from linrope.evaluation.tables import DETAILS, KEY, read_csv, read_details, row_name
from linrope.run.provenance import read as read_provenance

# settings that do not tell configurations apart (the seed is what we average over)
IGNORED = tuple(
    "seed data.seed data.eval_seed paths. hydra. tags task_name logger. callbacks. ckpt_path extrapolation. "
    "trainer.enable_progress_bar trainer.default_root_dir train test data.num_workers".split()
)  # a key ending in "." ignores every key below it
COMPACT, CURVES, FORMAT = "runs.json", "curves.csv", "linrope.runs/1"  # compact results (linrope.analysis.compact)
TUNING = "tuning"  # a study's tuning runs (linrope.studies.study_tuning), never among its runs


def _tuning_run(path: Path, sweep: Path) -> bool:
    """``path`` lies in a study's tuning folder below ``sweep``."""
    return TUNING in path.relative_to(sweep).parts[:-1]


@dataclass
class Run:
    path: Path
    config: Dict[str, Any]  # flat: dotted key -> value
    series: Dict[str, List[Tuple[int, float]]]  # metric -> [(step, value)]
    extrapolation: List[Dict[str, Any]] = field(default_factory=list)
    n_params: Optional[int] = None
    position: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # parameters.json's "position"
    provenance: Optional[Dict[str, Any]] = None  # <run>/provenance.json (linrope.run.provenance), None if not recorded

    def get(self, key: str, default=None):
        return self.config.get(key, default)

    @property
    def task(self) -> str:
        return str(self.get("data.task", "bytes"))

    @property
    def seed(self):
        return self.get("seed")

    def value(self, metric: str, how: str) -> Optional[float]:
        """The run's ``metric`` reduced by ``how``: min, max, last or mean over the logged values (min, max and
        mean over the finite ones; ``last`` is the last value as logged, NaN if the run diverged)."""
        values = [v for _, v in self.series.get(metric, [])]
        if how != "last":
            values = [v for v in values if math.isfinite(v)]
        if not values:
            return None
        return {"min": min, "max": max, "last": lambda vs: vs[-1], "mean": statistics.fmean}[how](values)


def extrapolation_row(rows: Iterable[Dict[str, Any]], length: int, name: str = "none") -> Optional[Dict[str, Any]]:
    """The extrapolation row of ``length`` and ``name`` (linrope.evaluation.tables.row_name) that ran, or None."""
    return next((r for r in rows if r["length"] == length and row_name(r) == name and r["status"] == "ok"), None)


def metrics_rows(path: Path) -> Tuple[List[str], List[Dict[str, str]]]:
    """(columns, rows) of a CSVLogger's metrics.csv, as text, with the history of a resumed run in front: the rows
    of each ``metrics.before-resume-<k>.csv`` beside it (linrope.run.loggers keeps them) before the step the next
    file starts at (a resume logs again from its checkpoint; the test's rows do not say where: under ddp_spawn the test
    runs in a fresh process and logs at step 0).  A file that is no CSV text (binary, NUL bytes) is refused in one
    line (SystemExit) naming it."""
    earlier = sorted(path.parent.glob("metrics.before-resume-*.csv"), key=lambda p: _resume_index(p.stem))
    columns: List[str] = []
    rows: List[Dict[str, str]] = []
    for part in [*earlier, *([path] if path.is_file() or not earlier else [])]:  # a resume that logged nothing
        cols, more = _csv_rows(part)
        starts = [s for s in map(_step, (r for r in more if not _tested(r))) if s is not None]
        if starts:
            rows = [r for r in rows if (_step(r) is None or _step(r) < min(starts))]
        columns += [c for c in cols if c not in columns]
        rows += more
    return columns, rows


def _tested(row: Mapping[str, Optional[str]]) -> bool:
    """Whether the CSV row holds a test metric (a row the test logged)."""
    return any(k.startswith("test/") and v not in (None, "") for k, v in row.items())


def _resume_index(stem: str) -> int:
    tail = stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _step(row: Mapping[str, Optional[str]]) -> Optional[int]:
    try:
        return int(float(row.get("step") or ""))
    except (TypeError, ValueError):
        return None


def _csv_rows(path: Path) -> Tuple[List[str], List[Dict[str, str]]]:
    try:
        return read_rows(path)
    except (UnicodeDecodeError, csv.Error) as e:
        raise SystemExit(
            f"linrope: {path}: not a metrics CSV file ({type(e).__name__}: {str(e)[:80]}); "
            f"move it out of the runs' folder"
        ) from None


def series_of(rows: Iterable[Mapping[str, Optional[str]]]) -> Dict[str, List[Tuple[int, float]]]:
    """metric -> [(step, value)] of metrics.csv rows (an empty cell is no value)."""
    series: Dict[str, List[Tuple[int, float]]] = defaultdict(list)
    for row in rows:
        step = _step(row) or 0
        for k, v in row.items():
            if k in ("step", "epoch") or not isinstance(v, str) or v == "":
                continue
            try:
                series[k].append((step, float(v)))
            except ValueError:
                pass
    return dict(series)


def read_metrics(path: Path) -> Dict[str, List[Tuple[int, float]]]:
    """metric -> [(step, value)] of a CSVLogger's metrics.csv (``metrics_rows``)."""
    return series_of(metrics_rows(path)[1])


def is_linrope_run(run_dir: Path) -> bool:
    """The folder holds a linrope run: its ``provenance.json`` (linrope.run.provenance), or the config Hydra saved for
    it (``.hydra/config.yaml``, a mapping with a ``model``; runs that predate provenance.json)."""
    prov = read_provenance(run_dir)
    if prov is not None and isinstance(prov.get("linrope"), dict):
        return True
    path = run_dir / ".hydra" / "config.yaml"
    try:
        return path.is_file() and isinstance((yaml.safe_load(path.read_text()) or {}).get("model"), dict)
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError, OSError):
        return False


def metrics_files(folder: Path) -> List[Path]:
    """Every CSVLogger's metrics.csv under ``folder``, sorted, also where only its history is there (a resumed run
    that stopped before it logged again leaves ``metrics.before-resume-<k>.csv`` alone; ``metrics_rows`` reads it)."""
    kept = {p.parent / "metrics.csv" for p in folder.rglob("metrics.before-resume-*.csv")}
    return sorted({*folder.rglob("metrics.csv"), *kept})


def run_folders(sweep: Path, skipped: Optional[List[Path]] = None) -> List[Tuple[Path, Path]]:
    """(run folder, its metrics.csv) of every linrope run under ``sweep`` (one per ``metrics_files`` entry in a
    folder ``is_linrope_run`` recognises); the metrics.csv files of other folders are listed in ``skipped``."""
    found = []
    for metrics in metrics_files(sweep):
        if _tuning_run(metrics, sweep):
            continue
        run_dir = metrics.parent.parent if metrics.parent.name == "csv" else metrics.parent
        if is_linrope_run(run_dir):
            found.append((run_dir, metrics))
        elif skipped is not None:
            skipped.append(metrics)
    return found


def folder_record(run_dir: Path, metrics: Path) -> Dict[str, Any]:
    """What ``find_runs`` reads of a run folder but its curves, as plain JSON values (the saved config nested, its
    interpolations as written)."""
    config_path = run_dir / ".hydra" / "config.yaml"
    config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False) if config_path.exists() else {}
    extrap = run_dir / "extrapolation.csv"
    rows = read_csv(extrap) if extrap.exists() else []
    for which in DETAILS:  # each row's loss per document and per position (bytes), where the run wrote them
        path = run_dir / f"extrapolation_{which}.csv"
        if path.is_file():
            attach(rows, read_details(path), which)
    n_params, position = read_parameters(run_dir, metrics.parent)
    return {
        "metrics": metrics.relative_to(run_dir).as_posix(),
        "model_name": _logged_label(metrics.parent / "hparams.yaml").get("model.name"),
        "config": config,
        "parameters": {"n_params": n_params, "position": position},
        "provenance": read_provenance(run_dir),
        "extrapolation": rows,
    }


def row_key(r: Mapping[str, Any]) -> Tuple:
    """An extrapolation row's identity in its run: (length, protocol, scaling, window)."""
    return tuple(r.get(k) if k != "protocol" else (r.get(k) or "sliding") for k in KEY)


def attach(rows: List[Dict[str, Any]], details: Iterable[Mapping[str, Any]], which: str) -> None:
    """Put each detail line (linrope.evaluation.tables.write_details: per document or per position) on the row
    it belongs to, as that row's ``per_document`` / ``per_position`` list."""
    field_name, columns = DETAILS[which]
    by_key = {row_key(r): r for r in rows}
    for d in details:
        row = by_key.get(row_key(d))
        if row is not None:
            row.setdefault(field_name, []).append({c: d[c] for c in columns})


def run_from_record(run_dir: Path, record: Mapping[str, Any], series: Dict[str, List[Tuple[int, float]]]) -> Run:
    config = flatten(record.get("config", {}))
    if record.get("model_name") is not None:
        config["model.name"] = record["model_name"]
    parameters = record.get("parameters") or {}
    return Run(
        run_dir,
        config,
        series,
        list(record.get("extrapolation") or []),
        parameters.get("n_params"),
        dict(parameters.get("position") or {}),
        record.get("provenance"),
    )


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``; None when there is none, or it is not JSON, or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def compact_index(folder: Path) -> List[Dict[str, Any]]:
    """The run records of ``folder``'s compact results (``runs.json`` with ``format`` ``FORMAT``; [] when there
    are none); a record names its run folder relative to ``folder`` (``run``)."""
    data = read_json(folder / COMPACT) or {}
    if data.get("format") != FORMAT:
        return []
    return [r for r in data.get("runs") or [] if isinstance(r, dict) and isinstance(r.get("run"), str)]


def compact_records(folder: Path) -> List[Tuple[Dict[str, Any], List[Dict[str, str]]]]:
    """(record, its rows of ``curves.csv``) of every run of ``folder``'s compact results."""
    records = compact_index(folder)
    curves: Dict[str, List[Dict[str, str]]] = defaultdict(list)
    if records and (folder / CURVES).is_file():
        for row in _csv_rows(folder / CURVES)[1]:
            curves[row.pop("run", "")].append(row)
    for which in DETAILS:  # documents.csv, positions.csv: the rows' details, the run's name in front
        if records and (folder / f"{which}.csv").is_file():
            lines: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
            for d in read_details(folder / f"{which}.csv"):
                lines[d.pop("run", "")].append(d)
            for r in records:
                attach(r.get("extrapolation") or [], lines.get(r["run"], []), which)
    return [(r, curves.get(r["run"], [])) for r in records]


def find_runs(sweep: Path, skipped: Optional[List[Path]] = None) -> List[Run]:
    """The linrope runs under ``sweep``: every run folder (``run_folders``) and every run of a compact record
    (``runs.json``) whose folder is not there, in the order of their metrics.csv paths."""
    runs: Dict[Path, Run] = {}
    for run_dir, metrics in run_folders(sweep, skipped):
        runs[metrics] = run_from_record(run_dir, folder_record(run_dir, metrics), read_metrics(metrics))
    for compact in sorted(sweep.rglob(COMPACT)):
        if _tuning_run(compact, sweep):
            continue
        for record, rows in compact_records(compact.parent):
            run_dir = compact.parent / record["run"]
            runs.setdefault(
                run_dir / record.get("metrics", "csv/metrics.csv"), run_from_record(run_dir, record, series_of(rows))
            )
    return [runs[k] for k in sorted(runs)]


def read_parameters(run_dir: Path, log_dir: Path) -> Tuple[Optional[int], Dict[str, Dict[str, Any]]]:
    """(parameter count, position-parameter movement) of a run: from ``parameters.json`` when training wrote
    one, else the count from the loggers' ``hparams.yaml`` (read as text: nothing in it is constructed)."""
    record = run_dir / "parameters.json"
    if record.is_file():
        try:
            data = json.loads(record.read_text())
            return data.get("n_params"), dict(data.get("position") or {})
        except (ValueError, AttributeError):
            pass
    hparams = log_dir / "hparams.yaml"
    if hparams.is_file():
        found = re.search(r"^n_params: (\d+)\s*$", hparams.read_text(errors="replace"), re.M)
        if found:
            return int(found.group(1)), {}
    return None, {}


def _logged_label(path: Path) -> Dict[str, Any]:
    """``{"model.name": …}`` as train.py named the model (``linrope.training.builders.name_model``: the label of the
    pair when ``attention=…`` / ``position=…`` replaced the preset's) in the config it logged beside
    metrics.csv; Hydra's ``.hydra/config.yaml`` keeps the preset's name it composed."""
    if not path.is_file():
        return {}
    try:
        logged = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}  # not the file linrope's loggers write: the saved config names the model
    model = logged.get("model") if isinstance(logged, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return {"model.name": str(name)} if isinstance(name, (str, int, float)) and name != "" else {}


def _ignored(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in IGNORED)


def signature(run: Run) -> Tuple:
    """What tells the run's configuration apart: its settings but the seed's, and what a data=text run recorded it
    read (the tokenizer's and the corpus's hashes: the same ``data.tokenizer`` path rewritten is another
    configuration, never averaged with the first; issue 52)."""
    items = [(k, repr(v)) for k, v in run.config.items() if not _ignored(k)]
    data = (run.provenance or {}).get("data") or {}
    for key, value in (("data.tokenizer sha256", (data.get("tokenizer") or {}).get("sha256")),
                       ("data.corpus content", (data.get("corpus") or {}).get("content"))):  # fmt: skip
        if value:
            items.append((key, repr(value)))
    return tuple(sorted(items))


def base_label(run: Run) -> str:
    name = run.get("model.name")
    if name:
        return str(name)
    att, pos = run.get("model.attention.kind"), run.get("model.position.name")
    return f"{att}-{pos}" if att or pos else run.path.name


def group_runs(runs: List[Run]) -> Dict[str, Dict[str, List[Run]]]:
    """task -> label -> runs that differ only in their seed.  Labels are unique within a task: runs of
    one model that differ in other settings get those settings appended (``linear_rope placement=both``)."""
    groups: Dict[Tuple, List[Run]] = {}
    for r in runs:
        groups.setdefault((r.task, signature(r)), []).append(r)
    by_label: Dict[Tuple[str, str], List[Tuple]] = defaultdict(list)
    for key, rs in groups.items():
        by_label[(key[0], base_label(rs[0]))].append(key)
    named: Dict[str, Dict[str, List[Run]]] = defaultdict(dict)
    for (task, label), keys in by_label.items():
        if len(keys) == 1:
            named[task][_unique(named[task], label)] = groups[keys[0]]
            continue
        configs = [dict(k[1]) for k in keys]
        differ = [k for k in dict.fromkeys(k for c in configs for k in c) if len({c.get(k) for c in configs}) > 1]
        leaves = [k.split(".")[-1] for k in differ]
        short = [leaf if leaves.count(leaf) == 1 else k.removeprefix("model.") for k, leaf in zip(differ, leaves)]
        for key, c in zip(keys, configs):
            extra = " ".join(f"{s}={_plain(c.get(k))}" for k, s in zip(differ, short))
            named[task][_unique(named[task], f"{label} {extra}".strip())] = groups[key]
    return dict(named)


def _plain(v: Optional[str]) -> str:
    return "-" if v is None else v.strip("'\"")


def _unique(existing: Dict[str, Any], label: str) -> str:
    out, i = label, 2
    while out in existing:
        out, i = f"{label} ({i})", i + 1
    return out


def by_seed(runs: List[Run], value, finite: bool = True) -> Dict[Any, float]:
    """seed -> value(run) over the runs that have a finite one (``finite=False``: also those whose value is NaN or
    infinite, a diverged run, which then stays NaN or infinite); runs repeating a seed are averaged."""
    values: Dict[Any, List[float]] = defaultdict(list)
    for r in runs:
        v = value(r)
        if v is not None and (math.isfinite(v) or not finite):
            values[r.seed].append(v)
    return {s: statistics.fmean(vs) for s, vs in values.items()}
