"""Checks on a composed config, made before any data is read or model built: one line per problem
(``ConfigError``), which train.py prints before it exits.  Each component's own declaration
(``linrope.base.options``) checks its options; what depends on several values, the corpus, the Trainer and
the checkpoint is checked here.  ``check_command_line`` (linrope.config.command_line) runs earlier, before Hydra."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from linrope.base.atomic import file_problem
from linrope.base.errors import ConfigError, UnknownOption
from linrope.base.naming import LANGUAGE_TASKS
from linrope.base.nested import get
from linrope.base.options import declared, option_errors, value_errors
from linrope.config.settings import (
    LINROPE_TRAINER_KEYS,
    LastCheckpointSettings,
    PlanSettings,
    TrainerSettings,
    TrainExtrapolation,
    TrainSettings,
)


def plain(node) -> Dict[str, Any]:
    """A config node (DictConfig, resolved, or any mapping) as a plain dict."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def settings_errors(cfg) -> List[str]:
    """What linrope's own declarations refuse, without torch: a key of the top level, of ``extrapolation.``,
    ``plan.`` or ``optim.`` that none takes (naming the nearest), else a value of those, of the Trainer keys linrope reads
    and of the last checkpoint's interval that has the wrong type or lies out of range."""
    from linrope.models.optim import option_errors as optim_errors  # light: no torch

    errors = option_errors(declared(TrainSettings), cfg)
    sections = [
        (TrainExtrapolation, "extrapolation", True),
        (PlanSettings, "plan", True),
        (TrainerSettings, "trainer", False),
        (LastCheckpointSettings, "callbacks.last_checkpoint", False),
    ]
    for declaration, where, all_keys in sections:
        node = get(cfg, where)
        if isinstance(node, DictConfig):
            check = option_errors if all_keys else value_errors
            errors += check(declared(declaration), node, where)
    return errors + (optim_errors(cfg.optim) if isinstance(get(cfg, "optim"), DictConfig) else [])


def task_model(cfg) -> Dict[str, Any]:
    """``cfg.model`` as the task makes it (what ``linrope.training.builders.build_module`` builds): the task name,
    and for the synthetic tasks ``vocab_size`` / ``causal`` / ``n_classes`` / the longest position, which a learned
    table must cover (``model_overrides_for`` of the data module class, asked before any data is made)."""
    import hydra  # the data module's class, by its _target_

    model = plain(cfg.model)
    overrides: Dict[str, Any] = {"task": cfg.data.get("task", "bytes")}
    target = cfg.data.get("_target_")
    ask = getattr(hydra.utils.get_class(target) if target else None, "model_overrides_for", None)
    if ask is not None:
        overrides.update(ask(plain(cfg.data)))
    if "max_len" in overrides:  # a learned table covers the longest sequence the task evaluates
        overrides["max_len"] = max(int(model.get("max_len") or 0), int(overrides["max_len"]))
    return {**model, **overrides}


def task_model_errors(cfg) -> List[str]:
    """What the model refuses as the task makes it (``task_model``: ListOps makes it bidirectional, and T5's buckets
    or xPos's blockwise attention depend on that), where the task changes more than its name; a task whose values
    cannot work is ``data_errors``' to name."""
    if not isinstance(get(cfg, "data"), DictConfig):
        return []
    try:
        made = task_model(cfg)
    except (ValueError, TypeError, KeyError):  # the task's own values: data_errors names them
        return []
    model = plain(cfg.model)
    if all(model.get(k) == v for k, v in made.items() if k != "task"):
        return []
    return model_errors(made)


def model_errors(model) -> List[str]:
    """What the model's components refuse: unknown options (each component checks its own), values, the
    pairing, divisibility, RoPE's even head dimension (``linrope.models.spec.ModelConfig.problems``)."""
    from linrope.models.spec import ModelConfig  # torch: imported only once the values are sound

    try:
        return ModelConfig.from_dict(plain(model)).problems()
    except UnknownOption as e:
        return [str(e)]


def trainer_option_errors(target: Optional[str], keys: List[str]) -> List[str]:
    """Keys of ``trainer`` that Lightning's Trainer does not take (its constructor says which it takes)."""
    if target not in ("lightning.pytorch.Trainer", "lightning.Trainer"):
        return []
    import inspect

    from lightning.pytorch import Trainer  # imported by data_option_errors already

    known = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self"] + ["_target_"]
    known += list(LINROPE_TRAINER_KEYS)
    return [str(UnknownOption(f"trainer.{k}", known)) for k in keys if k not in known]


