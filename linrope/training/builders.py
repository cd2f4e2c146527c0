"""Builders that train.py calls in order: data, model, callbacks, loggers, trainer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
import lightning as L
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict

from linrope.base.errors import UserError
from linrope.config.checks import (
    LINROPE_TRAINER_KEYS,
    checkpoint_path,
    plain,
    resolved_accelerator,
    sharded_checkpoints,
    sweep_dir,
    task_model,
)
from linrope.models.spec import ModelConfig
from linrope.run import provenance as P
from linrope.run.checkpoint import AtomicCheckpointIO, load_checkpoint
from linrope.run.loggers import keep_csv_history, wandb_settings
from linrope.run.resume_diff import announce, resume_record
from linrope.run.signals import MatmulPrecision, SignalStop, apply_matmul_precision
from linrope.training.after_training import job_overrides, task_metric
from linrope.training.lit import LanguageModel


def run_tags(cfg: DictConfig) -> List[str]:
    """wandb tags: the model's (``linrope.models.spec.ModelConfig.tags``: attention kind, position scheme, task,
    feature map, RoPE placement and scaling), then the config's ``tags``."""
    return ModelConfig.from_dict(plain(cfg.model)).tags(cfg.data.get("task", "bytes")) + list(cfg.get("tags") or [])


def run_name(cfg: DictConfig) -> str:
    """wandb's run name (``linrope.models.spec.ModelConfig.run_name``): ``linear-elu-rope-s1234``."""
    return ModelConfig.from_dict(plain(cfg.model)).run_name(cfg.seed)


def name_model(cfg: DictConfig) -> None:
    """``model.name`` when ``attention=…`` / ``position=…`` replaced the pair its preset chose: the label of
    the chosen pair (``linrope.models.spec.ModelConfig.label``); a ``model.name=…`` given is kept.  The preset's pair
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
    known = (
        GlobalHydra.instance()
        .config_loader()
        .compute_defaults_list(
            config_name=hc.job.config_name, overrides=[f"model={choices.get('model')}"], run_mode=RunMode.RUN
        )
        .overrides.known_choices
    )
    name = ModelConfig.from_dict(plain(cfg.model)).label(chosen, (known.get("attention"), known.get("position")))
    if name != cfg.model.get("name"):
        with open_dict(cfg):
            cfg.model.name = name
        _rename_in_saved_config(hc, name)


def _rename_in_saved_config(hc, name: str) -> None:
    """Hydra saved ``.hydra/config.yaml`` before the task ran, with the preset's name: write the chosen pair's name
    there too (atomically), so the saved config names the model as its hyper-parameters and the spec do."""
    from linrope.base.atomic import atomic_write_bytes

    if not hc.output_subdir:
        return
    saved = Path(hc.runtime.output_dir) / hc.output_subdir / "config.yaml"
    if not saved.is_file():
        return
    node = OmegaConf.load(saved)
    if OmegaConf.select(node, "model.name") != name:
        with open_dict(node):
            node.model.name = name
        atomic_write_bytes(OmegaConf.to_yaml(node).encode(), saved)


def build_datamodule(cfg: DictConfig):
    data = plain(cfg.data)
    data.pop("task", None)
    datamodule = hydra.utils.instantiate(data, _convert_="all")
    use_task_metric(cfg, getattr(datamodule, "monitor", "val/bpb"))
    return datamodule


def use_task_metric(cfg: DictConfig, monitor: str) -> None:
    """A task without bits per byte (mqar, offset_copy, listops) picks checkpoints by ``monitor``
    (val/loss) and returns it to a sweeper where the config kept the default val/bpb
    (``linrope.training.after_training.task_metric``).  Changes ``cfg`` in place, before the callbacks are built."""
    if monitor == "val/bpb":
        return
    with open_dict(cfg):
        if task_metric(cfg.get("optimized_metric"), monitor) != cfg.get("optimized_metric"):
            cfg.optimized_metric = monitor
        ckpt = (cfg.get("callbacks") or {}).get("model_checkpoint")
        if ckpt and task_metric(ckpt.get("monitor"), monitor) != ckpt.get("monitor"):
            ckpt.monitor, ckpt.mode = monitor, "min"
            ckpt.filename = "best-step{step:06d}-" + monitor.split("/")[-1] + "{" + monitor + ":.4f}"


def build_module(cfg: DictConfig):
    """The LightningModule of the model the task makes of ``cfg.model`` (``task_model``, as the config check saw it)."""
    return LanguageModel(model=task_model(cfg), optim=plain(cfg.optim), compile=bool(cfg.get("compile", False)))


def build_callbacks(cfg: DictConfig) -> list:
    """Every callback in the config, the stop on SIGTERM / SIGINT (linrope.run.signals) and
    ``trainer.matmul_precision`` in every process (linrope.run.signals.MatmulPrecision); the progress bar
    only while trainer.enable_progress_bar is on, the checkpoint callbacks only while
    trainer.enable_checkpointing is on (Lightning refuses them otherwise)."""
    skip = set()
    if not cfg.trainer.get("enable_progress_bar", True):
        skip.add("progress_bar")
    if not cfg.trainer.get("enable_checkpointing", True):
        skip |= {"model_checkpoint", "last_checkpoint"}
    callbacks = [
        hydra.utils.instantiate(c)
        for name, c in (cfg.get("callbacks") or {}).items()
        if c and "_target_" in c and name not in skip
    ]
    # after the config's: a signal sent in their on_train_batch_end counts
    return callbacks + [SignalStop(), MatmulPrecision(cfg.trainer.get("matmul_precision"))]


def build_loggers(cfg: DictConfig) -> list:
    """The loggers of ``cfg.logger``; wandb's mode, group, name and tags filled in (linrope.run.loggers)."""
    loggers = []
    for name, lg in (cfg.get("logger") or {}).items():
        if not lg or "_target_" not in lg:
            continue
        lg = plain(lg)
        if name == "wandb":
            # a resume (a checkpoint found: ckpt_path=auto may find none) goes on logging to the earlier wandb run
            lg = wandb_settings(lg, cfg.get("task_name", "train"), sweep_dir(), resume=resolve_ckpt(cfg) is not None)
            lg.setdefault("name", run_name(cfg))
            lg["tags"] = run_tags(cfg)
        if name == "csv" and cfg.get("ckpt_path"):
            keep_csv_history(Path(lg["save_dir"]) / lg.get("name", "csv") / str(lg.get("version", "")))
        loggers.append(hydra.utils.instantiate(lg))
    return loggers


