"""After training: a stop during the test or the extrapolation is explained, and a sweep whose objective the
runs can never log is refused before its first trial.

- ``explain_stop(cfg, trainer)``: around train.py's test, extrapolation and the loggers' finish.  SIGTERM or
  SIGINT there (training is over; ``linrope.run.signals.SignalStop`` handles it during training) ends the run with
  one line — what finished (training, its checkpoint), what did not (the test, the extrapolation) and the one
  command that completes it (``python train.py <the run's overrides> train=false ckpt_path=<checkpoint>
  hydra.run.dir=<run>``) — and exit status 128 + the signal.  Once the run has completed (its test metrics
  logged and no extrapolation left, or ``completed()`` called), a signal prints one line saying so and where
  the results are; the run finishes writing and exits with 128 + the signal (a second signal: at once).
- ``objective_problem(cfg)`` / ``CheckObjective`` (a Hydra callback of ``conf/hparams_search/optuna.yaml``): a
  sweeper that optimises ``optimized_metric`` needs each run to log it; a metric the task never logs, a test
  metric (train.py returns before testing), ``train=false`` or no validation before ``trainer.max_steps`` is
  refused in one line naming the metric and the setting to change.
- ``validation_warning(cfg)``: one line at the start of a run whose validation cannot run before
  ``trainer.max_steps`` (no best checkpoint, no validation curve: the test scores the last weights).
- ``where_next(cfg, trainer, tested)``: the lines a finished run ends with: where its results are, which
  checkpoint the test scored, and the commands that make sense next (report, evaluate, generate).

No Lightning import (the trainer is passed in); Hydra only."""

from __future__ import annotations

import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

from hydra.experimental.callback import Callback

from linrope.base.naming import LANGUAGE_TASKS, higher_is_better
from linrope.base.nested import get
from linrope.base.stopping import Stopped, signals_to

NOT_REPEATED = ("ckpt_path", "train", "test", "hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.job")