def data_option_errors(data) -> List[str]:
    """What linrope's data module for ``data._target_`` refuses (its constructor is its declaration): a key
    it does not take, naming the nearest, else a value; another module's keys are left to it.  Values that
    are interpolations (``${context}``, ``${hydra:...}``) are checked where they are set."""
    from linrope.data.rebuild import data_options

    cls = data_module_class(data)
    return [] if cls is None else option_errors(data_options(cls), data, "data", also=("_target_", "task"))


def data_module_class(data) -> Optional[type]:
    """linrope's data module that ``data._target_`` names, or None (another module's)."""
    from linrope.data.rebuild import DATA_MODULES, class_path  # Lightning, ~4 s

    return next((c for c in DATA_MODULES.values() if class_path(c) == get(data, "_target_")), None)


def text_errors(cfg) -> List[str]:
    """data=text: its source (a path, folder or glob that holds files to read, or an HF dataset), its tokenizer
    (bytes, a tokenizer.json, an HF name: loaded, so an unknown one is named now) and ``data.vocab_size`` against
    the tokenizer's, before any shard is written."""
    from linrope.base.errors import CorpusError
    from linrope.data.sources import resolve_source
    from linrope.data.text import check_vocab
    from linrope.data.tokenizer import load_tokenizer

    data = get(cfg, "data")
    try:
        resolve_source(get(data, "path"), field=get(data, "field", "text"), suffixes=get(data, "suffixes"),
                       hf_dataset=get(data, "hf_dataset"), hf_config=get(data, "hf_config"),
                       hf_split=get(data, "hf_split", "train"))  # fmt: skip
        tokenizer = load_tokenizer(get(data, "tokenizer"))
        check_vocab(tokenizer.vocab_size, get(data, "vocab_size"), get(data, "tokenizer"))
    except CorpusError as e:
        return [str(e)]
    return []


def table_errors(cfg) -> List[str]:
    """A byte-level window longer than a scheme's table of ``model.max_len`` positions (the trait
    ``bounded_by_max_len``: learned, tupe, multiplicative with ``table=learned``); the tasks size ``max_len``
    themselves."""
    from linrope.positions import REGISTRY, scheme_settings  # torch: imported by model_errors already

    position, max_len = get(cfg, "model.position"), get(cfg, "model.max_len")
    pos = get(position, "name")
    if pos not in REGISTRY or max_len is None or get(cfg, "data.task", "bytes") not in LANGUAGE_TASKS:
        return []
    if not REGISTRY[pos].bounded_by_max_len(
        scheme_settings(pos, {k: v for k, v in plain(position).items() if k != "name"})
    ):
        return []
    return [
        f"{key}={n} is longer than the {pos} position table (model.max_len={max_len}); raise model.max_len"
        for key in ("data.context", "data.eval_context")
        for n in [get(cfg, key)]
        if n is not None and n > max_len
    ]


def validate(cfg: DictConfig, hardware: bool = True, sweep: Optional[bool] = None) -> None:
    """Raise ConfigError naming every problem found (one per line): first what linrope's own settings refuse
    (``settings_errors``, no torch); then what each component refuses (an option it does not take, naming the
    nearest it does; its own values; the model's pairing and dimensions); then (when those are sound) what
    depends on several values, the corpus, the Trainer and ``ckpt_path``.  ``hardware=False`` (the dry run of
    a sweep, linrope sweeps, on a login node) checks the config alone: whether this machine has the devices
    asked for, and what ``accelerator: auto`` would pick here, are the launch's business.  ``sweep``: whether the
    config is a job of a sweep (None: a job of the running ``-m``, ``sweep_dir``; the dry run says True)."""
    errors = settings_errors(cfg)
    if errors:
        raise ConfigError("\n".join(errors))
    errors = model_errors(cfg.model)
    errors += data_option_errors(cfg.data) if isinstance(get(cfg, "data"), DictConfig) else []
    if isinstance(get(cfg, "trainer"), DictConfig):
        errors += trainer_option_errors(get(cfg, "trainer._target_"), list(cfg.trainer))
    if errors:
        raise ConfigError("\n".join(errors))
    errors = table_errors(cfg) + task_model_errors(cfg)
    errors += data_errors(cfg) + trainer_errors(cfg, hardware, sweep) + impl_errors(cfg, hardware)
    try:
        checkpoint_path(cfg)
    except ConfigError as e:
        errors.append(str(e))
    if errors:
        raise ConfigError("\n".join(errors))


