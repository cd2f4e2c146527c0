"""What runs, their folders and their metrics are called: a run's wandb group, a command's name, a job's folder,
which way a metric is better (``higher_is_better``).  Light on
purpose (no Lightning, no wandb): train.py and ``python -m linrope dashboard`` use it.  What a model is called
(``model.name``, the run name, the tags) is ``linrope.models.spec.ModelConfig``'s."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# the language tasks: scored in bits per byte (val/bpb, test/bpb, the extrapolation table's bpb@N); the synthetic
# tasks (mqar, offset_copy, listops) in accuracy and loss
LANGUAGE_TASKS = ("bytes", "text")


def higher_is_better(metric: str) -> bool:
    """Whether more of ``metric`` is better: accuracies (``val/acc``, ``test/acc``); losses and bits per byte not."""
    return metric.endswith("acc")


def wandb_group(task_name: str, sweep_dir: Optional[str] = None) -> str:
    """``<task_name>-<sweep folder name>`` for a job of a sweep (one group per sweep: the folder is named by its
    start time, ``logs/<task_name>/multiruns/<time>``), ``task_name`` for a single run.  A sweep folder already
    named after the task (``hydra.sweep.dir=results/pe_compare``) is not named twice."""
    if not sweep_dir:
        return str(task_name)
    folder = Path(str(sweep_dir)).name
    return folder if str(task_name) in folder else f"{task_name}-{folder}"


def program(module_command: str) -> str:
    """The name a command's usage line gives: ``linrope-report`` when started as that console script,
    else ``module_command`` (``python -m linrope report``)."""
    import sys

    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("linrope-") else module_command


# ---- job folders: a study's and a sweep's ---------------------------------------------------------------------
NAME_MAX = 96  # characters of a job folder's name (file systems allow 255 bytes); a longer one is cut, ends in a hash
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
BARE = ("model", "data", "experiment")  # keys whose value alone names a job (``linear_rope``, not ``modellinear_rope``)


def _pairs(job: Sequence[str]) -> Dict[str, str]:
    """key -> value of a job's overrides (``~key``: an empty value)."""
    return dict(o.partition("=")[::2] for o in job)


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def safe_name(text: str) -> str:
    """``text`` as one folder name: characters other than letters, digits and ``_.+-`` become ``_`` (a ``/`` of a
    path never nests a folder), a leading ``.`` too (never ``.``, ``..`` or a hidden folder); empty: ``job``."""
    name = _UNSAFE.sub("_", text)
    return ("_" + name[1:] if name.startswith(".") else name) or "job"


def job_part(key: str, value: str) -> str:
    """What one differing override adds to a job's name: ``model=linear_rope`` gives ``linear_rope``,
    ``seed=1`` gives ``seed1``, ``optim.lr=3e-4`` gives ``lr3e-4`` (the key's last part)."""
    return value if key in BARE else f"{key.split('.')[-1]}{value}"


def job_names(jobs: Sequence[Sequence[str]]) -> List[str]:
    """One folder name per job (a study's jobs, ``linrope.studies.study_jobs``; a sweep's, ``linrope.run.sweep_folders``),
    made of the override values that differ between the jobs, in the order their keys first appear, joined by ``-``
    (``job_part``: ``linear_rope-seed1``; ``job`` when nothing differs), made safe (``safe_name``).  Two jobs never
    share a name: a name longer than ``NAME_MAX`` is cut and ends in ``-<hash>`` of the overrides it stands for, as
    do names that became equal when made safe (``data.path=/a/b`` and ``data.path=/a_b``); jobs asked twice
    (``seed=1,1``) end in ``-1``, ``-2``."""
    splits = [_pairs(job) for job in jobs]
    keys = [k for k in dict.fromkeys(k for s in splits for k in s) if len({s.get(k) for s in splits}) > 1]
    texts = ["-".join(job_part(k, s.get(k, "none")) for k in keys) for s in splits]
    names = [safe_name(t) for t in texts]
    full = ["\n".join(f"{k}={s.get(k)}" for k in keys) for s in splits]  # what a hash stands for: the exact values
    texts_of: Dict[str, set] = {}
    for name, text in zip(names, full):
        texts_of.setdefault(name, set()).add(text)
    for i, name in enumerate(names):
        if len(texts_of[name]) > 1 or len(name) > NAME_MAX:
            names[i] = f"{name[: NAME_MAX - 9]}-{_digest(full[i])}"
    twice = Counter(names)
    count: Counter = Counter()
    for i, name in enumerate(names):
        if twice[name] > 1:
            count[name] += 1
            names[i] = f"{name}-{count[name]}"
    if len(set(names)) < len(names):  # a name ending in -1 that a job had of its own: the job's number first
        names = [f"{i}-{name}" for i, name in enumerate(names)]
    return names
