"""The loggers train.py builds (conf/logger/): Lightning's CSV and wandb loggers with three changes.

* ``CSVLogger`` keeps the whole history when another process wrote metrics.csv in between: with
  ``trainer=ddp_spawn`` fit and test run in processes started for each, and Lightning's writer, which
  knows only the columns it wrote itself, failed at test (``dict contains fields not in fieldnames``)
  or rewrote the file with the test columns alone.  Ours reads the file's header before appending.
* ``WandbLogger`` does not pass wandb's deprecated ``anonymous`` setting (a warning on every run).
* ``wandb_settings`` chooses the mode the way wandb does — ``logger.wandb.mode``, else ``$WANDB_MODE``,
  else online when logged in and offline otherwise — and names the group of a sweep
  (``linrope.naming.wandb_group``)."""
from __future__ import annotations

import csv
import netrc
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers import WandbLogger as _WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from linrope.errors import UserError
from linrope.naming import wandb_group

WANDB_MODES = ("online", "offline", "disabled", "shared")


class _ContinuingWriter(ExperimentWriter):
    def save(self) -> None:
        if self.metrics and self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                header = next(csv.reader(f), [])
            if header != self.metrics_keys:  # written by another process: take its columns
                self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
                self._rewrite_with_new_header(self.metrics_keys)
        super().save()


class CSVLogger(_CSVLogger):
    """Lightning's CSVLogger whose metrics.csv keeps every column any process of the run wrote."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(log_dir=self.log_dir)
        return self._experiment


class WandbLogger(_WandbLogger):
    """Lightning's WandbLogger without the deprecated ``anonymous`` argument of ``wandb.init``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)


def wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(requested: Optional[str], env: Mapping[str, str] = os.environ,
               logged_in: Callable[[], bool] = wandb_logged_in) -> str:
    """``requested`` (logger.wandb.mode), else ``$WANDB_MODE``, else online when logged in, else offline.
    Online without a login falls back to offline with a warning (a batch job cannot answer a prompt)."""
    source = "logger.wandb.mode" if requested else "WANDB_MODE"
    mode = str(requested or env.get("WANDB_MODE") or ("online" if logged_in() else "offline")).lower()
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)  # wandb's older spellings
    if mode not in WANDB_MODES:
        raise UserError(f"{source}={mode}: expected one of {', '.join(WANDB_MODES)}")
    if mode in ("online", "shared") and not logged_in():
        warnings.warn(f"{source}={mode} but wandb is not logged in (`wandb login`): logging offline")
        return "offline"
    return mode


def wandb_settings(lg: Dict[str, Any], task_name: str, sweep_dir: Optional[str]) -> Dict[str, Any]:
    """The WandbLogger arguments of ``conf/logger/wandb.yaml`` completed: mode, group, save folder."""
    lg = dict(lg)
    lg["mode"] = wandb_mode(lg.get("mode"))
    lg["group"] = lg.get("group") or wandb_group(task_name, sweep_dir)
    os.environ.setdefault("WANDB_SILENT", "true")
    Path(lg["save_dir"]).mkdir(parents=True, exist_ok=True)
    return lg
