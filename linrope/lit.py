"""The LightningModule: next-token cross-entropy, AdamW with linear warm-up and cosine decay,
metrics train/loss, val/loss, val/bpb (bits per byte), test/*, tokens per second."""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

import lightning as L
import torch
import torch.nn.functional as F

from linrope.model import TransformerLM

LN2 = math.log(2.0)


class NonFiniteLoss(RuntimeError):
    pass


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then cosine decay to min_lr_ratio."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LanguageModel(L.LightningModule):
    def __init__(self, model: Dict[str, Any], optim: Optional[Dict[str, Any]] = None):
        super().__init__()
        self.save_hyperparameters()
        self.model = TransformerLM(model)
        self.optim = dict(optim or {})
        self._t_last: Optional[float] = None

    def forward(self, idx, **kwargs):
        return self.model(idx, **kwargs)

    def loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    # ---- training --------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss.item()} at step {self.global_step}: training stopped; the last good "
                                f"checkpoint is kept")
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self._t_last is not None:
            tokens = batch[0].numel() * self.trainer.world_size
            self.log("train/tokens_per_sec", tokens / max(now - self._t_last, 1e-9), prog_bar=True)
        self._t_last = now

    def on_train_epoch_start(self):
        self._t_last = None

    def on_validation_end(self):
        self._t_last = None  # do not count evaluation time as training time

    # ---- evaluation ------------------------------------------------------------------------------
    def _eval(self, batch, stage: str):
        loss = self.loss(batch)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/bpb", loss / LN2, prog_bar=stage == "val", sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        return self._eval(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._eval(batch, "test")

    # ---- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self):
        o = {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.95), "warmup_steps": 30, "min_lr_ratio": 0.1, **self.optim}
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 and "embed" not in name and "table" not in name else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=tuple(o["betas"]))
        total = self.trainer.max_steps if self.trainer and self.trainer.max_steps > 0 else 10_000
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(
            s, warmup_steps=o["warmup_steps"], total_steps=total, min_lr_ratio=o["min_lr_ratio"]))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}
