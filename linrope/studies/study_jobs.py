"""Which folder holds which job of a study (``linrope study``): a job is its whole composed configuration and the
code that trains it, never its folder's name (``linrope.base.naming.job_names`` names it after the override values
that differ between the jobs, so two different requests can name the same folder).

Before a job is counted as done or resumed, the configuration saved in its folder (``.hydra/config.yaml``) is
compared key by key with the one requested now, and the code the run recorded (linrope.run.provenance) with the
checkout's; only settings that cannot change a result are left out (``IGNORED``).  ``place`` finds a job's folder:
its own name or a ``<name>-run<k>`` an earlier ``--new-folder`` made, when configuration and code match; a folder
holding no run yet; else the job is refused with the keys that differ, unless ``new_folder``.  ``keep_finished``
counts a finished run of the same configuration but other code as done (an arm added to a finished study on newer
code); a stopped run of other code still differs.  A job whose folder is gone but whose run the study's compact
results hold (linrope.analysis.compact) is that run."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from linrope.analysis.compact import STUDY_RECORD as DONE
from linrope.analysis.runs import COMPACT, compact_index, metrics_files, read_metrics
from linrope.base.errors import first_names
from linrope.base.nested import differing, flatten
from linrope.data.tokenizer import file_digest
from linrope.run.provenance import code_text, git_state
from linrope.run.provenance import read as read_provenance
from linrope.run.resume_diff import HOUSEKEEPING

# settings that cannot change what a job computes: a run's housekeeping and its label (model.name: train.py writes the
# chosen pair's label into the saved config; a composed job has the preset's)
IGNORED = HOUSEKEEPING + ("model.name",)
SHOWN = 4  # differing keys named in a refusal; the rest are counted


def flat(cfg) -> Dict[str, Any]:
    """A composed configuration, flat, its interpolations kept as written (as Hydra saves ``.hydra/config.yaml``)."""
    return flatten(OmegaConf.to_container(cfg, resolve=False))


def record(folder: Path) -> Optional[Dict[str, Any]]:
    """The record the study's compact results (``<folder>/../runs.json``) hold of the job folder, None if none."""
    index = folder.parent / COMPACT
    try:
        stamp = index.stat().st_mtime_ns
    except OSError:
        return None
    return _records(str(index), stamp).get(folder.name)


@functools.lru_cache(maxsize=8)
def _records(index: str, _stamp: int) -> Dict[str, Dict[str, Any]]:
    return {r["run"]: r for r in compact_index(Path(index).parent)}


def logged(folder: Path) -> Dict[str, List[Tuple[int, float]]]:
    """metric -> [(step, value)] of every metrics.csv under a job's folder, in path order (a resumed run's history
    included: ``analysis.runs.metrics_rows``)."""
    series: Dict[str, List[Tuple[int, float]]] = {}
    for path in metrics_files(folder):
        for key, values in read_metrics(path).items():
            series.setdefault(key, []).extend(values)
    return series


def finished(folder: Path) -> bool:
    """The job of this folder has finished: its ``study_job.json``, or its compact record with one."""
    return (folder / DONE).is_file() or "study" in (record(folder) or {})


def saved(folder: Path) -> Optional[Dict[str, Any]]:
    """The flat configuration saved in a run folder (else in its compact record), None when there is none; an
    unreadable one is a configuration of its own (it never equals a requested one)."""
    path = folder / ".hydra" / "config.yaml"
    if not path.is_file():
        kept = record(folder)
        return flatten(kept.get("config", {})) if kept is not None else None
    return dict(_saved(str(path), path.stat().st_mtime_ns, path.stat().st_size))


@functools.lru_cache(maxsize=256)
def _saved(path: str, _stamp: int, _size: int) -> Dict[str, Any]:
    """The flat saved configuration of a file, read once while it is unchanged (a study checks its folders often)."""
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - YAML or encoding errors of a damaged file
        return {"(.hydra/config.yaml)": f"unreadable: {type(e).__name__}"}
    return flat(node) if OmegaConf.is_dict(node) else {"(.hydra/config.yaml)": "not a mapping"}


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """``key: old → new`` for every compared key whose value differs: first the keys both hold, then the keys
    only one holds (a component swapped for another brings its own options)."""
    shared_first = sorted(set(old) | set(new), key=lambda k: (k not in old or k not in new, k))
    return [f"{k}: {a} → {b}" for k, a, b in differing(old, new, IGNORED, keys=shared_first)]


