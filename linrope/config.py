"""Checks on a composed config, made before any data is read or model built.

Each failure is one line that names the problem (``ConfigError``); train.py prints it
and exits without a traceback.  Imports no Lightning, so a bad config fails fast."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List

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


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming every problem found (one per line)."""
    errors = model_errors(cfg.model)
    context = _get(cfg, "data.context")
    max_len = _get(cfg, "model.max_len")
    pos = _get(cfg, "model.position.name")
    if pos in ("learned", "tupe") and context is not None and max_len is not None and int(context) > int(max_len):
        errors.append(f"data.context={context} is longer than the learned position table (model.max_len={max_len})")
    path = _get(cfg, "data.path")
    if path and not Path(os.path.expanduser(str(path))).exists():
        errors.append(f"data.path {path}: does not exist")
    devices = _get(cfg, "trainer.devices")
    accel = _get(cfg, "trainer.accelerator", "cpu")
    if isinstance(devices, int) and devices > 0:
        available = _available_devices(accel)
        if available is not None and devices > available:
            errors.append(f"trainer.devices={devices} but only {available} {accel} device(s) are available")
    if errors:
        raise ConfigError("\n".join(errors))


def _available_devices(accelerator: str):
    if accelerator in ("gpu", "cuda"):
        import torch

        return torch.cuda.device_count()
    if accelerator == "cpu":
        return os.cpu_count() or 1
    return None
