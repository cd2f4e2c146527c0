"""Checks on a composed config, made before any data is read or model built.

Each failure is one line that names the problem (``ConfigError``); train.py prints it
and exits without a traceback.  Imports no Lightning (but to look up an unusual
``trainer.strategy`` name), so a bad config fails fast.  ``SCHEMA`` is the one table of the values
the code reads: type, range and allowed values (read from the code's own vocabularies).
``check_command_line`` (linrope.command_line) runs even earlier, before Hydra."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

# the command-line check lives in linrope.command_line; these names stay importable from here
from linrope.command_line import CONF_DIR, check_command_line, command_line_errors, group_options  # noqa: F401
from linrope.errors import ConfigError


def plain(node) -> Dict[str, Any]:
    """A config node (DictConfig, resolved, or any mapping) as a plain dict."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def _get(cfg, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


# ---- the schema: every scalar the code reads, its type, range and allowed values ------------------------------
@dataclass(frozen=True)
class Rule:
    """One entry of ``SCHEMA``: an int, a number or one of ``choices``; bounds are inclusive (``low``,
    ``high``) or strict (``above``, ``below``); ``null``: None is allowed too."""
    kind: str                                    # "int" | "number" | "bool" | "choice"
    low: Optional[float] = None
    above: Optional[float] = None
    high: Optional[float] = None
    below: Optional[float] = None
    choices: Optional[Callable[[], Sequence[Any]]] = None  # read from the code's own vocabulary when checked
    null: bool = False
    note: str = ""

    def expectation(self) -> str:
        if self.kind == "choice":
            text = "one of " + ", ".join("null" if c is None else str(c) for c in self.choices())
        else:
            text = {"int": "an integer", "number": "a number", "bool": "true or false"}[self.kind]
            bounds = [f"{op} {_num(v)}" for op, v in ((">=", self.low), (">", self.above), ("<=", self.high),
                                                       ("<", self.below)) if v is not None]
            text += (" " + " and ".join(bounds)) if bounds else ""
        text += " or null" if self.null and self.kind != "choice" else ""
        return text + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null or (self.kind == "choice" and None in self.choices())
        if self.kind == "choice":
            return value in self.choices()
        if self.kind == "bool":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return ((self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and (self.high is None or value <= self.high) and (self.below is None or value < self.below))


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _vocabulary(module: str, name: str) -> Callable[[], Sequence[Any]]:
    def read():
        from importlib import import_module

        values = getattr(import_module(module), name)
        return tuple(sorted(values)) if isinstance(values, dict) else tuple(values)
    return read


POSITIVE_INT, COUNT = Rule("int", low=1), Rule("int", low=0)
FRACTION = Rule("number", above=0, below=1)
SCHEMA: Dict[str, Rule] = {
    "seed": Rule("int"), "compile": Rule("bool"),
    "context": POSITIVE_INT,
    # the model (linrope.model.ModelConfig) and its attention and position scheme
    "model.vocab_size": POSITIVE_INT, "model.d_model": POSITIVE_INT, "model.n_layers": POSITIVE_INT,
    "model.n_heads": POSITIVE_INT, "model.d_ff": POSITIVE_INT, "model.max_len": POSITIVE_INT,
    "model.dropout": Rule("number", low=0, below=1),
    "model.causal": Rule("bool"), "model.tie_weights": Rule("bool"),
    "model.n_classes": Rule("int", low=2, null=True),
    "model.attention.kind": Rule("choice", choices=_vocabulary("linrope.attention", "ATTENTION")),
    "model.attention.feature_map": Rule("choice", choices=_vocabulary("linrope.ops", "FEATURE_MAPS")),
    "model.attention.placement": Rule("choice", choices=_vocabulary("linrope.ops", "PLACEMENTS")),
    "model.attention.impl": Rule("choice", choices=_vocabulary("linrope.ops", "IMPLS")),
    "model.attention.chunk_size": POSITIVE_INT,
    "model.attention.eps": Rule("number", above=0),
    "model.position.name": Rule("choice", choices=_vocabulary("linrope.positions", "REGISTRY")),
    "model.position.scaling": Rule("choice", choices=_vocabulary("linrope.rope", "SCALINGS")),
    "model.position.factor": Rule("number", above=0),
    "model.position.base": Rule("number", above=0),
    "model.position.table": Rule("choice", choices=_vocabulary("linrope.positions.multiplicative", "TABLES")),
    "model.position.variant": Rule("choice", choices=_vocabulary("linrope.positions.shaw", "VARIANTS")),
    "model.position.k": POSITIVE_INT, "model.position.num_buckets": POSITIVE_INT,
    "model.position.max_distance": POSITIVE_INT, "model.position.hidden": POSITIVE_INT,
    "model.position.init_std": Rule("number", low=0, null=True),
    # the data (every data module takes these; a task's own options are checked by the task)
    "data.context": POSITIVE_INT, "data.eval_context": Rule("int", low=1, null=True),
    "data.batch_size": POSITIVE_INT, "data.eval_batch_size": POSITIVE_INT,
    "data.val_windows": POSITIVE_INT, "data.test_windows": POSITIVE_INT,
    "data.val_fraction": FRACTION, "data.test_fraction": FRACTION,
    "data.max_bytes": Rule("int", low=1, null=True), "data.num_workers": COUNT,
    # optimisation and the Trainer
    "optim.lr": Rule("number", above=0), "optim.weight_decay": Rule("number", low=0),
    "optim.warmup_steps": COUNT, "optim.min_lr_ratio": Rule("number", low=0, high=1),
    "optim.schedule_steps": Rule("int", low=1, null=True, note="null: trainer.max_steps"),
    "trainer.max_steps": Rule("int", low=-1, note="-1: no limit"),
    "trainer.max_epochs": Rule("int", low=-1, null=True, note="-1: no limit"),
    "trainer.log_every_n_steps": POSITIVE_INT, "trainer.accumulate_grad_batches": POSITIVE_INT,
    "trainer.gradient_clip_val": Rule("number", low=0, null=True),
    "callbacks.last_checkpoint.every_n_train_steps": Rule("int", low=1, null=True,
                                                          note="null: only after validation and at the end"),
}


def schema_errors(cfg) -> List[str]:
    """One line per value of ``SCHEMA`` that has the wrong type or lies out of range.  A value that is an
    interpolation (``data.context: ${context}``) is reported where it is set, not again where it is used."""

    errors = []
    for key, rule in SCHEMA.items():
        parent, _, leaf = key.rpartition(".")
        node = _get(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node or OmegaConf.is_interpolation(node, leaf):
            continue
        value = node[leaf]
        if not rule.accepts(value):
            shown = "null" if value is None else value
            errors.append(f"{key}={shown}: expected {rule.expectation()}")
    betas = _get(cfg, "optim.betas")
    if betas is not None and not (len(betas) == 2 and all(FRACTION.accepts(b) or b == 0 for b in betas)):
        errors.append(f"optim.betas={list(betas)}: expected two numbers in [0, 1)")
    return errors


def model_errors(model) -> List[str]:
    """What no single value shows: pairings, divisibility, RoPE's even head dimension."""
    from linrope.positions import IncompatiblePairing, check_pairing

    errors = []
    att = _get(model, "attention.kind")
    pos = _get(model, "position.name")
    try:
        check_pairing(att, pos)
    except IncompatiblePairing as e:
        errors.append(str(e))
    d, h = int(_get(model, "d_model", 0)), int(_get(model, "n_heads", 1))
    if d % h:
        errors.append(f"model.d_model={d} is not divisible by model.n_heads={h}")
    elif pos == "rope" and (d // h) % 2:
        errors.append(f"position=rope needs an even head dimension, but d_model/n_heads = {d}/{h} = {d // h}")
    elif not errors:
        errors += position_option_errors(model, pos, d, h)
    return errors


def position_option_errors(model, pos: str, d: int, h: int) -> List[str]:
    """The scheme's options (model.position.*), checked by the scheme itself before anything is built."""
    from linrope.positions import check_options

    spec = model.position
    options = {k: v for k, v in plain(spec).items() if k != "name"}
    try:
        check_options(pos, d_model=d, n_heads=h, head_dim=d // h, max_len=int(_get(model, "max_len", 256)),
                      causal=bool(_get(model, "causal", True)), **options)
    except ValueError as e:
        return [f"model.position: {e}"]
    return []


def table_errors(cfg) -> List[str]:
    """A byte-level window longer than a table of ``model.max_len`` positions (learned, tupe, multiplicative
    with ``table=learned``); the tasks size ``max_len`` themselves."""
    pos = _get(cfg, "model.position.name")
    table = pos in ("learned", "tupe") or (pos == "multiplicative" and _get(cfg, "model.position.table") == "learned")
    max_len = _get(cfg, "model.max_len")
    if not table or max_len is None or _get(cfg, "data.task", "bytes") != "bytes":
        return []
    return [f"{key}={n} is longer than the {pos} position table (model.max_len={max_len}); raise model.max_len"
            for key in ("data.context", "data.eval_context") for n in [_get(cfg, key)] if n is not None and n > max_len]


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming every problem found (one per line): first the values ``SCHEMA`` refuses,
    then (when every value is sound) what depends on several values, the corpus, the Trainer and
    ``ckpt_path``."""
    errors = schema_errors(cfg)
    if errors:
        raise ConfigError("\n".join(errors))
    errors = model_errors(cfg.model) + table_errors(cfg)
    errors += data_errors(cfg) + trainer_errors(cfg)
    try:
        checkpoint_path(cfg)
    except ConfigError as e:
        errors.append(str(e))
    if errors:
        raise ConfigError("\n".join(errors))


def data_errors(cfg) -> List[str]:
    """A corpus path that does not exist, or a single-file corpus too short for one window per split
    (a folder is measured when it is read: CorpusError)."""
    from linrope.data.bytes import position_split

    path = _get(cfg, "data.path")
    if not path:
        return []
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        return [f"data.path {path}: does not exist"]
    if not p.is_file() and not p.is_dir():
        return [f"data.path {path}: is not a regular file or a folder (a FIFO, socket or device)"]
    target = str(_get(cfg, "data._target_", ""))
    if not p.is_file() or not target.endswith("ByteDataModule"):
        return []
    context = max(int(_get(cfg, "data.context", 0) or 0), int(_get(cfg, "data.eval_context", 0) or 0))
    n = p.stat().st_size
    if _get(cfg, "data.max_bytes"):
        n = min(n, int(_get(cfg, "data.max_bytes")))
    vf, tf = float(_get(cfg, "data.val_fraction", 0.05)), float(_get(cfg, "data.test_fraction", 0.05))
    a, b = position_split(n, vf, tf)
    sizes = {"train": a, "val": b - a, "test": n - b}
    short = [f"{s} {k} bytes" for s, k in sizes.items() if k < context + 1]
    if short:
        return [f"data.path {path}: too short — {n} bytes split into {', '.join(short)}, but one context window "
                f"needs {context + 1}; use a larger corpus or a smaller context"]
    return []


PRECISIONS = ("64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "transformer-engine",
              "transformer-engine-float16", "64", "32", "16", "bf16")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
COMMON_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "deepspeed", "single_device")


def trainer_errors(cfg) -> List[str]:
    errors = []
    accel = str(_get(cfg, "trainer.accelerator", "cpu") or "cpu")
    devices = _get(cfg, "trainer.devices")
    n = _device_count(devices)
    if n is not None and n > 0:
        available = _available_devices(accel)
        if available is not None and n > available:
            kind = _resolved_accelerator(accel)
            errors.append(f"trainer.devices={devices} but only {available} {kind} device(s) are available")
    elif devices is not None and n is None and str(devices) not in ("auto", "-1"):
        errors.append(f"trainer.devices={devices!r}: expected a count, a list of device ids, -1 or auto")
    precision = _get(cfg, "trainer.precision")
    if precision is not None and str(precision) not in PRECISIONS:
        errors.append(f"trainer.precision={precision}: expected one of {', '.join(PRECISIONS[:6])}")
    elif str(precision) in ("16-mixed", "16") and _resolved_accelerator(accel) == "cpu":
        errors.append(f"trainer.precision={precision} (float16 mixed precision) does not run on CPU: "
                      f"use trainer.precision=bf16-mixed")
    if accel not in ACCELERATORS:
        errors.append(f"trainer.accelerator={accel}: expected one of {', '.join(ACCELERATORS)}")
    strategy = _get(cfg, "trainer.strategy", "auto") or "auto"
    strategy = strategy if isinstance(strategy, str) else "custom"  # a _target_ node: Lightning checks it
    if strategy not in COMMON_STRATEGIES + ("custom",):
        from lightning.pytorch.strategies import StrategyRegistry

        known = StrategyRegistry.available_strategies()
        if strategy not in known:
            errors.append(f"trainer.strategy={strategy}: unknown; e.g. {', '.join(COMMON_STRATEGIES)} "
                          f"(all: lightning.pytorch.strategies.StrategyRegistry)")
    if strategy == "ddp" and (n is None or n > 1) and sweep_dir() is not None and not _processes_started_externally():
        errors.append("trainer.strategy=ddp in a sweep (-m): Lightning starts the other processes by running "
                      "train.py again, which would run the whole sweep in each; use trainer=ddp_spawn in sweeps")
    return errors


def _device_count(devices) -> Optional[int]:
    if devices is None:
        return None
    if isinstance(devices, (list, tuple, ListConfig)):
        return len(devices)
    text = str(devices).strip()
    if "," in text:  # "0,1": device ids
        return len([d for d in text.split(",") if d.strip()])
    try:
        return int(text)
    except ValueError:
        return None


def _resolved_accelerator(accelerator: str) -> str:
    if accelerator == "auto":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "gpu" if accelerator == "cuda" else accelerator


def sweep_dir() -> Optional[str]:
    """The sweep folder of a job of ``-m`` (None for a single run, or without a Hydra run: tests compose
    configs directly)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return str(HydraConfig.get().sweep.dir)
    except Exception:  # noqa: BLE001 - no Hydra run
        pass
    return None


def _processes_started_externally() -> bool:
    """SLURM (srun) or torchrun start one process per device themselves; Lightning then starts none."""
    return int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def checkpoint_path(cfg) -> Optional[str]:
    """``ckpt_path`` resolved: a file (must be a whole checkpoint), ``last`` (this run folder's last.ckpt,
    which must exist) or ``auto`` (last.ckpt if it exists, else None: start afresh).  ConfigError otherwise."""
    ckpt = _get(cfg, "ckpt_path")
    if not ckpt:
        return None
    ckpt = str(ckpt)
    if ckpt in ("last", "auto"):
        try:
            folder = _get(cfg, "callbacks.last_checkpoint.dirpath") or Path(str(cfg.paths.output_dir)) / "checkpoints"
            name = _get(cfg, "callbacks.last_checkpoint.filename") or "last.ckpt"
        except Exception:  # noqa: BLE001 - the run folder is not known (no Hydra run)
            return None
        last = Path(str(folder)) / str(name)
        if not last.exists() and not last.is_symlink():
            if ckpt == "auto":
                return None
            raise ConfigError(f"ckpt_path=last: no {last} (pass hydra.run.dir=<the run's folder> to resume a run, "
                              f"or ckpt_path=auto to start afresh when there is none)")
        path = last
    else:
        path = Path(os.path.expanduser(ckpt))
    from linrope.atomic import file_problem  # torch, imported only when a checkpoint is given

    problem = file_problem(path) or _checkpoint_content_problem(path, _get(cfg, "model"))
    if problem:
        raise ConfigError(f"ckpt_path={ckpt}: {path} {problem}" if ckpt in ("last", "auto") else f"ckpt_path={ckpt}: {problem}")
    return str(path)


def _checkpoint_content_problem(path: Path, model) -> Optional[str]:
    """A whole zip that is no Lightning checkpoint, or one of another model (``linrope.identity``).  The file
    is memory-mapped with ``weights_only=True``: nothing is executed and no tensor data is read."""
    import torch

    from linrope.identity import (
        checkpoint_identity,
        identity_differences,
        model_identity,
    )

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - torch's errors for a zip that is no torch file, or an unsafe pickle
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"is not a torch checkpoint that loads with weights_only=True ({first[:200]})"
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        what = type(ckpt).__name__ if not isinstance(ckpt, dict) else "a dict without state_dict"
        return f"is not a Lightning checkpoint (it holds {what}, not a dict with a state_dict)"
    if model is None:
        return None
    diff = identity_differences(checkpoint_identity(ckpt), model_identity(plain(model)))
    return f"is a checkpoint of another model: {diff}" if diff else None


def _available_devices(accelerator: str):
    accelerator = _resolved_accelerator(accelerator)
    if accelerator == "gpu":
        import torch

        return torch.cuda.device_count()
    if accelerator == "cpu":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            return os.cpu_count() or 1
    return None
