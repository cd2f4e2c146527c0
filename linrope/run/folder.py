"""One run folder, one run (docs/reliability.md, "Concurrent runs" and "Overwriting a finished run").

``claim_run_folder(cfg)`` takes an exclusive lock on ``<run>/.linrope.lock`` (``flock``: never stale) and refuses, in
one line, a second run into the folder and a run into a folder that holds one without ``ckpt_path``.
``KeepEarlierRun`` does the same as a Hydra callback, before Hydra writes ``.hydra/`` into the folder, copying the
earlier ``.hydra/`` aside on a resume, which ``undo_refused_resume`` puts back when the resume is refused before it
begins (``resume_begins``).  Light: no torch, no Lightning."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from linrope.base.errors import RunFolderError, first_names

LOCK_NAME = ".linrope.lock"


def run_folder(ckpt) -> Path:
    """The run folder of a checkpoint file: ``<run>`` for ``<run>/checkpoints/x.ckpt``, else the file's folder."""
    folder = Path(str(ckpt)).expanduser().resolve().parent
    return folder.parent if folder.name == "checkpoints" else folder


def other_process_of_a_run() -> bool:
    """A process that Lightning (``ddp``), srun or torchrun started beside the first one of the run: it
    shares the first one's folder, and the first one holds it."""
    return any(int(os.environ.get(v, "0") or 0) > 0 for v in ("LOCAL_RANK", "RANK", "SLURM_PROCID", "NODE_RANK"))


def previous_outputs(cfg: DictConfig, folder: Path, callbacks: bool = True) -> List[str]:
    """Files of an earlier run in ``folder``: checkpoints (in ``checkpoints/`` and, with ``callbacks``, where
    the checkpoint callbacks write), metrics.csv files."""
    dirs = {folder / "checkpoints"}
    for cb in (cfg.get("callbacks") or {}).values() if callbacks else ():
        if cb and cb.get("dirpath"):
            dirs.add(Path(str(cb.dirpath)))
    found = [p for d in sorted(dirs) if d.is_dir() for p in sorted(d.glob("*.ckpt"))]
    found += [
        p for pattern in ("metrics.csv", "*/metrics.csv", "*/*/metrics.csv") for p in sorted(folder.glob(pattern))
    ]
    return [str(p.relative_to(folder)) if p.is_relative_to(folder) else str(p) for p in found]


def aside(folder: Path, prefix: str, suffix: str = "") -> Path:
    """The path ``<folder>/<prefix><k><suffix>`` for the next copy kept aside on a resume: k one past the largest
    already there (not their count: with one deleted, a count names a copy that exists, and the copies' order is
    their history's)."""
    taken = [p.name[len(prefix) : len(p.name) - len(suffix)] for p in folder.glob(f"{prefix}*{suffix}")]
    return folder / f"{prefix}{1 + max((int(k) for k in taken if k.isdigit()), default=-1)}{suffix}"


_held: Dict[str, int] = {}  # the folder this process holds -> the lock's file descriptor


def hold_run_folder(folder: Path) -> None:
    """Take ``folder``'s lock (creating the folder), held until this process ends or holds another run folder;
    RunFolderError when another process holds it.  Holding it already: nothing to do."""
    folder = Path(os.path.abspath(folder))
    if str(folder) in _held:
        return
    release_run_folder()
    folder.mkdir(parents=True, exist_ok=True)
    fd = exclusive_lock(folder / LOCK_NAME)
    if fd is None:
        raise RunFolderError(_in_use(folder, lock_holder(folder) or "another process"))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _held[str(folder)] = fd


