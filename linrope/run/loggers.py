"""The loggers train.py builds (conf/logger/): Lightning's CSV and wandb loggers with four changes.

* ``CSVLogger`` keeps the whole history when another process wrote metrics.csv in between: with
  ``trainer=ddp_spawn`` fit and test run in processes started for each, and Lightning's writer, which
  knows only the columns it wrote itself, failed at test (``dict contains fields not in fieldnames``)
  or rewrote the file with the test columns alone.  Ours merges the file's header in before each save.
* ``keep_csv_history``: a resumed run moves the earlier metrics.csv aside (Lightning's writer deletes it).
* ``WandbLogger`` does not pass wandb's deprecated ``anonymous`` setting (a warning on every run).
* ``wandb_settings`` chooses the mode the way wandb does — ``logger.wandb.mode``, else ``$WANDB_MODE``,
  else online when logged in and offline otherwise — and names the group of a sweep
  (``linrope.base.naming.wandb_group``)."""

from __future__ import annotations

import csv
import netrc
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers import WandbLogger as _WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from linrope.base.csv_files import read_rows, write_rows
from linrope.base.errors import UserError
from linrope.base.naming import wandb_group
from linrope.run.folder import aside
from linrope.run.lightning_internals import drop_wandb_anonymous

WANDB_MODES = ("online", "offline", "disabled", "shared")


class CSVLogger(_CSVLogger):
    """Lightning's CSVLogger whose metrics.csv keeps every column any process of the run wrote."""

    @rank_zero_only
    def save(self) -> None:
        writer = self.experiment
        path = Path(writer.metrics_file_path)
        if writer.metrics and path.is_file():
            with open(path, newline="") as f:
                header = next(csv.reader(f), [])
            keys = sorted(set(writer.metrics_keys) | set(header))
            if header != keys:  # written by another process: take its columns, then Lightning appends
                write_rows(read_rows(path)[1], keys, path)
            writer.metrics_keys = keys
        super().save()


def keep_csv_history(log_dir: Path) -> None:
    """Lightning's CSV logger deletes an existing metrics.csv; a resumed run moves it aside first
    (metrics.before-resume-<k>.csv), so the history before the crash is kept."""
    old = log_dir / "metrics.csv"
    if old.is_file():
        old.rename(aside(log_dir, "metrics.before-resume-", ".csv"))


class WandbLogger(_WandbLogger):
    """Lightning's WandbLogger without the deprecated ``anonymous`` argument of ``wandb.init``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        drop_wandb_anonymous(self)


def earlier_wandb_id(save_dir: Path) -> Optional[str]:
    """The id of the last wandb run logged under ``save_dir`` (wandb's folders ``[offline-]run-<time>-<id>`` in
    ``save_dir/wandb``, named so that they sort by time), or None."""
    runs = sorted((save_dir / "wandb").glob("*run-*-*"), key=lambda p: p.name.removeprefix("offline-"))
    runs = [p for p in runs if p.is_dir() and not p.is_symlink()]
    return runs[-1].name.rsplit("-", 1)[1] if runs else None


def wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(
    requested: Optional[str], env: Mapping[str, str] = os.environ, logged_in: Callable[[], bool] = wandb_logged_in
) -> str:
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


def wandb_settings(
    lg: Dict[str, Any], task_name: str, sweep_dir: Optional[str], resume: bool = False
) -> Dict[str, Any]:
    """The WandbLogger arguments of ``conf/logger/wandb.yaml`` completed: mode, group, save folder; with ``resume``
    (a run continued from its checkpoint) the id of the wandb run it logged to before, so that it goes on logging to
    that run (a new one would count the job twice in the dashboard's mean over seeds)."""
    lg = dict(lg)
    lg["mode"] = wandb_mode(lg.get("mode"))
    lg["group"] = lg.get("group") or wandb_group(task_name, sweep_dir)
    earlier = earlier_wandb_id(Path(lg["save_dir"])) if resume and not lg.get("id") else None
    if earlier:
        lg.update(id=earlier, resume="allow")
    os.environ.setdefault("WANDB_SILENT", "true")
    # wandb's own crash reports (sentry.io) stay off unless the user turns them on: an offline run sends
    # nothing, and wandb < 0.18 would log three retries per report on a machine without a network
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    Path(lg["save_dir"]).mkdir(parents=True, exist_ok=True)
    return lg