def impl_errors(cfg, hardware: bool = True) -> List[str]:
    """``model.attention.impl=fla`` needs the ``gpu`` extra, a CUDA accelerator and a causal model (without
    ``hardware``, ``accelerator: auto`` may be one)."""
    if get(cfg, "model.attention.kind") != "linear" or get(cfg, "model.attention.impl") != "fla":
        return []
    from linrope.ops.linear_attn.fla_backend import unavailable  # torch: only for this setting

    if not bool(get(cfg, "model.causal", True)):
        return ["model.attention.impl=fla is causal only; use impl=chunk with model.causal=false"]
    accel = accelerator_kind(get(cfg, "trainer.accelerator"), hardware)
    why = unavailable("cuda" if accel in ("gpu", None) else "cpu")
    return [f"model.attention.impl=fla: {why}"] if why else []


def data_errors(cfg) -> List[str]:
    """A corpus path that does not exist, or a single-file corpus too short for one window per split
    (a folder is measured when it is read: CorpusError)."""
    from linrope.data.bytes import position_split

    vf, tf = get(cfg, "data.val_fraction"), get(cfg, "data.test_fraction")
    if vf is not None and tf is not None and float(vf) + float(tf) >= 1:
        return [
            f"data.val_fraction + data.test_fraction = {float(vf) + float(tf):g}: must be below 1 (the train split is the rest)"
        ]
    if str(get(cfg, "data._target_", "")).endswith("TextDataModule"):
        return text_errors(cfg)
    if get(cfg, "data.task") not in (None, "bytes"):
        return task_errors(get(cfg, "data"))
    path = get(cfg, "data.path")
    if not path:
        return []
    from linrope.data.corpora import PREFIX, check

    if str(path).startswith(PREFIX):  # a named corpus: installed, and the text the results were measured on
        why = check(str(path))
        return [why] if why else []
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        return [f"data.path {path}: does not exist"]
    if not p.is_file() and not p.is_dir():
        return [f"data.path {path}: is not a regular file or a folder (a FIFO, socket or device)"]
    target = str(get(cfg, "data._target_", ""))
    if not p.is_file() or not target.endswith("ByteDataModule"):
        return []
    context = max(int(get(cfg, "data.context", 0) or 0), int(get(cfg, "data.eval_context", 0) or 0))
    n = p.stat().st_size
    if get(cfg, "data.max_bytes"):
        n = min(n, int(get(cfg, "data.max_bytes")))
    vf, tf = float(get(cfg, "data.val_fraction", 0.05)), float(get(cfg, "data.test_fraction", 0.05))
    a, b = position_split(n, vf, tf)
    sizes = {"train": a, "val": b - a, "test": n - b}
    short = [f"{s} {k} bytes" for s, k in sizes.items() if k < context + 1]
    if short:
        return [
            f"data.path {path}: too short — {n} bytes split into {', '.join(short)}, but one context window "
            f"needs {context + 1}; use a larger corpus or a smaller context"
        ]
    return []


def task_errors(data) -> List[str]:
    """A synthetic task whose options do not fit together (mqar: more queries than pairs) or that does not fit its
    training or test context: the task's own line (linrope.data.tasks), before any example is drawn."""
    cls = data_module_class(data)
    if cls is None or not hasattr(cls, "build_task"):
        return []
    options = plain(data)
    try:
        task = cls.build_task(options)
        context = int(options["context"])
        for n in (context, context * int(options.get("test_factor") or cls.default_test_factor)):
            task.check_context(n)
    except (ValueError, KeyError) as e:
        return [str(e)]
    return []


PRECISIONS = (
    "64-true",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "transformer-engine",
    "transformer-engine-float16",
    "64",
    "32",
    "16",
    "bf16",
)
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
COMMON_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "deepspeed", "single_device")


