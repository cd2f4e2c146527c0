"""``last.ckpt``, the file that ``ckpt_path=last`` (or ``auto``) resumes from (written atomically by
linrope.run.checkpoint.AtomicCheckpointIO, the Trainer's CheckpointIO)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from lightning.pytorch.callbacks import Checkpoint


def validation_follows(trainer) -> bool:
    """Whether Lightning validates right after the current training batch (called from ``on_train_batch_end``).
    Lightning keeps this decision private (``_TrainingEpochLoop._should_check_val_fx``); this is the same rule
    read from public attributes: in a validating epoch, after every ``val_check_batch``-th batch (counted across epochs when ``check_val_every_n_epoch`` is None, else within
    the epoch).  Lightning's third case, a stop requested by early stopping, is not covered: at worst that
    one validation is skipped on a resume.  tests/run/test_run.py compares the two at every step of a fit."""
    if not trainer.enable_validation:
        return False
    every = trainer.check_val_every_n_epoch
    if every is not None and (trainer.current_epoch + 1) % every:
        return False
    loop, n = trainer.fit_loop.epoch_loop, trainer.val_check_batch
    if n == float("inf"):  # an iterable of unknown length: at its end
        return loop.batch_progress.is_last_batch
    return (loop.total_batch_idx if every is None else loop.batch_idx) % n == n - 1


class LastCheckpoint(Checkpoint):
    """Keeps ``dirpath/filename`` (``last.ckpt``) up to date for resuming: saved every ``every_n_train_steps``
    optimizer steps (None: never on a schedule), after each validation during fit, when training ends, and when
    a signal stops the run (linrope.run.signals).  On a step that validation follows, the save waits for the
    end of validation: Lightning, resuming from a checkpoint written before a pending validation, skips it."""

    # what linrope.training.builders reads from trainer.checkpoint_callback when this is the only checkpoint callback
    monitor = None
    best_model_path = ""
    best_model_score = None

    def __init__(
        self,
        dirpath,
        filename: str = "last.ckpt",
        every_n_train_steps: Optional[int] = 50,
        save_on_validation: bool = True,
        save_on_train_end: bool = True,
    ):
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
        """The key of this callback's state in a checkpoint's ``callbacks``: the one Lightning 2.x's
        ``Callback._generate_state_key`` gives, which the checkpoints of earlier linrope versions hold."""
        key = {"dirpath": self.dirpath, "filename": self.filename}
        return f"{type(self).__qualname__}{key!r}"

    def _skip(self, trainer) -> bool:
        return bool(trainer.fast_dev_run) or trainer.sanity_checking or trainer.state.fn != "fit"

    def _save(self, trainer) -> None:
        if trainer.global_step == self.last_saved_step:
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # every rank calls; rank 0 writes it
        self.last_saved_step, self.last_model_path = trainer.global_step, self.path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        if self._skip(trainer) or not n or trainer.global_step % n:
            return
        if self.save_on_validation and validation_follows(trainer):
            return  # on_validation_end saves this step, after validation
        self._save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.save_on_validation and not self._skip(trainer):
            self._save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.save_on_train_end and not self._skip(trainer):
            self._save(trainer)

    def save_on_stop(self, trainer) -> str:
        """Save now (a signal stopped the run, linrope.run.signals); what the user is told about it."""
        if not self._skip(trainer):
            self._save(trainer)
            return (
                f"saved {self.path} (step {self.last_saved_step}); resume with ckpt_path=last "
                f"hydra.run.dir={trainer.default_root_dir}"
            )
        if self.last_model_path:
            return f"the last checkpoint is {self.last_model_path} (step {self.last_saved_step})"
        return "no checkpoint was saved"

    def state_dict(self) -> Dict[str, Any]:
        return {"dirpath": self.dirpath, "last_model_path": self.last_model_path}


def last_good_checkpoint(trainer) -> Optional[str]:
    """The newest checkpoint this run wrote (last.ckpt), or None."""
    for cb in getattr(trainer, "checkpoint_callbacks", []) or []:
        if isinstance(cb, LastCheckpoint) and cb.last_model_path and os.path.exists(cb.last_model_path):
            return f"{cb.last_model_path} (step {cb.last_saved_step})"
    return None
