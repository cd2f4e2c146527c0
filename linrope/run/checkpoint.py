"""Checkpoints that survive a crash, load with ``weights_only=True`` and say what does not fit (docs/reliability.md,
"Checkpoints and resuming").

- ``AtomicCheckpointIO``: the Trainer's CheckpointIO plugin (linrope.training.builders.build_trainer adds it): written
  atomically (linrope.base.atomic), a full disk one ``DiskFull`` line, parameters that are not finite never written.
- ``load_checkpoint``: ``torch.load(weights_only=True)`` with one line for a missing or broken file.
- ``check_state_dict``: one line naming the parameters that do not fit a model; a checkpoint of another model whose
  parameters all fit is refused by ``linrope.models.spec.check_identity``.

It imports nothing of the model (``linrope.training.lit`` imports it); when ``last.ckpt`` is written is
linrope.run.last_checkpoint's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from linrope.base.atomic import atomic_torch_save, file_problem
from linrope.base.errors import CheckpointError, CheckpointMismatch, NonFiniteCheckpoint, first_names
from linrope.base.nested import differing, flatten


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes atomically, refuses non-finite parameters and loads weights only."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}")
        state = (checkpoint.get("state_dict") or {}).items()
        bad = [k for k, v in state if isinstance(v, torch.Tensor) and v.is_floating_point() and not v.isfinite().all()]
        if bad:
            raise NonFiniteCheckpoint(
                f"parameters are not finite at step {checkpoint.get('global_step', '?')} ({first_names(bad)}): "
                f"{Path(str(path)).name} was not written; the last good checkpoint is kept"
            )
        if "://" in str(path) and not str(path).startswith("file://"):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None):
        return super().load_checkpoint(
            path, map_location=map_location, weights_only=True if weights_only is None else weights_only
        )


def config_differences(found: Optional[Mapping], expected: Optional[Mapping], limit: int = 6) -> str:
    """``model.d_model: 64 in the checkpoint, 128 now; …`` for the leaves that differ."""
    if not found or not expected:
        return ""
    a, b = flatten(found, "model."), flatten(expected, "model.")
    diffs = [f"{k}: {x} in the checkpoint, {y} now" for k, x, y in differing(a, b, null_is_absent=True)]
    return first_names(diffs, limit, "; ", "; …")


def check_state_dict(
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
    *,
    where: str = "the checkpoint",
    found_cfg: Optional[Mapping] = None,
    expected_cfg: Optional[Mapping] = None,
) -> None:
    """Raise ``CheckpointMismatch`` naming the missing, unexpected and shape-mismatched keys (one line)."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [
        f"{k} {tuple(found[k].shape)} in the checkpoint, {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in found and hasattr(v, "shape") and hasattr(found[k], "shape") and tuple(v.shape) != tuple(found[k].shape)
    ]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key{'s' * (len(missing) > 1)} ({first_names(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key{'s' * (len(unexpected) > 1)} ({first_names(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({first_names(shapes, 3)})")
    diff = config_differences(found_cfg, expected_cfg)
    raise CheckpointMismatch(
        f"{where} does not fit the model config: "
        + "; ".join(parts)
        + (f" — the model configs differ: {diff}" if diff else "")
    )


def load_checkpoint(path, map_location: Any = "cpu") -> Dict[str, Any]:
    """``torch.load(path, weights_only=True)``; a missing, half-written or broken file is one ``CheckpointError``
    line."""
    problem = file_problem(path)
    if problem:
        raise CheckpointError(f"checkpoint {path}: {problem}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's unpickling errors are many and long
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path}: cannot be loaded with weights_only=True: {first}") from e
