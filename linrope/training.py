"""Builders that train.py calls in order: data, model, callbacks, loggers, trainer."""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

from linrope.config import ConfigError
from linrope.data.bytes import CorpusError


class UserError(Exception):
    """Errors a user can fix from the command line; reported in one line."""


USER_ERRORS = (ConfigError, CorpusError, UserError)


@contextmanager
def one_line_errors():
    """Turn the errors a user can fix into a one-line message and exit status 2 (no traceback)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - Hydra's instantiate wraps the error we raised
        cause = e
        while cause is not None and not isinstance(cause, USER_ERRORS):
            cause = cause.__cause__
        if cause is None:
            raise
        raise SystemExit("linrope: " + str(cause).replace("\n", "\nlinrope: ")) from None


def container(node) -> Dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def run_tags(cfg: DictConfig) -> List[str]:
    """wandb tags: attention kind, feature map, RoPE placement, position scheme, task."""
    att, pos = cfg.model.attention, cfg.model.position
    tags = [f"attention:{att.kind}", f"position:{pos.name}", f"task:{cfg.data.get('task', 'bytes')}"]
    if att.kind == "linear":
        tags += [f"feature_map:{att.get('feature_map', 'elu')}"]
        if pos.name == "rope":
            tags += [f"placement:{att.get('placement', 'numerator')}"]
    if pos.name == "rope" and pos.get("scaling"):
        tags += [f"rope_scaling:{pos.scaling}"]
    return tags + list(cfg.get("tags") or [])


def run_name(cfg: DictConfig) -> str:
    att, pos = cfg.model.attention, cfg.model.position
    name = att.kind
    if att.kind == "linear":
        name += f"-{att.get('feature_map', 'elu')}"
    name += f"-{pos.name}"
    if att.kind == "linear" and pos.name == "rope" and att.get("placement", "numerator") != "numerator":
        name += f"-{att.placement}"
    return f"{name}-s{cfg.seed}"


def build_datamodule(cfg: DictConfig):
    data = container(cfg.data)
    data.pop("task", None)
    return hydra.utils.instantiate(data, _convert_="all")


def build_module(cfg: DictConfig):
    from linrope.lit import LanguageModel

    return LanguageModel(model=container(cfg.model), optim=container(cfg.optim))


def build_callbacks(cfg: DictConfig) -> list:
    """Every callback in the config; the progress bar only while trainer.enable_progress_bar is on,
    the learning-rate monitor only when there is a logger to write to."""
    skip = set()
    if not cfg.trainer.get("enable_progress_bar", True):
        skip.add("progress_bar")
    if not any(lg and "_target_" in lg for lg in (cfg.get("logger") or {}).values()):
        skip.add("lr_monitor")
    return [hydra.utils.instantiate(c) for name, c in (cfg.get("callbacks") or {}).items()
            if c and "_target_" in c and name not in skip]


def wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def build_loggers(cfg: DictConfig) -> list:
    loggers = []
    for name, lg in (cfg.get("logger") or {}).items():
        if not lg or "_target_" not in lg:
            continue
        lg = container(lg)
        if name == "wandb":
            if not lg.get("offline", True) and not wandb_logged_in():
                warnings.warn("logger.wandb.offline=false but wandb is not logged in (`wandb login`): logging offline")
                lg["offline"] = True
            os.environ.setdefault("WANDB_SILENT", "true")
            Path(lg["save_dir"]).mkdir(parents=True, exist_ok=True)
            lg.setdefault("name", run_name(cfg))
            lg["tags"] = run_tags(cfg)
        loggers.append(hydra.utils.instantiate(lg))
    return loggers


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    return hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)


def log_config(cfg: DictConfig, module, loggers: list) -> None:
    """The composed config, the parameter count and the run's tags go to every logger."""
    params = {**container(cfg), "n_params": module.model.num_params(), "run_tags": run_tags(cfg)}
    for lg in loggers:
        lg.log_hyperparams(params)
        if type(lg).__name__ == "WandbLogger":
            exp = lg.experiment
            if hasattr(exp, "define_metric"):
                exp.define_metric("val/bpb", summary="min")
                exp.define_metric("val/loss", summary="min")


def resolve_ckpt(cfg: DictConfig) -> Optional[str]:
    """``ckpt_path``: a file, or ``last`` for this run directory's checkpoints/last.ckpt."""
    ckpt = cfg.get("ckpt_path")
    if not ckpt:
        return None
    if ckpt == "last":
        last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
        if not last.exists():
            raise UserError(f"ckpt_path=last: no {last} (pass hydra.run.dir=<the run's folder> to resume a run)")
        return str(last)
    if not Path(ckpt).exists():
        raise UserError(f"ckpt_path {ckpt}: does not exist")
    return str(ckpt)


def best_ckpt(trainer: L.Trainer) -> Optional[str]:
    cb = trainer.checkpoint_callback
    if cb is not None and getattr(cb, "best_model_path", ""):
        return cb.best_model_path
    return None


def metric(trainer: L.Trainer, name: str) -> Optional[float]:
    """What a sweeper minimises: the best value the checkpoint callback saw, else the last logged."""
    cb = trainer.checkpoint_callback
    if cb is not None and cb.monitor == name and cb.best_model_score is not None:
        return float(cb.best_model_score)
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def finish(loggers: list) -> None:
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger":
            import wandb

            wandb.finish(quiet=True)
