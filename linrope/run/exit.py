"""How a run ends when it does not end well: the errors a user can fix (``linrope.base.errors.LinropeError``)
and a stop by SIGTERM / SIGINT, each as one ``linrope: …`` line and an exit status, no traceback."""

from __future__ import annotations

import importlib
import signal
import sys
from contextlib import contextmanager
from typing import Optional

from hydra.errors import CompactHydraException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.multiprocessing.spawn import ProcessRaisedException

from linrope.base.errors import LinropeError


class JobFailed(CompactHydraException):
    """A job of a sweep (``-m``) that ended with an outcome (``LinropeError.outcome``: its loss diverged): an
    exception, not ``SystemExit``, so that Hydra's sweeper marks the job failed and runs the others (optuna counts a
    failed trial against ``max_failure_rate``); the basic sweeper ends with its line (compact: no traceback), once
    every job has run."""


@contextmanager
def one_line_errors(sweep: bool = False):
    """Turn the errors a user can fix into a one-line message (``linrope: ...``) and exit status 1; a run
    stopped by SIGTERM / SIGINT into its one line and exit status 128 + the signal (linrope.run.signals).
    Finds the error through the ``__cause__`` chain (Hydra's instantiate wraps what we raised) and in the
    traceback text of a process that ``trainer=ddp_spawn`` started.  In a ``sweep``'s job an outcome (a diverged
    loss) prints its line and fails that job only (``JobFailed``); a refusal still ends the sweep."""
    try:
        yield
    except SIGTERMException as e:  # a run stopped by SIGTERM or SIGINT (SignalStop.on_exception)
        message, code = getattr(e, "linrope_stop", ("stopped by SIGTERM", 128 + signal.SIGTERM))
        if message:
            print("linrope: " + message, file=sys.stderr, flush=True)
        raise SystemExit(code) from None
    except Exception as e:  # noqa: BLE001 - Hydra's instantiate wraps the error we raised
        if sweep:  # the sweep goes on in this process: the next job must not log into this job's wandb run
            _finish_wandb()
        cause = e
        while cause is not None and not isinstance(cause, LinropeError):
            cause = cause.__cause__
        found = (str(cause), type(cause)) if cause is not None else _user_error_in_child(e)
        if found is None:
            raise
        line = "linrope: " + found[0].replace("\n", "\nlinrope: ")
        if sweep and found[1].outcome:
            print(line, file=sys.stderr, flush=True)
            raise JobFailed(line) from None
        raise SystemExit(line) from None


def _finish_wandb() -> None:
    """End this process's wandb run, if one is open, as failed (Lightning's logger finishes it only on success, and
    its next WandbLogger would take the open run over)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=1)


def _user_error_in_child(e: BaseException) -> Optional[tuple]:
    """(message, class) of a user error raised in a spawned process (torch's ProcessRaisedException carries
    only the child's traceback as text, whose last line is ``module.Class: message``)."""
    if not isinstance(e, ProcessRaisedException):
        return None
    lines = str(e).strip().splitlines()
    name, _, message = (lines[-1] if lines else "").partition(": ")
    module, _, cls_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError, ValueError):
        return None
    return (message, cls) if isinstance(cls, type) and issubclass(cls, LinropeError) else None
