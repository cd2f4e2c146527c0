"""Checkpoints that survive a crash, load with ``weights_only=True`` and say what does not fit.

- ``AtomicCheckpointIO``: the Trainer's CheckpointIO plugin (linrope.training.build_trainer adds it).
  A checkpoint is written to a hidden temporary file in the same folder (a name of its own per
  writer), flushed and fsynced, then
  moved over the old file with ``os.replace`` (and the folder fsynced), so a kill while writing
  leaves the previous checkpoint whole.  Parameters that are not finite are never written.
  Loading defaults to ``weights_only=True``.
- ``LastCheckpoint``: ``last.ckpt`` every ``every_n_train_steps`` steps, after each validation and
  at the end of training — the file that ``ckpt_path=last`` (or ``auto``) resumes from.
- ``load_model(ckpt_path, expected_model_cfg=None)``: a LanguageModel from a checkpoint, for
  evaluation; keys that do not fit the expected model config are named in one error.
- ``check_state_dict``: that error (also raised when a run resumes into another model config);
  ``check_identity``: the same for a checkpoint of another model whose parameters all fit.
- A full disk while saving is one ``DiskFull`` line, and the previous checkpoint is kept.
"""
from __future__ import annotations

import errno
import glob
import os
import secrets
import signal
import socket
import threading
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint

TMP_SUFFIX = ".partial"  # ``.<name>.<writer>.partial`` beside the checkpoint while it is being written


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (missing, incomplete, or not this model's); one line."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint's parameters do not fit the model built from the config."""


class NonFiniteCheckpoint(RuntimeError):
    """Refused to write a checkpoint whose parameters are NaN or infinite."""


# ---- writing ---------------------------------------------------------------------------------------------
def _is_local(path) -> bool:
    s = str(path)
    return "://" not in s or s.startswith("file://")


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def non_finite_keys(state_dict: Mapping[str, Any]) -> List[str]:
    return [k for k, v in state_dict.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


class DiskFull(CheckpointError):
    """No space left on the device while writing a checkpoint (the previous one is kept)."""


def _temporary_name(path: Path) -> Path:
    """``.<name>.<host>-<pid>-<random>.partial`` beside ``path``: unique per writer, so two processes that
    save the same file never write into or rename each other's temporary file."""
    return path.parent / f".{path.name}.{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of ``path`` left by writers of this host that no longer run (killed mid-write)."""
    host = socket.gethostname()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.{glob.escape(host)}-*{TMP_SUFFIX}"):
        pid = tmp.name[len(f".{path.name}.{host}-"):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def _no_space(e: BaseException) -> bool:
    """ENOSPC anywhere in the chain (torch wraps the OSError of the file in RuntimeErrors)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def atomic_torch_save(obj: Any, path) -> None:
    """``torch.save`` to ``path`` so that it holds either the old file or the whole new one.  A full disk
    is one ``DiskFull`` line; the previous file is kept."""
    path = Path(str(path).removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and _no_space(e):
            kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} was written before"
            raise DiskFull(f"cannot write checkpoint {path}: no space left on device ({path.parent}); {kept}") from None
        raise
    _fsync_dir(path.parent)
    _remove_stale_temporaries(path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes atomically, refuses non-finite parameters and loads weights only."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}")
        bad = non_finite_keys(checkpoint.get("state_dict") or {})
        if bad:
            raise NonFiniteCheckpoint(
                f"parameters are not finite at step {checkpoint.get('global_step', '?')} ({_names(bad)}): "
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
    # Lightning turns SIGTERM into a stop at the end of the current step (SIGTERMException, a SystemExit);
    # SIGINT (Ctrl+C) is made to stop the same way (a second Ctrl+C interrupts at once).  Either way
    # last.ckpt is written before the process ends, and the process says so and exits non-zero.
    stopped_by: Optional[str] = None
    _previous_sigint: Any = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.stopped_by = None
        connector = getattr(trainer, "_signal_connector", None)
        if connector is None or threading.current_thread() is not threading.main_thread():
            return

        def on_sigint(signum, frame):
            if self.stopped_by == "SIGINT" or not hasattr(connector, "received_sigterm"):
                raise KeyboardInterrupt  # pressed twice: stop now
            self.stopped_by = "SIGINT"
            connector.received_sigterm = True  # Lightning ends the step, then raises SIGTERMException

        self._previous_sigint = signal.signal(signal.SIGINT, on_sigint)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
        self._previous_sigint = None

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_sigint()
        if self.save_on_train_end and not self._skip(trainer):
            self._save(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Stopped by a signal: last.ckpt now, and the line linrope.training.one_line_errors prints (rank 0)
        with the exit status, 128 + the signal's number, attached to the exception."""
        self._restore_sigint()
        if type(exception).__name__ != "SIGTERMException":
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


# ---- resuming in the data modules ------------------------------------------------------------------------
def train_span(trainer, samples_per_step: int, default_steps: int = 100_000) -> Tuple[int, int]:
    """(start, length) of the training dataset: it starts at sample ``global_step × samples_per_step``
    and is as long as the whole run.  Lightning, resuming in the middle of an epoch, counts the
    batches of that epoch already done against ``len(loader)`` (without skipping any): a loader only
    as long as the remaining steps would end the epoch early and then start over from the resume point."""
    total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else default_steps
    total = max(total, trainer.global_step + 1)
    return trainer.global_step * samples_per_step, total * samples_per_step


class ResumableLoader(torch.utils.data.DataLoader):
    """A training loader whose dataset already starts where the run stands (``train_span``).
    Marked stateful so that Lightning does not warn, on resuming, that it is not resumable."""

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        pass


def train_loader(dataset, trainer, batch_size: int, num_workers: int = 0) -> ResumableLoader:
    """The training loader of a dataset made with ``train_span``: in order, and with several processes
    sample ``i`` goes to rank ``i mod world_size`` — so the global batch of a step is the same samples
    whatever the number of processes.  (Lightning's own DistributedSampler for training always shuffles,
    with a permutation of the whole dataset that changes when a resumed run's dataset does.)"""
    sampler = None
    if trainer is not None and trainer.world_size > 1:
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=trainer.world_size,
                                                      rank=trainer.global_rank, shuffle=False, drop_last=False)
    return ResumableLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=num_workers,
                           persistent_workers=num_workers > 0)