def current_code() -> str:
    """The code this checkout would train with (``code <hash>``; the commit outside a git checkout)."""
    return code_text({"linrope": git_state()})


def holds_a_run(folder: Path) -> bool:
    """The folder holds something of a run: finished (``study_job.json``), checkpoints or logged metrics; or the
    study's compact results hold its run."""
    return (
        folder.is_dir()
        and (
            (folder / DONE).is_file()
            or any(folder.glob("checkpoints/*.ckpt"))
            or any(folder.glob("csv/metrics.csv"))
            or (folder / "metrics.csv").is_file()
        )
        or record(folder) is not None
    )


def mismatch(
    folder: Path, requested: Dict[str, Any], code: Optional[str], keep_finished: bool = False
) -> Optional[str]:
    """Why the run in ``folder`` is not the requested job (None when it is, or when the folder holds no run);
    ``keep_finished``: the code of a finished run is not compared."""
    if not holds_a_run(folder):
        return None
    old = saved(folder)
    if old is None:
        return "it holds a run without a saved configuration (.hydra/config.yaml) to compare"
    diff = differences(old, requested)
    parts = [first_names(diff, SHOWN, more=" and")] if diff else []
    on_disk = (folder / ".hydra" / "config.yaml").is_file()
    prov = read_provenance(folder) if on_disk else (record(folder) or {}).get("provenance")
    theirs = code_text(prov) if prov else None
    if theirs and code and theirs != code and not (keep_finished and finished(folder)):
        parts.append(f"trained on {theirs}, the checkout is {code}")
    changed = tokenizer_changed((prov or {}).get("data"), requested.get("data.tokenizer"))
    if changed:
        parts.append(changed)
    return "; ".join(parts) or None


def tokenizer_changed(data: Optional[Dict[str, Any]], spec: Any) -> Optional[str]:
    """Why the tokenizer file a job names (``data.tokenizer``, read from the driver's folder) is not the one its run
    recorded (issue 52: a tokenizer rewritten under the same path is another job), or None; only a file the run
    recorded by hash is compared."""
    saved = ((data or {}).get("tokenizer") or {}).get("sha256")
    path = Path(str(spec)).expanduser() if isinstance(spec, str) else None
    if not saved or path is None or not path.is_file():
        return None
    now = file_digest(path)[:16]
    return None if now == saved else f"tokenizer {spec} changed since the run (sha256 {saved} → {now})"


@dataclass
class Place:
    folder: Path
    conflict: Optional[str] = None  # what the job's own folder holds instead of it (then the job is refused)


def candidates(dir_: Path, name: str):
    """``<name>``, ``<name>-run2``, ``<name>-run3``, …"""
    for k in itertools.count(1):
        yield dir_ / (name if k == 1 else f"{name}-run{k}")


def place(
    dir_: Path,
    name: str,
    requested: Dict[str, Any],
    code: Optional[str],
    new_folder: bool,
    names: Sequence[str] = (),
    keep_finished: bool = False,
) -> Place:
    """The folder of one job (see the module docstring); ``names``: the study's other folder names, never taken."""
    first: Optional[Place] = None
    free: Optional[Path] = None
    for k, folder in enumerate(candidates(dir_, name), 1):
        if k > 1 and folder.name in names:
            continue
        if not holds_a_run(folder):
            if k == 1:
                return Place(folder)
            free = free or folder
            if not folder.exists():
                break
            continue
        why = mismatch(folder, requested, code, keep_finished)
        if why is None:
            return Place(folder)
        if k == 1:
            first = Place(folder, why)
    assert first is not None and free is not None
    return Place(free) if new_folder else first
