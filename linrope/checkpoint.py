"""Checkpoints that survive a crash, load with ``weights_only=True`` and say what does not fit.

- ``AtomicCheckpointIO``: the Trainer's CheckpointIO plugin (linrope.training.build_trainer adds it).
  A checkpoint is written atomically (linrope.atomic: a temporary file of the writer's own, fsynced,
  renamed over the old one), so a kill while writing leaves the previous checkpoint whole, and a full
  disk is one ``DiskFull`` line.  Parameters that are not finite are never written.  Loading defaults
  to ``weights_only=True``.
- ``LastCheckpoint``: ``last.ckpt`` every ``every_n_train_steps`` steps, after each validation, at
  the end of training and when SIGTERM or SIGINT stops the run — the file that ``ckpt_path=last``
  (or ``auto``) resumes from.
- ``load_checkpoint``: ``torch.load(weights_only=True)`` with one line for a missing or broken file.
- ``check_state_dict``: one line naming the parameters that do not fit a model (when a run resumes into
  another model config, or a model is loaded: ``LanguageModel.from_checkpoint``); a checkpoint of another
  model whose parameters all fit is refused by ``linrope.spec.check_identity``.

This module is about files: it imports nothing of the model (``linrope.lit`` imports it).
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from linrope.atomic import atomic_torch_save, file_problem
from linrope.errors import CheckpointError, CheckpointMismatch, NonFiniteCheckpoint, first_names


# ---- writing ---------------------------------------------------------------------------------------------
def _is_local(path) -> bool:
    s = str(path)
    return "://" not in s or s.startswith("file://")


def non_finite_keys(state_dict: Mapping[str, Any]) -> List[str]:
    return [k for k, v in state_dict.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes atomically, refuses non-finite parameters and loads weights only."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}")
        bad = non_finite_keys(checkpoint.get("state_dict") or {})
        if bad:
            raise NonFiniteCheckpoint(
                f"parameters are not finite at step {checkpoint.get('global_step', '?')} ({first_names(bad)}): "
                f"{Path(str(path)).name} was not written; the last good checkpoint is kept")
        if not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None):
        return super().load_checkpoint(path, map_location=map_location,
                                       weights_only=True if weights_only is None else weights_only)


# ---- last.ckpt -------------------------------------------------------------------------------------------
class LastCheckpoint(Checkpoint):
    """Keeps ``dirpath/filename`` (``last.ckpt``) up to date for resuming.

    Saved every ``every_n_train_steps`` optimizer steps (None: never on a schedule), after each
    validation during fit, and when training ends.  On a step that validation follows, the save
    waits for the end of validation: Lightning, resuming from a checkpoint written before a
    pending validation, skips that validation."""

    # what linrope.training reads from trainer.checkpoint_callback when this is the only checkpoint callback
    monitor = None
    best_model_path = ""
    best_model_score = None

    def __init__(self, dirpath, filename: str = "last.ckpt", every_n_train_steps: Optional[int] = 50,
                 save_on_validation: bool = True, save_on_train_end: bool = True):
        super().__init__()
        if every_n_train_steps is not None and int(every_n_train_steps) < 1:
            raise ValueError(f"every_n_train_steps={every_n_train_steps}: must be >= 1 (or null for never)")
        self.dirpath, self.filename = str(dirpath), filename
        self.every_n_train_steps = None if every_n_train_steps is None else int(every_n_train_steps)
        self.save_on_validation, self.save_on_train_end = save_on_validation, save_on_train_end
        self.last_model_path = ""
        self.last_saved_step: Optional[int] = None

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, self.filename)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(dirpath=self.dirpath, filename=self.filename)

    def _skip(self, trainer) -> bool:
        return bool(trainer.fast_dev_run) or trainer.sanity_checking or trainer.state.fn != "fit"

    def _save(self, trainer) -> None:
        if trainer.global_step == self.last_saved_step:
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # every rank calls; rank 0 writes it
        self.last_saved_step, self.last_model_path = trainer.global_step, self.path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._agree_on_a_stop(trainer)
        n = self.every_n_train_steps
        if self._skip(trainer) or not n or trainer.global_step % n:
            return
        if self.save_on_validation and _validation_follows(trainer):
            return  # on_validation_end saves this step, after validation
        self._save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.save_on_validation and not self._skip(trainer):
            self._save(trainer)

    def state_dict(self) -> Dict[str, Any]:
        return {"dirpath": self.dirpath, "last_model_path": self.last_model_path}

    # ---- stopped by a signal ---------------------------------------------------------------------------
    # SIGTERM (a scheduler's preemption) and SIGINT (Ctrl+C) only note the signal.  After each training step
    # every process learns whether any of them was signalled (one all-reduce under DDP), and all of them then
    # stop at the end of that same step through Lightning's SIGTERMException.  Lightning's own SIGTERM handler
    # is replaced while training runs: it broadcasts from inside the handler, which hangs every rank when the
    # signal reaches a process other than rank 0 first.  Either way last.ckpt is written before the processes
    # end, and the run says so and exits non-zero.  A second Ctrl+C interrupts at once.
    stopped_by: Optional[str] = None
    _signalled: Optional[str] = None
    _previous: Dict[int, Any] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.stopped_by = self._signalled = None
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return

        def note(signum, frame):
            name = signal.Signals(signum).name
            if name == "SIGINT" and self._signalled == "SIGINT":
                raise KeyboardInterrupt  # pressed twice: stop now
            self._signalled = self._signalled or name

        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, note)

    def _agree_on_a_stop(self, trainer) -> None:
        """After a training step: if any process was signalled, every process stops after this step."""
        code = signal.Signals[self._signalled].value if self._signalled else 0
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([code], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            code = int(flag.item())
        if code:
            self.stopped_by = signal.Signals(code).name
            trainer._signal_connector.received_sigterm = True  # Lightning ends the step, then raises SIGTERMException

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        self._previous = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_handlers()
        if self.save_on_train_end and not self._skip(trainer):
            self._save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Stopped by a signal: last.ckpt now, and the line linrope.training.one_line_errors prints (rank 0)
        with the exit status, 128 + the signal's number, attached to the exception."""
        self._restore_handlers()
        if not isinstance(exception, SIGTERMException):
            return
        self.stopped_by = self.stopped_by or "SIGTERM"
        if not self._skip(trainer):
            self._save(trainer)
            saved = (f"saved {self.path} (step {self.last_saved_step}); resume with ckpt_path=last "
                     f"hydra.run.dir={trainer.default_root_dir}")
        elif self.last_model_path:
            saved = f"the last checkpoint is {self.last_model_path} (step {self.last_saved_step})"
        else:
            saved = "no checkpoint was saved"
        message = f"stopped by {self.stopped_by} at step {trainer.global_step}: {saved}"
        exception.linrope_stop = (message if trainer.is_global_zero else None,
                                  128 + int(getattr(signal, self.stopped_by)))


