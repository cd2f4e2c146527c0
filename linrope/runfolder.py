"""One run folder, one run.

- ``claim_run_folder(cfg)``: a run holds an exclusive lock on ``<run>/.linrope.lock``
  (``flock``: the kernel drops it when the process ends, even by SIGKILL, so a lock is never stale).
  A second run into the same folder is refused in one line.  A run folder that already holds a run
  (checkpoints or a metrics.csv) is never overwritten: without ``ckpt_path`` it is refused in one line
  that says how to resume it.

Light: no torch, no Lightning."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Dict, List

from omegaconf import DictConfig

from linrope.config import ConfigError

LOCK_NAME = ".linrope.lock"


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
    found += [p for pattern in ("metrics.csv", "*/metrics.csv", "*/*/metrics.csv") for p in sorted(folder.glob(pattern))]
    return [str(p.relative_to(folder)) if p.is_relative_to(folder) else str(p) for p in found]


_held: Dict[str, int] = {}  # the folder this process holds -> the lock's file descriptor


def claim_run_folder(cfg: DictConfig) -> None:
    """Hold ``cfg.paths.output_dir`` until this process ends or claims another run folder (one run at a time
    per process: Hydra's in-process sweeps, tests).  See the module docstring."""
    import fcntl

    if _other_process_of_a_run():
        return
    folder = Path(str(cfg.paths.output_dir))
    release_run_folder()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunFolderError(f"run folder {folder} is in use by another run ({holder}); wait for it to end, "
                             f"or choose another hydra.run.dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _held[str(folder)] = fd
    earlier = previous_outputs(cfg, folder)
    if earlier and not cfg.get("ckpt_path"):
        release_run_folder()
        shown = ", ".join(earlier[:3]) + (f", … {len(earlier) - 3} more" if len(earlier) > 3 else "")
        raise RunFolderError(f"run folder {folder} already holds a run ({shown}); resume it with ckpt_path=last, "
                             f"or choose a new hydra.run.dir — it is not overwritten")


def release_run_folder() -> None:
    """Let go of the run folder this process holds (closing the lock's file releases it)."""
    for folder in list(_held):
        os.close(_held.pop(folder))