def trainer_errors(cfg, hardware: bool = True, sweep: Optional[bool] = None) -> List[str]:
    """The Trainer's accelerator, devices, precision and strategy; with ``hardware``, also whether this
    machine has the devices asked for (``accelerator: auto`` resolved as build_trainer resolves it)."""
    errors = []
    accel = str(get(cfg, "trainer.accelerator", "auto") or "auto")
    kind = accelerator_kind(accel, hardware)  # None: auto, resolved where the run starts
    devices = get(cfg, "trainer.devices")
    n = _device_count(devices)
    available = _available_devices(accel) if hardware else None
    if kind == "gpu" and available == 0:
        errors.append(f"trainer.accelerator={accel}: this machine has no CUDA GPU (torch.cuda.device_count() is 0)")
    elif n is not None and n > 0 and available is not None and n > available:
        errors.append(f"trainer.devices={devices} but only {available} {kind} device(s) are available")
    if devices is not None and n is None and str(devices) not in ("auto", "-1"):
        errors.append(f"trainer.devices={devices!r}: expected a count, a list of device ids, -1 or auto")
    precision = get(cfg, "trainer.precision")
    if precision is not None and str(precision) not in PRECISIONS:
        errors.append(f"trainer.precision={precision}: expected one of {', '.join(PRECISIONS[:6])}")
    elif str(precision) in ("16-mixed", "16") and kind == "cpu":
        errors.append(
            f"trainer.precision={precision} (float16 mixed precision) does not run on CPU: "
            f"use trainer.precision=bf16-mixed"
        )
    if accel not in ACCELERATORS:
        errors.append(f"trainer.accelerator={accel}: expected one of {', '.join(ACCELERATORS)}")
    node = get(cfg, "trainer.strategy", "auto") or "auto"
    strategy = strategy_name(node)  # a _target_ node: its class's name (FSDPStrategy: fsdp); Lightning checks it
    if isinstance(node, str) and strategy not in COMMON_STRATEGIES:
        from lightning.pytorch.strategies import StrategyRegistry

        known = StrategyRegistry.available_strategies()
        if strategy not in known:
            errors.append(
                f"trainer.strategy={strategy}: unknown; e.g. {', '.join(COMMON_STRATEGIES)} "
                f"(all: lightning.pytorch.strategies.StrategyRegistry)"
            )
    sweep = sweep_dir() is not None if sweep is None else sweep
    if sweep and relaunches(strategy, n, kind, available) and not _processes_started_externally():
        errors.append(
            f"trainer.strategy={strategy} in a sweep (-m): Lightning starts the other processes by "
            "running train.py again, which would run the whole sweep in each; use trainer=ddp_spawn in "
            "sweeps, or a launcher that starts them (hydra/launcher=submitit_slurm)"
        )
    return errors + fsdp_errors(strategy, node, kind)


def relaunches(strategy: str, n: Optional[int], kind: Optional[str], available: Optional[int]) -> bool:
    """Whether Lightning starts the other processes of ``strategy`` on ``n`` devices (None: auto or -1, all of the
    ``available``) by running the script again (its ``_SubprocessScriptLauncher``): ddp and its
    ``ddp_find_unused_parameters_*``, fsdp and deepspeed on more than one device, and ``auto`` on more than one
    (Lightning's auto is ddp there); not ``ddp_spawn``, ``ddp_fork`` or ``ddp_notebook`` (multiprocessing)."""
    if strategy.startswith(("ddp_spawn", "ddp_fork", "ddp_notebook")):
        return False
    n = None if n is not None and n < 0 else n  # -1: every device
    if strategy.startswith(("ddp", "fsdp", "deepspeed")):
        return n is None or n > 1
    if strategy == "auto":
        count = n if n is not None else (available if kind == "gpu" else 1)  # auto devices: every GPU, one CPU
        return count is not None and count > 1  # unknown (a dry run): left to the job, which knows
    return False


def strategy_name(strategy) -> str:
    """A strategy's name: the string given (``ddp``), or for a ``_target_`` node its class's name without
    ``Strategy``, lower case (``lightning.pytorch.strategies.FSDPStrategy``: ``fsdp``)."""
    if strategy is None:
        return "auto"
    if isinstance(strategy, str):
        return strategy
    target = str(get(strategy, "_target_", "") or "").rpartition(".")[2]
    return target.removesuffix("Strategy").lower() or "custom"