def trainer_arguments(cfg: DictConfig) -> Dict[str, Any]:
    """``cfg.trainer`` as the Trainer takes it: linrope's own keys (``matmul_precision``) left out,
    ``accelerator: auto`` resolved by linrope (a CUDA GPU if there is one, else the CPU; never Apple's MPS
    unless asked: linrope.config.checks.resolved_accelerator), and ``val_check_interval`` in steps (as linrope
    counts it: optimizer steps) turned into Lightning's training batches under ``accumulate_grad_batches``."""
    args = plain(cfg.trainer)
    for key in LINROPE_TRAINER_KEYS:
        args.pop(key, None)
    if args.get("accelerator", "auto") in ("auto", None):
        args["accelerator"] = resolved_accelerator("auto")
    every, accumulate = args.get("val_check_interval"), int(args.get("accumulate_grad_batches") or 1)
    if isinstance(every, int) and not isinstance(every, bool) and accumulate > 1:
        args["val_check_interval"] = every * accumulate  # linrope counts optimizer steps, Lightning batches
    return args


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    """The Trainer of ``cfg.trainer`` (``trainer_arguments``), after ``trainer.matmul_precision`` is applied
    in this process (linrope.run.signals), writing checkpoints atomically (linrope.run.checkpoint.AtomicCheckpointIO)
    unless the config names its own plugins or a strategy that writes sharded checkpoints (FSDP's default,
    ``state_dict_type: full``, writes one file on rank 0 through it); Lightning's refusals of a trainer
    config (MisconfigurationException, ValueError: an unknown strategy, accelerator, …) become one line."""
    apply_matmul_precision(cfg.trainer.get("matmul_precision"))
    extra: Dict[str, Any] = {}
    if cfg.trainer.get("plugins") is None and not sharded_checkpoints(cfg.trainer.get("strategy")):
        extra["plugins"] = [AtomicCheckpointIO()]
    try:
        return hydra.utils.instantiate(trainer_arguments(cfg), callbacks=callbacks, logger=loggers or False, **extra)
    except Exception as e:  # noqa: BLE001 - instantiate wraps Lightning's error
        cause = e
        while cause is not None and not isinstance(cause, (MisconfigurationException, ValueError)):
            cause = cause.__cause__  # Lightning's Trainer refuses flags with these two
        if cause is None:
            raise
        raise UserError(f"trainer: {cause}") from cause


def log_config(cfg: DictConfig, module, loggers: list, provenance: Optional[dict] = None) -> None:
    """The composed config, the parameter count, the run's tags and its provenance go to every logger (the CSV
    logger's hparams.yaml, the wandb config); the provenance and the config also into every checkpoint."""
    params = {**plain(cfg), "n_params": module.model.num_params(), "run_tags": run_tags(cfg)}
    if provenance is not None:
        params["provenance"] = provenance
        module.provenance, module.run_config = provenance, plain(cfg)
    for lg in loggers:
        lg.log_hyperparams(params)
        if isinstance(lg, WandbLogger):
            exp = lg.experiment
            if hasattr(exp, "define_metric"):
                exp.define_metric("val/bpb", summary="min")
                exp.define_metric("val/loss", summary="min")


