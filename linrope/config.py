"""Checks on a composed config, made before any data is read or model built.

Each failure is one line that names the problem (``ConfigError``); train.py prints it
and exits without a traceback.  Imports no Lightning (but to look up an unusual
``trainer.strategy`` name), so a bad config fails fast.  ``check_command_line`` runs even
earlier, before Hydra: an unknown option of a config group (``model=nope``) in one line."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Sequence

from omegaconf import DictConfig


class ConfigError(ValueError):
    pass


def _get(cfg, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def model_errors(model) -> List[str]:
    from linrope.positions import IncompatiblePairing, check_pairing, scheme_class

    errors = []
    att = _get(model, "attention.kind")
    pos = _get(model, "position.name")
    if att not in ("softmax", "linear"):
        errors.append(f"model.attention.kind={att!r}: expected softmax or linear")
    try:
        scheme_class(pos)
        if att in ("softmax", "linear"):
            check_pairing(att, pos)
    except IncompatiblePairing as e:
        errors.append(str(e))
    except ValueError as e:
        errors.append(f"model.position.name: {e}")
    d, h = int(_get(model, "d_model", 0)), int(_get(model, "n_heads", 1))
    if h < 1 or d % h:
        errors.append(f"model.d_model={d} is not divisible by model.n_heads={h}")
    elif pos == "rope" and (d // h) % 2:
        errors.append(f"position=rope needs an even head dimension, but d_model/n_heads = {d}/{h} = {d // h}")
    elif not errors:
        errors += position_option_errors(model, pos, d, h)
    if att == "linear":
        cs = _get(model, "attention.chunk_size", 64)
        if cs is None or int(cs) < 1:
            errors.append(f"model.attention.chunk_size={cs}: must be >= 1")
        fm = _get(model, "attention.feature_map", "elu")
        if fm not in ("elu", "cosine"):
            errors.append(f"model.attention.feature_map={fm!r}: expected elu or cosine")
        pl = _get(model, "attention.placement", "numerator")
        if pl not in ("numerator", "both", "none"):
            errors.append(f"model.attention.placement={pl!r}: expected numerator, both or none")
    return errors


def position_option_errors(model, pos: str, d: int, h: int) -> List[str]:
    """The scheme's options (model.position.*), checked by the scheme itself before anything is built."""
    from omegaconf import OmegaConf

    from linrope.positions import check_options

    spec = model.position
    options = {k: v for k, v in (OmegaConf.to_container(spec, resolve=True) if isinstance(spec, DictConfig)
                                 else dict(spec)).items() if k != "name"}
    try:
        check_options(pos, d_model=d, n_heads=h, head_dim=d // h, max_len=int(_get(model, "max_len", 256)),
                      causal=bool(_get(model, "causal", True)), **options)
    except ValueError as e:
        return [f"model.position: {e}"]
    return []


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming every problem found (one per line)."""
    errors = model_errors(cfg.model)
    context = _get(cfg, "data.context")
    max_len = _get(cfg, "model.max_len")
    pos = _get(cfg, "model.position.name")
    if pos in ("learned", "tupe") and context is not None and max_len is not None and int(context) > int(max_len):
        errors.append(f"data.context={context} is longer than the learned position table (model.max_len={max_len})")
    errors += data_errors(cfg) + trainer_errors(cfg) + callback_errors(cfg)
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
    if strategy == "ddp" and (n is None or n > 1) and _in_sweep() and not _processes_started_externally():
        errors.append("trainer.strategy=ddp in a sweep (-m): Lightning starts the other processes by running "
                      "train.py again, which would run the whole sweep in each; use trainer=ddp_spawn in sweeps")
    return errors


def callback_errors(cfg) -> List[str]:
    every = _get(cfg, "callbacks.last_checkpoint.every_n_train_steps")
    if every is not None and int(every) < 1:
        return [f"callbacks.last_checkpoint.every_n_train_steps={every}: must be >= 1 (or null: only after "
                f"validation and at the end)"]
    return []


def _device_count(devices) -> Optional[int]:
    if devices is None:
        return None
    if isinstance(devices, (list, tuple)) or type(devices).__name__ == "ListConfig":
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


def _in_sweep() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - no Hydra run (tests compose configs directly)
        return False


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
    problem = _checkpoint_problem(path)
    if problem:
        raise ConfigError(f"ckpt_path={ckpt}: {path} {problem}" if ckpt in ("last", "auto") else f"ckpt_path={ckpt}: {problem}")
    return str(path)


def _checkpoint_problem(path: Path) -> Optional[str]:
    import zipfile

    if not path.exists():
        return "is a dangling link" if path.is_symlink() else "does not exist"
    if path.is_dir():
        return "is a folder, not a checkpoint file"
    if not zipfile.is_zipfile(path):
        return "is not a complete checkpoint (truncated, or not written by torch.save)"
    return None


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


# ---- the command line, before Hydra composes anything -------------------------------------------------------
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
_FLAGS_WITH_VALUE = {"-c", "--cfg", "-p", "--package", "--info", "-cp", "--config-path", "-cn", "--config-name",
                     "-cd", "--config-dir", "--experimental-rerun"}


def group_options(group: str, conf_dir: Path = CONF_DIR) -> List[str]:
    folder = conf_dir / group
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))


def command_line_errors(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> List[str]:
    """``group=option`` overrides of the config groups in ``conf/`` whose option has no file there.
    Sweeps (``model=a,b``) are checked item by item; values with Hydra functions, globs or
    interpolations, and Hydra's own groups (hydra/...), are left to Hydra."""
    errors: List[str] = []
    args = list(argv)
    if any(a.startswith(("hydra.searchpath", "+hydra.searchpath")) for a in args):
        return errors  # other config folders: Hydra knows more options than conf/ holds
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg.startswith("-"):
            skip_next = arg in _FLAGS_WITH_VALUE
            continue
        if "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~").split("@", 1)[0]
        if not key or key.startswith("hydra") or "." in key or not (conf_dir / key).is_dir():
            continue
        value = value.strip()
        if not value or any(c in value for c in "()[]{}*$'\"\\"):
            continue
        options = group_options(key, conf_dir)
        for item in (v.strip() for v in value.split(",")):
            if item and item not in ("null", "None") and item not in options:
                errors.append(f"{key}={item}: no such option (conf/{key}/{item}.yaml); choose from {', '.join(options)}")
    return errors


def check_command_line(argv: Optional[Sequence[str]] = None, conf_dir: Path = CONF_DIR) -> None:
    """Exit with one line per unknown config-group option on the command line (``model=nope``) — before
    Hydra, whose own message for it is several lines long."""
    import sys

    errors = command_line_errors(sys.argv[1:] if argv is None else argv, conf_dir)
    if errors:
        raise SystemExit("\n".join("linrope: " + e for e in errors))
