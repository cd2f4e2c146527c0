"""Builders that train.py calls in order: data, model, callbacks, loggers, trainer."""
from __future__ import annotations

import importlib
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
import lightning as L
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, open_dict
from torch.multiprocessing.spawn import ProcessRaisedException

from linrope.checkpoint import AtomicCheckpointIO
from linrope.config import checkpoint_path, plain, sweep_dir
from linrope.errors import LinropeError, UserError
from linrope.evaluate import extrapolate_after_test
from linrope.lit import LanguageModel
from linrope.loggers import wandb_settings
from linrope.spec import ModelConfig
from linrope.summary import ParamSummary


@contextmanager
def one_line_errors():
    """Turn the errors a user can fix (``linrope.errors.LinropeError``) into a one-line message
    (``linrope: ...``) and exit status 1, no traceback; a run stopped by SIGTERM / SIGINT into its one line
    and exit status 128 + the signal.  Finds the error through the ``__cause__`` chain (Hydra's
    instantiate wraps what we raised) and in the traceback text of a process that ``trainer=ddp_spawn``
    started."""
    try:
        yield
    except SIGTERMException as e:  # a run stopped by SIGTERM or SIGINT (LastCheckpoint.on_exception)
        message, code = getattr(e, "linrope_stop", ("stopped by SIGTERM", 128 + signal.SIGTERM))
        if message:
            print("linrope: " + message, file=sys.stderr, flush=True)
        raise SystemExit(code) from None
    except Exception as e:  # noqa: BLE001 - Hydra's instantiate wraps the error we raised
        cause = e
        while cause is not None and not isinstance(cause, LinropeError):
            cause = cause.__cause__
        message = str(cause) if cause is not None else _user_error_in_child(e)
        if message is None:
            raise
        raise SystemExit("linrope: " + message.replace("\n", "\nlinrope: ")) from None


def _user_error_in_child(e: BaseException) -> Optional[str]:
    """The message of a user error raised in a spawned process (torch's ProcessRaisedException carries
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
    return message if isinstance(cls, type) and issubclass(cls, LinropeError) else None


def run_tags(cfg: DictConfig) -> List[str]:
    """wandb tags: the model's (``linrope.spec.ModelConfig.tags``: attention kind, position scheme, task,
    feature map, RoPE placement and scaling), then the config's ``tags``."""
    return ModelConfig.from_dict(plain(cfg.model)).tags(cfg.data.get("task", "bytes")) + list(cfg.get("tags") or [])


def run_name(cfg: DictConfig) -> str:
    """wandb's run name (``linrope.spec.ModelConfig.run_name``): ``linear-elu-rope-s1234``."""
    return ModelConfig.from_dict(plain(cfg.model)).run_name(cfg.seed)


