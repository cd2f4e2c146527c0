"""The wandb group of a run: one group per sweep, ``<task_name>-<sweep folder name>`` (the sweep folder is
named by its start time, ``logs/<task_name>/multiruns/<time>``); a single run is grouped by ``task_name``.

Light on purpose (no Lightning, no wandb): train.py and ``python -m linrope.dashboard`` use it.  What a
model is called (``model.name``, the run name, the tags) is ``linrope.models.spec.ModelConfig``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def wandb_group(task_name: str, sweep_dir: Optional[str] = None) -> str:
    """``<task_name>-<sweep folder name>`` for a job of a sweep, ``task_name`` for a single run.  A sweep
    folder already named after the task (``hydra.sweep.dir=results/pe_compare``) is not named twice."""
    if not sweep_dir:
        return str(task_name)
    folder = Path(str(sweep_dir)).name
    return folder if str(task_name) in folder else f"{task_name}-{folder}"


def program(module_command: str) -> str:
    """The name a command's usage line gives: ``linrope-report`` when started as that console script,
    else ``module_command`` (``python -m linrope.report``)."""
    import sys

    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("linrope-") else module_command