def exclusive_lock(path: Path) -> Optional[int]:
    """An exclusive lock on the file at ``path`` (created): its descriptor, None when another process holds it.
    A lock on a file no longer at the path guards nothing: the one there now is taken."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def claim_run_folder(cfg: DictConfig) -> None:
    """Hold ``cfg.paths.output_dir`` until this process ends or claims another run folder (one run at a time
    per process: Hydra's in-process sweeps, tests); ``KeepEarlierRun`` took it already, before Hydra wrote there,
    in a run train.py started.  See the module docstring."""
    if other_process_of_a_run():
        return
    folder = Path(str(cfg.paths.output_dir))
    hold_run_folder(folder)
    earlier = previous_outputs(cfg, folder)
    if earlier and not cfg.get("ckpt_path"):
        release_run_folder()
        raise RunFolderError(_holds_a_run(folder, earlier))
    if earlier and str(cfg.get("ckpt_path")) == "auto":
        last = Path(
            str(OmegaConf.select(cfg, "callbacks.last_checkpoint.dirpath", default=None) or folder / "checkpoints")
        ) / str(OmegaConf.select(cfg, "callbacks.last_checkpoint.filename", default=None) or "last.ckpt")
        checkpoints = [name for name in earlier if name.endswith(".ckpt")]
        if checkpoints and not (last.exists() or last.is_symlink()):
            release_run_folder()  # auto would start afresh (no last checkpoint) over a run that kept checkpoints
            raise RunFolderError(
                f"run folder {folder} holds a run's checkpoints ({first_names(checkpoints, 3)}) but not {last.name}, "
                f"so ckpt_path=auto would train afresh over them; resume from one with ckpt_path=<its file>, or "
                f"choose a new hydra.run.dir — it is not overwritten"
            )


def _in_use(folder: Path, holder: str, option: str = "hydra.run.dir") -> str:
    return f"run folder {folder} is in use by another run ({holder}); wait for it to end, or choose another {option}"


def _holds_a_run(folder: Path, earlier: List[str]) -> str:
    return (
        f"run folder {folder} already holds a run ({first_names(earlier, 3)}); resume it with ckpt_path=last, or "
        f"choose a new hydra.run.dir — it is not overwritten"
    )


def lock_holder(folder: Path) -> Optional[str]:
    """Who holds ``folder``'s lock (the line it wrote), or None when no live process holds it."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # closing drops the shared lock taken to look
    return None


def release_run_folder() -> None:
    """Let go of the run folder this process holds (closing the lock's file releases it)."""
    for folder in list(_held):
        os.close(_held.pop(folder))


class KeepEarlierRun(Callback):
    """Hydra callback (conf/hydra/default.yaml), run before Hydra writes ``.hydra/`` into the run folder.

    ``hydra.run.dir=<a folder that holds a run>`` would otherwise have its saved config replaced before
    ``claim_run_folder`` can refuse: a folder in use by a live run, or one holding an earlier run's outputs
    without ``ckpt_path``, is refused here in one line; a resume (``ckpt_path`` given) first copies the
    earlier ``.hydra/`` to ``.hydra.before-resume-<k>/``, as the CSV history is kept beside it."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """Hold the run folder first (a run starting into it seconds before has it: refused here, before Hydra
        replaces that run's config), then refuse or keep what an earlier run left there."""
        folder = Path(str(config.hydra.run.dir))
        if other_process_of_a_run():
            return
        try:
            hold_run_folder(folder)
        except RunFolderError as e:
            raise SystemExit(f"linrope: {e}") from None
        if (folder / ".hydra" / "config.yaml").is_file():
            try:
                _refuse_or_keep(config, [folder])
            except SystemExit:
                release_run_folder()
                raise

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """A sweep launched into a sweep folder that holds an earlier sweep's jobs (``hydra.sweep.dir=`` given
        twice) is refused before any job's ``.hydra/`` or ``multirun.yaml`` is replaced; with ``ckpt_path``
        (resume every job) the earlier files are kept beside the new ones."""
        sweep = Path(str(config.hydra.sweep.dir))
        if not sweep.is_dir() or other_process_of_a_run():
            return
        jobs = sorted(p.parent.parent for p in sweep.rglob(".hydra/config.yaml"))
        if _refuse_or_keep(config, jobs, sweep) and (sweep / "multirun.yaml").is_file():
            shutil.copy2(sweep / "multirun.yaml", aside(sweep, "multirun.before-resume-", ".yaml"))


def _refuse_or_keep(config: DictConfig, folders: List[Path], sweep: Optional[Path] = None) -> bool:
    """Refuse (SystemExit, one line) when one of the run folders is in use, or holds an earlier run and no
    ``ckpt_path`` asks to resume it; on a resume copy each earlier ``.hydra/`` to ``.hydra.before-resume-<k>/``.
    ``sweep``: the folders are the jobs of this sweep folder.  True when something was kept."""
    option = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    for folder in folders:
        holder = None if os.path.abspath(folder) in _held else lock_holder(folder)  # held by this process: no holder
        if holder:
            raise SystemExit(f"linrope: {_in_use(folder, holder, option)}")
    earlier = {f: found for f in folders if (found := previous_outputs(config, f, callbacks=False))}
    if not earlier:
        return False  # only the files of runs that were refused or never started: nothing to keep
    if not config.get("ckpt_path"):
        if sweep is None:
            raise SystemExit("linrope: " + _holds_a_run(folders[0], earlier[folders[0]]))
        names = [str(f.relative_to(sweep)) for f in earlier]
        one = len(names) == 1
        raise SystemExit(
            f"linrope: sweep folder {sweep} already holds {len(names)} earlier run{'' if one else 's'} "
            f"({first_names(names, 3)}); resume {'it' if one else 'them'} with ckpt_path=auto, or choose "
            f"a new hydra.sweep.dir — {'it is' if one else 'they are'} not overwritten"
        )
    for folder in earlier:
        copy = aside(folder, ".hydra.before-resume-")
        shutil.copytree(folder / ".hydra", copy)
        _kept[os.path.abspath(folder)] = (folder / ".hydra", copy)
    return True


# {run folder: (its .hydra/, the copy this process made of it)} for a resume not yet begun: a single run's, or every
# earlier job's of a sweep (the basic launcher runs them in this process, one after another)
_kept: Dict[str, Tuple[Path, Path]] = {}


def resume_begins(folder) -> None:
    """The resume of the run in ``folder`` passed every check (train.py: the checkpoint fits the model built now):
    from here on it changes the run, and the copy of the earlier ``.hydra/`` stays beside the new one as its record."""
    _kept.pop(os.path.abspath(str(folder)), None)


def undo_refused_resume(folder) -> None:
    """A resume refused before it began changes nothing: the earlier ``.hydra/`` of the run in ``folder`` (None: no
    Hydra run) is put back in place of the one Hydra wrote for the refused run (its copy, made by ``KeepEarlierRun``,
    moved back); a sweep's other jobs keep theirs for when they run."""
    hydra, copy = _kept.pop(os.path.abspath(str(folder)), (None, None)) if folder is not None else (None, None)
    if copy is not None and copy.is_dir():
        shutil.rmtree(hydra, ignore_errors=True)
        os.replace(copy, hydra)