def name_model(cfg: DictConfig) -> None:
    """``model.name`` when ``attention=…`` / ``position=…`` replaced the pair its preset chose: the label of
    the chosen pair (``linrope.spec.ModelConfig.label``); a ``model.name=…`` given is kept.  The preset's pair
    is what Hydra composes for ``model=<preset>`` alone.  Sets ``cfg.model.name`` for the logs, wandb and the
    checkpoint; no-op without a Hydra run (tests compose configs directly)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not (HydraConfig.initialized() and GlobalHydra.instance().is_initialized()) or "model" not in cfg:
        return
    hc = HydraConfig.get()
    if any(str(o).lstrip("+~").startswith("model.name=") for o in hc.overrides.task):
        return
    choices = hc.runtime.choices
    chosen = (choices.get("attention"), choices.get("position"))
    if not (choices.get("model") and all(chosen)):
        return
    known = GlobalHydra.instance().config_loader().compute_defaults_list(
        config_name=hc.job.config_name, overrides=[f"model={choices.get('model')}"], run_mode=RunMode.RUN
    ).overrides.known_choices
    name = ModelConfig.from_dict(plain(cfg.model)).label(chosen, (known.get("attention"), known.get("position")))
    if name != cfg.model.get("name"):
        with open_dict(cfg):
            cfg.model.name = name


def build_datamodule(cfg: DictConfig):
    data = plain(cfg.data)
    data.pop("task", None)
    datamodule = hydra.utils.instantiate(data, _convert_="all")
    # its settings are logged once, as data.* of the whole config (log_config), not again as top-level keys
    datamodule._log_hyperparams = False
    use_task_metric(cfg, getattr(datamodule, "monitor", "val/bpb"))
    return datamodule


def use_task_metric(cfg: DictConfig, monitor: str) -> None:
    """A task without bits per byte (mqar, offset_copy, listops) picks checkpoints by ``monitor``
    (val/loss) and returns it to a sweeper — unless the config chose something else than the
    default val/bpb.  Changes ``cfg`` in place, before the callbacks are built."""
    if monitor == "val/bpb":
        return
    with open_dict(cfg):
        if cfg.get("optimized_metric") == "val/bpb":
            cfg.optimized_metric = monitor
        ckpt = (cfg.get("callbacks") or {}).get("model_checkpoint")
        if ckpt and ckpt.get("monitor") == "val/bpb":
            ckpt.monitor, ckpt.mode = monitor, "min"
            ckpt.filename = "best-step{step:06d}-" + monitor.split("/")[-1] + "{" + monitor + ":.4f}"


def data_model_overrides(cfg: DictConfig) -> Dict[str, Any]:
    """What the data decides about the model: the task name, and for the synthetic tasks
    ``vocab_size`` / ``causal`` / ``n_classes`` / the longest position (``model_overrides_for``
    of the data module class, asked before any data is made)."""
    overrides: Dict[str, Any] = {"task": cfg.data.get("task", "bytes")}
    target = cfg.data.get("_target_")
    cls = hydra.utils.get_class(target) if target else None
    ask = getattr(cls, "model_overrides_for", None)
    if ask is not None:
        overrides.update(ask(plain(cfg.data)))
    return overrides


def build_module(cfg: DictConfig):
    model = plain(cfg.model)
    overrides = data_model_overrides(cfg)
    if "max_len" in overrides:  # a learned table covers the longest sequence the task evaluates
        overrides["max_len"] = max(int(model.get("max_len") or 0), int(overrides["max_len"]))
    model.update(overrides)
    return LanguageModel(model=model, optim=plain(cfg.optim), compile=bool(cfg.get("compile", False)))


def build_callbacks(cfg: DictConfig) -> list:
    """Every callback in the config; the progress bar only while trainer.enable_progress_bar is on, the
    checkpoint callbacks only while trainer.enable_checkpointing is on (Lightning refuses them otherwise);
    and the model summary without a FLOPs column (linrope.summary) unless trainer.enable_model_summary=false."""
    skip = set()
    if not cfg.trainer.get("enable_progress_bar", True):
        skip.add("progress_bar")
    if not cfg.trainer.get("enable_checkpointing", True):
        skip |= {"model_checkpoint", "last_checkpoint"}
    callbacks = [hydra.utils.instantiate(c) for name, c in (cfg.get("callbacks") or {}).items()
                 if c and "_target_" in c and name not in skip]
    if cfg.trainer.get("enable_model_summary", True) is not False and \
            not any(isinstance(c, ModelSummary) for c in callbacks):
        callbacks.append(ParamSummary())
    return callbacks


def build_loggers(cfg: DictConfig) -> list:
    """The loggers of ``cfg.logger``; wandb's mode, group, name and tags filled in (linrope.loggers)."""
    loggers = []
    for name, lg in (cfg.get("logger") or {}).items():
        if not lg or "_target_" not in lg:
            continue
        lg = plain(lg)
        if name == "wandb":
            lg = wandb_settings(lg, cfg.get("task_name", "train"), sweep_dir())
            lg.setdefault("name", run_name(cfg))
            lg["tags"] = run_tags(cfg)
        if name == "csv" and cfg.get("ckpt_path"):
            keep_csv_history(Path(lg["save_dir"]) / lg.get("name", "csv") / str(lg.get("version", "")))
        loggers.append(hydra.utils.instantiate(lg))
    return loggers