def record_provenance(cfg: DictConfig, datamodule=None) -> dict:
    """This run's provenance (linrope.run.provenance), written to ``<run folder>/provenance.json``; a resume prints
    what it changes, one line per key, and writes them with the chain of runs it continues to ``resume.json``
    (linrope.run.resume_diff).  A data=text run's tokenizer and corpus by path and hash (``data``:
    linrope.data.record) are in it, and so in every checkpoint."""
    prov = P.collect(precision=cfg.trainer.get("precision"), seed=cfg.get("seed"), overrides=job_overrides())
    if getattr(datamodule, "record", None):
        prov["data"] = datamodule.record
    first = not any(int(os.environ.get(v, "0") or 0) > 0 for v in ("LOCAL_RANK", "RANK", "SLURM_PROCID"))
    path = resolve_ckpt(cfg) if cfg.get("train", True) else None
    if path:
        record = resume_record(
            load_checkpoint(path), path, plain(cfg), OmegaConf.to_container(cfg, resolve=False), current=prov
        )
        prov["resumed_from"] = record["continues"]
        if first:
            announce(record, Path(str(cfg.paths.output_dir)))
    if first:
        P.write(Path(str(cfg.paths.output_dir)), prov)
    return prov


def resolve_ckpt(cfg: DictConfig) -> Optional[str]:
    """``ckpt_path``: a file; ``last`` for this run directory's checkpoints/last.ckpt (which must exist);
    ``auto`` for that file if it exists, else None (start afresh: a cluster job that may be requeued).
    A missing or half-written file is a one-line error (linrope.config.checks.checkpoint_path).  The checkpoint
    is loaded with weights_only=True (AtomicCheckpointIO); parameters that do not fit the model are named
    by LanguageModel.on_load_checkpoint."""
    return checkpoint_path(cfg)


def check_resume(cfg: DictConfig, module, datamodule=None) -> None:
    """The checkpoint of ``ckpt_path`` fits the model built now (its parameters and identity, as
    ``LanguageModel.on_load_checkpoint`` checks them when Lightning loads it) and a data=text run reads the
    tokenizer and corpus it trained on (by content hash: linrope.data.record): refused in one line before anything
    is written into the run folder (provenance, the CSV history), so that a refused resume changes nothing there.
    The file is memory-mapped: no tensor data is read."""
    path = resolve_ckpt(cfg)
    if path and Path(path).is_file():
        import torch

        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        module.on_load_checkpoint(checkpoint)
        seed = (checkpoint.get(P.CONFIG_KEY) or {}).get("seed")
        own = Path(str(cfg.paths.output_dir)).resolve() in Path(path).resolve().parents  # this job's folder's
        if sweep_dir() is not None and own and seed is not None and seed != cfg.seed:  # a single run may change it
            raise UserError(
                f"{path} is the run of seed {seed}, and this job of the sweep is seed {cfg.seed}: a sweep's job "
                "resumes only its own run (job folders are named by what differs between this sweep's jobs, so a "
                "sweep of other seeds names the same folders); choose a new hydra.sweep.dir"
            )
        saved = (checkpoint.get(P.PROVENANCE_KEY) or {}).get("data") or {}
        now = getattr(datamodule, "record", None)
        if saved and now:
            from linrope.data.record import check_corpus, check_tokenizer

            tok = saved.get("tokenizer") or {}
            check_tokenizer(tok, datamodule.tokenizer, "resume",
                            f"pass data.tokenizer={tok.get('path') or tok.get('spec')}, or start a new run")  # fmt: skip
            check_corpus(saved.get("corpus"), now["corpus"], "resume",
                         "resume on the corpus the run trained on, or start a new run")  # fmt: skip


def test_checkpoint(cfg: DictConfig) -> Optional[str]:
    """What ``train=false test=true`` tests: the checkpoint of ``ckpt_path`` — never the random weights of a
    new model (a one-line UserError when there is none)."""
    if cfg.get("train", True) or not cfg.get("test", True):
        return None
    path = resolve_ckpt(cfg)
    if path is None:
        raise UserError(
            "train=false test=true tests a checkpoint: pass ckpt_path=<file> (or last, in the run's "
            f"folder){' — ckpt_path=auto found none' if cfg.get('ckpt_path') else ''}"
        )
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


def finish(loggers: list) -> None:
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            import wandb

            wandb.finish()
