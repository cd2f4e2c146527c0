"""One run folder, one run.

- ``own_run_folder(cfg)``: while a run trains, it holds an exclusive lock on ``<run>/.linrope.lock``
  (``flock``: the kernel drops it when the process ends, even by SIGKILL, so a lock is never stale).
  A second run into the same folder is refused in one line.  A run folder that already holds a run
  (checkpoints or a metrics.csv) is never overwritten: without ``ckpt_path`` it is refused in one line
  that says how to resume it.
- ``discard_refused_run_folder()``: the folder Hydra made for a run whose config was refused, when it
  holds nothing but what Hydra wrote there — so refused commands leave no empty run folders behind.

Light: no torch, no Lightning (train.py calls it before either is imported)."""
from __future__ import annotations

import os
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

from omegaconf import DictConfig

from linrope.config import ConfigError

LOCK_NAME = ".linrope.lock"
HYDRA_FILES = {".hydra", "train.log", LOCK_NAME}  # what Hydra (and the lock) write before a run starts


class RunFolderError(ConfigError):
    """The run folder is in use or holds another run; one line."""


def _other_process_of_a_run() -> bool:
    """A process that Lightning (``ddp``), srun or torchrun started beside the first one of the run: it
    shares the first one's folder, and the first one holds it."""
    return any(int(os.environ.get(v, "0") or 0) > 0 for v in ("LOCAL_RANK", "RANK", "SLURM_PROCID", "NODE_RANK"))


def previous_outputs(cfg: DictConfig, folder: Path) -> List[str]:
    """Files of an earlier run in ``folder``: checkpoints of the checkpoint callbacks, metrics.csv files."""
    dirs = {folder / "checkpoints"}
    for cb in (cfg.get("callbacks") or {}).values():
        if cb and cb.get("dirpath"):
            dirs.add(Path(str(cb.dirpath)))
    found = [p for d in sorted(dirs) if d.is_dir() for p in sorted(d.glob("*.ckpt"))]
    found += sorted(folder.glob("metrics.csv")) + sorted(folder.glob("*/metrics.csv")) + sorted(folder.glob("*/*/metrics.csv"))
    return [str(p.relative_to(folder)) if p.is_relative_to(folder) else str(p) for p in found]


@contextmanager
def own_run_folder(cfg: DictConfig) -> Iterator[None]:
    """Hold ``cfg.paths.output_dir`` for the duration of the block (see the module docstring)."""
    import fcntl

    folder = Path(str(cfg.paths.output_dir))
    if _other_process_of_a_run():
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RunFolderError(f"run folder {folder} is in use by another run ({holder}); wait for it to end, "
                                 f"or choose another hydra.run.dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        earlier = previous_outputs(cfg, folder)
        if earlier and not cfg.get("ckpt_path"):
            shown = ", ".join(earlier[:3]) + (f", … {len(earlier) - 3} more" if len(earlier) > 3 else "")
            raise RunFolderError(f"run folder {folder} already holds a run ({shown}); resume it with ckpt_path=last, "
                                 f"or choose a new hydra.run.dir — it is not overwritten")
        yield
    finally:
        os.close(fd)  # releases the lock


def discard_refused_run_folder() -> None:
    """Remove the folder Hydra created for this run when it holds only Hydra's own files (a refused config)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        folder = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001 - no Hydra run (tests compose configs directly)
        return
    if not folder.is_dir() or folder.resolve() == Path.cwd().resolve():
        return
    if all(p.name in HYDRA_FILES for p in folder.iterdir()):
        shutil.rmtree(folder, ignore_errors=True)
