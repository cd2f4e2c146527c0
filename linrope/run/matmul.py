"""``trainer.matmul_precision``: how float32 matrix products run (``torch.set_float32_matmul_precision``; the
values: linrope.config.settings.MATMUL_PRECISIONS).  The setting is process-wide and Lightning has no flag for it:
linrope.training.builders.build_trainer applies it in the process that builds the Trainer, before fit, and
``MatmulPrecision`` (a callback build_callbacks adds) again in every process the Trainer runs in — processes
started by ``ddp_spawn`` are new interpreters that would otherwise keep PyTorch's default."""

from __future__ import annotations

from typing import Optional

import torch
from lightning.pytorch.callbacks import Callback


def apply(precision: Optional[str]) -> None:
    """``torch.set_float32_matmul_precision(precision)``; None: nothing."""
    if precision is not None:
        torch.set_float32_matmul_precision(str(precision))


class MatmulPrecision(Callback):
    """Applies ``precision`` in each process of the run, when the Trainer sets up (fit, validate, test)."""

    def __init__(self, precision: Optional[str]) -> None:
        self.precision = precision

    def setup(self, trainer, pl_module, stage: str) -> None:
        apply(self.precision)
