"""How far a run's learned position parameters moved from their initialisation, and how many parameters the
model has: written into the run folder for ``linrope report`` (docs/methods.md#evidence-how-the-studies-measure).

``PositionMovement`` (a callback of conf/callbacks/default.yaml) saves the position parameters as they are
when training starts at step 0 (``<run>/position_init.pt``, tensors only, read back with
``weights_only=True``; a resumed run finds it there), and when training ends writes
``<run>/parameters.json``::

    {"n_params": 428544,
     "position": {"pos_shared.bias": {"shape": [32, 2], "init_min": …, "init_max": …, "min": …, "max": …,
                                      "init_norm": …, "norm": …, "change_norm": …, "change_max": …}}}

(norms are Frobenius norms; ``change_*`` of the difference from the initial values; ``init_*`` and
``change_*`` are null when the initial values are unknown, e.g. a run resumed in another folder).
The two pure functions under it, ``position_parameters`` and ``movement``, need no Trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import lightning as L
import torch
from torch import nn

from linrope.base.atomic import atomic_torch_save
from linrope.positions import PositionScheme

INIT_FILE = "position_init.pt"
RECORD_FILE = "parameters.json"


def position_parameters(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Name -> trainable parameter of every position scheme in ``model`` (shared ones once)."""
    inside = {id(p) for m in model.modules() if isinstance(m, PositionScheme) for p in m.parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) in inside and p.requires_grad}


def movement(
    final: Mapping[str, torch.Tensor], init: Optional[Mapping[str, torch.Tensor]] = None
) -> Dict[str, Dict[str, Any]]:
    """Per parameter: its shape, range and norm now and at ``init`` (when known), and the norm and the
    largest entry of its change, in float64."""
    out = {}
    for name, p in final.items():
        x = p.detach().double().cpu()
        rec: Dict[str, Any] = {
            "shape": list(x.shape),
            "min": x.min().item(),
            "max": x.max().item(),
            "norm": x.norm().item(),
            "init_min": None,
            "init_max": None,
            "init_norm": None,
            "change_norm": None,
            "change_max": None,
        }
        x0 = None if init is None else init.get(name)
        if x0 is not None and tuple(x0.shape) == tuple(x.shape):
            x0 = x0.detach().double().cpu()
            d = x - x0
            rec.update(
                init_min=x0.min().item(),
                init_max=x0.max().item(),
                init_norm=x0.norm().item(),
                change_norm=d.norm().item(),
                change_max=d.abs().max().item(),
            )
        out[name] = rec
    return out


class PositionMovement(L.Callback):
    """Records the position parameters at step 0 and writes ``parameters.json`` at the end of training."""

    def __init__(self, dirpath: str):
        self.dirpath = Path(dirpath)
        self._init: Optional[Dict[str, torch.Tensor]] = None

    def on_train_start(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        model = getattr(pl_module, "model", pl_module)
        path = self.dirpath / INIT_FILE
        if trainer.global_step == 0:
            self._init = {n: p.detach().cpu().clone() for n, p in position_parameters(model).items()}
            if trainer.is_global_zero and self._init:
                self.dirpath.mkdir(parents=True, exist_ok=True)
                atomic_torch_save(self._init, path)
        elif os.path.isfile(path):  # resumed: the run's own initial values, saved when it started
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            self._init = dict(loaded) if isinstance(loaded, dict) else None

    def on_train_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        if not trainer.is_global_zero:
            return
        model = getattr(pl_module, "model", pl_module)
        record = {
            "n_params": sum(p.numel() for p in model.parameters()),
            "step": trainer.global_step,
            "position": movement(position_parameters(model), self._init),
        }
        self.dirpath.mkdir(parents=True, exist_ok=True)
        tmp = self.dirpath / f".{RECORD_FILE}.{os.getpid()}.partial"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, self.dirpath / RECORD_FILE)