def keep_csv_history(log_dir: Path) -> None:
    """Lightning's CSV logger deletes an existing metrics.csv; a resumed run moves it aside first
    (metrics.before-resume-<k>.csv), so the history before the crash is kept."""
    old = log_dir / "metrics.csv"
    if old.is_file():
        k = len(list(log_dir.glob("metrics.before-resume-*.csv")))
        old.rename(log_dir / f"metrics.before-resume-{k}.csv")


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    """The Trainer of ``cfg.trainer``, writing checkpoints atomically (linrope.checkpoint.AtomicCheckpointIO)
    unless the config names its own plugins or a sharded strategy; Lightning's refusals of a trainer
    config (MisconfigurationException, ValueError: an unknown strategy, accelerator, …) become one line."""
    extra: Dict[str, Any] = {}
    strategy = str(cfg.trainer.get("strategy") or "")
    if cfg.trainer.get("plugins") is None and not any(s in strategy for s in ("fsdp", "deepspeed")):
        extra["plugins"] = [AtomicCheckpointIO()]
    try:
        return hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **extra)
    except Exception as e:  # noqa: BLE001 - instantiate wraps Lightning's error
        cause = e
        while cause is not None and not isinstance(cause, (MisconfigurationException, ValueError)):
            cause = cause.__cause__  # Lightning's Trainer refuses flags with these two
        if cause is None:
            raise
        raise UserError(f"trainer: {cause}") from cause


def log_config(cfg: DictConfig, module, loggers: list) -> None:
    """The composed config, the parameter count and the run's tags go to every logger."""
    params = {**plain(cfg), "n_params": module.model.num_params(), "run_tags": run_tags(cfg)}
    for lg in loggers:
        lg.log_hyperparams(params)
        if isinstance(lg, WandbLogger):
            exp = lg.experiment
            if hasattr(exp, "define_metric"):
                exp.define_metric("val/bpb", summary="min")
                exp.define_metric("val/loss", summary="min")


def resolve_ckpt(cfg: DictConfig) -> Optional[str]:
    """``ckpt_path``: a file; ``last`` for this run directory's checkpoints/last.ckpt (which must exist);
    ``auto`` for that file if it exists, else None (start afresh: a cluster job that may be requeued).
    A missing or half-written file is a one-line error (linrope.config.checkpoint_path).  The checkpoint
    is loaded with weights_only=True (AtomicCheckpointIO); parameters that do not fit the model are named
    by LanguageModel.on_load_checkpoint."""
    return checkpoint_path(cfg)


def test_checkpoint(cfg: DictConfig) -> Optional[str]:
    """What ``train=false test=true`` tests: the checkpoint of ``ckpt_path`` — never the random weights of a
    new model (a one-line UserError when there is none)."""
    if cfg.get("train", True) or not cfg.get("test", True):
        return None
    path = resolve_ckpt(cfg)
    if path is None:
        raise UserError("train=false test=true tests a checkpoint: pass ckpt_path=<file> (or last, in the run's "
                        f"folder){' — ckpt_path=auto found none' if cfg.get('ckpt_path') else ''}")
    return path


def best_ckpt(trainer: L.Trainer) -> Optional[str]:
    """The best checkpoint of the run (to test), or None (test the weights as they are)."""
    cb = trainer.checkpoint_callback
    path = getattr(cb, "best_model_path", "") if cb is not None else ""
    return path if path and os.path.exists(path) else None


def metric(trainer: L.Trainer, name: str) -> Optional[float]:
    """What a sweeper minimises: the best value the checkpoint callback saw, else the last logged."""
    cb = trainer.checkpoint_callback
    if cb is not None and cb.monitor == name and cb.best_model_score is not None:
        return float(cb.best_model_score)
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def extrapolate(cfg: DictConfig, trainer: L.Trainer, module, datamodule, loggers: list) -> None:
    """Length extrapolation after testing, when ``extrapolation.enabled`` (see linrope.evaluate)."""
    ex = cfg.get("extrapolation")
    if not ex or not ex.get("enabled"):
        return
    extrapolate_after_test(cfg, trainer, module, datamodule, loggers)


def finish(loggers: list) -> None:
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            import wandb

            wandb.finish()