def _validation_follows(trainer) -> bool:
    """Whether Lightning validates right after the current training batch."""
    if not trainer.enable_validation:
        return False
    try:
        return bool(trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    except Exception:  # noqa: BLE001 - another Lightning's internals: save now (at worst one validation is skipped)
        return False


def last_good_checkpoint(trainer) -> Optional[str]:
    """The newest checkpoint this run wrote (last.ckpt), or None."""
    for cb in getattr(trainer, "checkpoint_callbacks", []) or []:
        if isinstance(cb, LastCheckpoint) and cb.last_model_path and os.path.exists(cb.last_model_path):
            return f"{cb.last_model_path} (step {cb.last_saved_step})"
    return None


# ---- reading ---------------------------------------------------------------------------------------------
def check_complete(path) -> None:
    """One line if ``path`` is missing or not a whole checkpoint (e.g. a half-written file)."""
    problem = file_problem(path)
    if problem:
        raise CheckpointError(f"checkpoint {path}: {problem}")


def _flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(d, Mapping):
        return {prefix.rstrip("."): d}
    out: Dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def config_differences(found: Optional[Mapping], expected: Optional[Mapping], limit: int = 6) -> str:
    """``model.d_model: 64 in the checkpoint, 128 now; …`` for the leaves that differ."""
    if not found or not expected:
        return ""
    a, b = _flatten(found, "model."), _flatten(expected, "model.")
    diffs = [f"{k}: {a.get(k, '(absent)')} in the checkpoint, {b.get(k, '(absent)')} now"
             for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if not diffs:
        return ""
    return "; ".join(diffs[:limit]) + (f"; … {len(diffs) - limit} more" if len(diffs) > limit else "")


def check_state_dict(expected: Mapping[str, Any], found: Mapping[str, Any], *, where: str = "the checkpoint",
                     found_cfg: Optional[Mapping] = None, expected_cfg: Optional[Mapping] = None) -> None:
    """Raise ``CheckpointMismatch`` naming the missing, unexpected and shape-mismatched keys (one line)."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [f"{k} {tuple(found[k].shape)} in the checkpoint, {tuple(v.shape)} in the model"
              for k, v in expected.items() if k in found and hasattr(v, "shape") and hasattr(found[k], "shape")
              and tuple(v.shape) != tuple(found[k].shape)]
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
    raise CheckpointMismatch(f"{where} does not fit the model config: " + "; ".join(parts)
                             + (f" — the model configs differ: {diff}" if diff else ""))


def load_checkpoint(path, map_location: Any = "cpu") -> Dict[str, Any]:
    """``torch.load(path, weights_only=True)``; a missing or broken file is one ``CheckpointError`` line."""
    check_complete(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's unpickling errors are many and long
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path}: cannot be loaded with weights_only=True: {first}") from e