def job_overrides() -> List[str]:
    """The overrides of this run (in a sweep: this job's), from Hydra; the command line's otherwise."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except Exception:  # noqa: BLE001 - outside a Hydra run (tests, tools)
        return [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]


def completing_command(cfg, ckpt: str) -> str:
    kept = [o for o in job_overrides() if o.lstrip("+~").split("=", 1)[0] not in NOT_REPEATED]
    run = str(cfg.paths.output_dir)
    return " ".join(
        [
            "python train.py",
            *map(shlex.quote, kept),
            "train=false",
            f"ckpt_path={shlex.quote(ckpt)}",
            f"hydra.run.dir={shlex.quote(run)}",
        ]
    )


def _checkpoint(cfg, trainer) -> Optional[str]:
    cb = getattr(trainer, "checkpoint_callback", None)
    best = getattr(cb, "best_model_path", "") if cb is not None else ""
    if best and Path(best).is_file():
        return best
    for cb in getattr(trainer, "checkpoint_callbacks", []) or []:
        last = getattr(cb, "last_model_path", "")
        if last and Path(last).is_file():
            return last
    ckpt = cfg.get("ckpt_path")
    return str(ckpt) if ckpt else None


def completed_message(cfg, signum: int, tested: bool) -> str:
    done = " and ".join(
        (["training"] if cfg.get("train", True) else [])
        + (["the test"] if tested else [])
        + (["the extrapolation"] if tested and (cfg.get("extrapolation") or {}).get("enabled") else [])
    )
    return (
        f"stopped by {signal.Signals(signum).name} after the run completed ({done or 'nothing to do'}): its "
        f"results are in {cfg.paths.output_dir}"
    )


def test_finished(trainer) -> bool:
    """Whether the test's metrics are logged: the test has finished (``trainer.state``), or its loop has logged
    its metrics (``test/…`` in ``trainer.callback_metrics``) and is printing its table or tearing down."""
    state = getattr(trainer, "state", None)
    if (
        state is not None
        and str(getattr(state, "fn", "")) in ("test", "TrainerFn.TESTING")
        and str(getattr(state, "status", "")) in ("finished", "TrainerStatus.FINISHED")
    ):
        return True
    return any(str(k).startswith("test/") for k in (getattr(trainer, "callback_metrics", None) or {}))


def stop_message(cfg, trainer, signum: int, test_finished: bool) -> str:
    ckpt = _checkpoint(cfg, trainer)
    extrapolating = bool((cfg.get("extrapolation") or {}).get("enabled"))
    done = (["training"] if cfg.get("train", True) else []) + (["the test"] if test_finished else [])
    not_done = ([] if test_finished else ["the test"]) + (["the extrapolation"] if extrapolating else [])
    during = "the extrapolation" if test_finished else "the test"
    head = f"stopped by {signal.Signals(signum).name} during {during}: finished {' and '.join(done) or 'nothing'}"
    if ckpt is None:
        return f"{head} (no checkpoint was saved); not done: {', '.join(not_done)}"
    return (
        f"{head} (checkpoint {ckpt}); not done: {', '.join(not_done)}; complete it with: "
        f"{completing_command(cfg, ckpt)}"
    )


class _Progress:
    """What ``explain_stop`` yields: ``completed()`` once every result of the run is written."""

    def __init__(self):
        self.done = False
        self.signum: Optional[int] = None  # a signal that came after the run completed

    def completed(self) -> None:
        self.done = True


@contextmanager
def explain_stop(cfg, trainer):
    """See the module docstring."""
    progress = _Progress()
    extrapolating = bool((cfg.get("extrapolation") or {}).get("enabled"))

    def stop(signum, frame):
        tested = cfg.get("test", True) and test_finished(trainer)
        if progress.signum is not None:  # a second signal after the run completed: stop now
            raise SystemExit(128 + signum)
        if progress.done or (tested and not extrapolating):
            progress.signum = signum  # the run has completed: say so, let it finish writing, then exit
            if getattr(trainer, "is_global_zero", True):
                print("linrope: " + completed_message(cfg, signum, tested), file=sys.stderr, flush=True)
            return
        raise Stopped(signum)

    try:
        with signals_to(stop):
            yield progress
    except Stopped as e:
        if getattr(trainer, "is_global_zero", True):
            print(
                "linrope: " + stop_message(cfg, trainer, e.signum, test_finished(trainer)), file=sys.stderr, flush=True
            )
        raise SystemExit(128 + e.signum) from None
    if progress.signum is not None:
        raise SystemExit(128 + progress.signum)


# ---- a sweep's objective ---------------------------------------------------------------------------------------
TRAIN_METRICS = ("loss", "lr", "tokens_per_sec", "peak_mem_mb")


def task_metric(metric: str, monitor: str) -> str:
    """The metric a run reports in place of ``metric`` (``optimized_metric``, the checkpoint callback's
    ``monitor``): a task that picks checkpoints by another ``monitor`` than val/bpb (its data module's: val/loss
    for the synthetic tasks, which have no bits per byte) takes it where the config kept the default val/bpb."""
    return monitor if metric == "val/bpb" else metric


def no_validation(cfg) -> Optional[str]:
    """Why no validation runs before the run ends (``trainer.limit_val_batches=0``, or a validation interval
    longer than ``trainer.max_steps``), with the setting that gives one; None when it runs."""
    if get(cfg, "trainer.limit_val_batches") == 0:
        return "trainer.limit_val_batches=0 (set it to null for every batch, or > 0)"
    max_steps, every = get(cfg, "trainer.max_steps"), get(cfg, "trainer.val_check_interval")
    if (
        isinstance(max_steps, int)
        and max_steps > 0
        and isinstance(every, int)
        and not isinstance(every, bool)
        and get(cfg, "trainer.check_val_every_n_epoch") is None
        and every > max_steps
    ):
        return (
            f"no validation before trainer.max_steps={max_steps} (trainer.val_check_interval={every}); set "
            f"trainer.val_check_interval={max_steps} or less, or trainer.max_steps={every} or more"
        )
    return None


def validation_warning(cfg) -> Optional[str]:
    """One line for a run that trains but can never validate (``no_validation``), or None."""
    if not cfg.get("train", True):
        return None
    why = no_validation(cfg)
    if why is None:
        return None
    return (
        f"warning: this run will not validate: {why}; without validation there is no best checkpoint and no "
        f"validation curve, and the test scores the last weights"
    )


def shown_path(path) -> str:
    """A path as a user would type it: relative to the current folder when inside it."""
    p = Path(str(path))
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def ckpt_arg(path: str) -> str:
    """``ckpt=PATH`` for a Hydra command line, quoted for the shell (and for Hydra, where the name holds '=')."""
    value = f'"{path}"' if "=" in path else path
    return shlex.quote(f"ckpt={value}")


def where_next(cfg, trainer, tested: Optional[str] = None) -> List[str]:
    """The lines a finished run ends with (printed by train.py on stdout): its folder, the checkpoint the test
    scored (``tested``; None: the last weights), and the next commands: the report of the run (of the sweep, in
    ``-m``), the length extrapolation and, for text, generation from the checkpoint."""
    from linrope.config.checks import sweep_dir

    run = shown_path(cfg.paths.output_dir)
    sweep = sweep_dir()
    ckpt = tested or _checkpoint(cfg, trainer)
    folder = Path(str(cfg.paths.output_dir))
    metrics = folder / "csv" / "metrics.csv"  # the CSV logger's (logger=csv or default); none with logger=none, wandb
    held = [name for name in ("checkpoints/", "csv/metrics.csv", "provenance.json") if (folder / name).exists()]
    lines = [f"run folder: {run}" + (f" ({', '.join(held)})" if held else "")]
    if cfg.get("test", True):
        if tested:
            how = "the best on validation" if cfg.get("train", True) else "ckpt_path"
            lines.append(f"the test scored {shown_path(tested)} ({how})")
        elif cfg.get("train", True):
            lines.append("the test scored the last weights: no validation ran, so no checkpoint was chosen on it")
    lines.append("next:")
    report = shown_path(sweep) if sweep else run
    if metrics.is_file():  # the report reads the CSV logger's metrics
        lines.append(f"  python -m linrope report {shlex.quote(report)}    # tables and figures: report.md")
    if ckpt:
        arg = ckpt_arg(shown_path(ckpt))
        lines.append(
            f"  python -m linrope evaluate {arg}    # loss by length, 1-16x the training context, every test byte "
            "(a quick look: factors=[1,2] scored_bytes=20000)"
        )
        if str(get(cfg, "data.task") or "bytes") in LANGUAGE_TASKS:
            lines.append(f"  python -m linrope generate {arg} prompt='\"def \"'    # sample text")
    return lines


def objective_problem(cfg) -> Optional[str]:
    """Why the runs of ``cfg`` can never log ``optimized_metric`` (one line), or None."""
    metric = str(cfg.get("optimized_metric") or "")
    if not metric:
        return None
    head = f"the sweep optimises optimized_metric={metric}, which"
    if not cfg.get("train", True):
        return f"{head} a run with train=false never returns: train the runs (train=true)"
    task, metric = str(get(cfg, "data.task") or "bytes"), reported_metric(cfg)
    stage, _, name = metric.partition("/")
    logged = {"bytes": ("loss", "bpb"), "text": ("loss", "bpb", "tokens", "bytes")}.get(task, ("loss", "acc"))
    if stage == "test":
        return f"{head} train.py returns before testing: set optimized_metric=val/{name}"
    if stage == "train":
        return (
            None
            if name in TRAIN_METRICS
            else f"{head} no run logs (train/{', train/'.join(TRAIN_METRICS)}): change optimized_metric"
        )
    if stage != "val" or name not in logged:
        return (
            f"{head} task {task} never logs (it logs val/{', val/'.join(logged)}): set optimized_metric=val/{logged[0]}"
        )
    why = no_validation(cfg)
    if why is not None:
        return f"{head} is never logged: {why}"
    return None


def reported_metric(cfg) -> str:
    """The metric the runs report for ``optimized_metric``: a task's data module picks checkpoints by val/loss
    (linrope.data.task_modules.TaskDataModule.monitor), which takes the place of the default val/bpb."""
    task = str(get(cfg, "data.task") or "bytes")
    return task_metric(str(cfg.get("optimized_metric") or ""), "val/bpb" if task in LANGUAGE_TASKS else "val/loss")


def direction_problem(cfg) -> Optional[str]:
    """A search that minimises an accuracy, or maximises a loss (``hydra.sweeper.direction`` against which way
    ``optimized_metric`` is better), in one line; None when they agree or no direction is set."""
    direction = get(cfg, "hydra.sweeper.direction")
    if not isinstance(direction, str) or not cfg.get("optimized_metric"):
        return None
    metric = reported_metric(cfg)
    want = "maximize" if higher_is_better(metric) else "minimize"
    if direction == want:
        return None
    return (
        f"hydra.sweeper.direction={direction} with optimized_metric={metric}, where "
        f"{'higher' if want == 'maximize' else 'lower'} is better: set hydra.sweeper.direction={want}"
    )


class CheckObjective(Callback):
    """Refuse a sweep before its first trial when its runs can never log the objective (``objective_problem``), or
    when it would search the wrong way (``direction_problem``)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        problem = objective_problem(config) or direction_problem(config)
        if problem:
            raise SystemExit(f"linrope: {problem}")