def sharded_checkpoints(strategy) -> bool:
    """Whether ``strategy`` writes a checkpoint as a folder of shards instead of one file (deepspeed; FSDP
    with ``state_dict_type: sharded``): Lightning then bypasses the Trainer's CheckpointIO."""
    name = strategy_name(strategy)
    return name.startswith("deepspeed") or (
        name.startswith("fsdp") and not isinstance(strategy, str) and get(strategy, "state_dict_type") == "sharded"
    )


def fsdp_errors(name: str, node, kind: Optional[str]) -> List[str]:
    """FSDP runs on GPUs only (Lightning refuses it on a CPU), and its checkpoints must be whole files:
    resuming (ckpt_path), evaluate, generate and the reports read one file."""
    if not name.startswith("fsdp"):
        return []
    errors = []
    if kind is not None and kind != "gpu":
        errors.append(
            f"trainer.strategy=fsdp needs GPUs (trainer.accelerator=gpu), not {kind}: Lightning's FSDP "
            f"does not run on a CPU; several CPU processes: trainer=ddp_spawn trainer.accelerator=cpu"
        )
    if sharded_checkpoints(node):
        errors.append(
            "trainer.strategy.state_dict_type=sharded: linrope resumes, evaluates and reports from "
            "single-file checkpoints; use state_dict_type=full (rank 0 gathers the weights)"
        )
    return errors


def _device_count(devices) -> Optional[int]:
    if isinstance(devices, (list, tuple, ListConfig)):
        return len(devices)
    text = str(devices).strip()
    if "," in text:  # "0,1": device ids
        return len([d for d in text.split(",") if d.strip()])
    try:
        return int(text)  # None: "None", no count
    except ValueError:
        return None


def resolved_accelerator(accelerator: str) -> str:
    """What linrope runs on for ``trainer.accelerator``: ``auto`` is a CUDA GPU when this process sees one,
    else the CPU (linrope.training.builders.build_trainer passes that to Lightning, whose own ``auto`` would pick
    Apple's MPS on a Mac: MPS, which has no float64, runs only when asked, ``trainer.accelerator=mps``);
    ``cuda`` is ``gpu``; anything else is itself."""
    if accelerator == "auto":
        import torch  # only for auto: the checks of an explicit accelerator stay light

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "gpu" if accelerator == "cuda" else accelerator


def accelerator_kind(accelerator, hardware: bool = True) -> Optional[str]:
    """``resolved_accelerator``, or None for ``auto`` without ``hardware`` (a dry run on another machine than
    the one the run starts on)."""
    accelerator = str(accelerator or "auto")
    return None if accelerator == "auto" and not hardware else resolved_accelerator(accelerator)


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
    ckpt = get(cfg, "ckpt_path")
    if not ckpt:
        return None
    ckpt = str(ckpt)
    if ckpt in ("last", "auto"):
        try:
            folder = get(cfg, "callbacks.last_checkpoint.dirpath") or Path(str(cfg.paths.output_dir)) / "checkpoints"
            name = get(cfg, "callbacks.last_checkpoint.filename") or "last.ckpt"
        except Exception:  # noqa: BLE001 - the run folder is not known (no Hydra run)
            return None
        last = Path(str(folder)) / str(name)
        if not last.exists() and not last.is_symlink():
            if ckpt == "auto":
                return None
            raise ConfigError(
                f"ckpt_path=last: no {last} (pass hydra.run.dir=<the run's folder> to resume a run, "
                f"or ckpt_path=auto to start afresh when there is none)"
            )
        path = last
    else:
        path = Path(os.path.expanduser(ckpt))
    problem = file_problem(path) or _checkpoint_content_problem(path, get(cfg, "model"))
    if problem:
        raise ConfigError(
            f"ckpt_path={ckpt}: {path} {problem}" if ckpt in ("last", "auto") else f"ckpt_path={ckpt}: {problem}"
        )
    return str(path)


def _checkpoint_content_problem(path: Path, model) -> Optional[str]:
    """A whole zip that is no Lightning checkpoint, or one of another model (``linrope.models.spec``).  The file
    is memory-mapped with ``weights_only=True``: nothing is executed and no tensor data is read."""
    import torch

    from linrope.models.spec import checkpoint_identity, identity_differences, model_identity

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
    accelerator = resolved_accelerator(accelerator)
    if accelerator == "gpu":
        import torch

        return torch.cuda.device_count()
    if accelerator == "cpu":  # sched_getaffinity: Linux only
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return None