# ---- reading ---------------------------------------------------------------------------------------------
def check_complete(path) -> None:
    """One line if ``path`` is missing or not a whole checkpoint (e.g. a half-written file)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {path}: does not exist" + (" (a dangling link)" if p.is_symlink() else ""))
    if p.is_dir():
        raise CheckpointError(f"checkpoint {path}: is a folder, not a checkpoint file")
    if not zipfile.is_zipfile(p):
        raise CheckpointError(f"checkpoint {path}: not a complete checkpoint (truncated or not a torch.save file)")


def _names(keys: Iterable[str], limit: int = 4) -> str:
    keys = list(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", … {len(keys) - limit} more" if len(keys) > limit else "")


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
        parts.append(f"{len(missing)} missing key{'s' * (len(missing) > 1)} ({_names(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key{'s' * (len(unexpected) > 1)} ({_names(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({_names(shapes, 3)})")
    diff = config_differences(found_cfg, expected_cfg)
    raise CheckpointMismatch(f"{where} does not fit the model config: " + "; ".join(parts)
                             + (f" — the model configs differ: {diff}" if diff else ""))


def check_identity(checkpoint: Mapping[str, Any], model_cfg: Optional[Mapping], *, where: str = "the checkpoint") -> None:
    """Raise ``CheckpointMismatch`` when the checkpoint is another model (attention kind, feature map, RoPE
    placement, position scheme or its options; ``linrope.identity``), even where every parameter fits."""
    from linrope.identity import checkpoint_identity, identity_differences, model_identity

    diff = identity_differences(checkpoint_identity(checkpoint), model_identity(model_cfg))
    if diff:
        raise CheckpointMismatch(f"{where} is a checkpoint of another model: {diff}")


def load_checkpoint(path, map_location: Any = "cpu") -> Dict[str, Any]:
    """``torch.load(path, weights_only=True)``; a missing or broken file is one ``CheckpointError`` line."""
    check_complete(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's unpickling errors are many and long
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path}: cannot be loaded with weights_only=True: {first}") from e


def _merge(base: Mapping, over: Mapping) -> Dict[str, Any]:
    """``over`` onto ``base``, nested; a sub-config whose ``name``/``kind`` changes is replaced whole."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        if isinstance(v, Mapping) and isinstance(old, Mapping) and all(
                v.get(t, old.get(t)) == old.get(t) for t in ("name", "kind")):
            out[k] = _merge(old, v)
        else:
            out[k] = dict(v) if isinstance(v, Mapping) else v
    return out


def _plain(cfg: Any) -> Any:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


def load_model(ckpt_path, expected_model_cfg: Optional[Mapping] = None, *, map_location: Any = "cpu"):
    """The ``LanguageModel`` of a checkpoint, in eval mode, loaded with ``weights_only=True``.

    The model is built from the checkpoint's own model config, overridden (nested) by
    ``expected_model_cfg`` when given — e.g. a RoPE scaling for evaluation, or the config a caller
    expects the checkpoint to have.  Parameters that do not fit raise one ``CheckpointMismatch``
    line naming the missing / unexpected / shape-mismatched keys and the config values that differ."""
    from linrope.lit import LanguageModel

    ckpt = load_checkpoint(ckpt_path, map_location=map_location)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {ckpt_path}: has no state_dict (not a Lightning checkpoint)")
    hp = ckpt.get("hyper_parameters") or {}
    found_cfg = dict(hp.get("model") or {})
    model_cfg = _merge(found_cfg, _plain(expected_model_cfg)) if expected_model_cfg is not None else found_cfg
    if not model_cfg:
        raise CheckpointError(f"checkpoint {ckpt_path}: has no model config (hyper_parameters.model) and none was given")
    module = LanguageModel(model=model_cfg, optim=hp.get("optim"))
    check_state_dict(module.state_dict(), ckpt["state_dict"], where=f"checkpoint {ckpt_path}",
                     found_cfg=found_cfg, expected_cfg=model_cfg)
    check_identity(ckpt, model_cfg, where=f"checkpoint {ckpt_path}")
    module.load_state_dict(ckpt["state_dict"])
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        module.to(map_location)
    return module.eval()
