"""Writing a file so that it holds either the old contents or the whole new ones: the bytes go to a temporary file
of the writer's own beside the target (``_temporary_name``), are fsynced, and the file is renamed over the target.
A writer killed half-way leaves its temporary file, which the next save on the host removes."""

from __future__ import annotations

import errno
import glob
import os
import secrets
import socket
import zipfile
from pathlib import Path
from typing import Any, Optional

from linrope.base.errors import DiskFull

TMP_SUFFIX = ".partial"


def file_problem(path) -> Optional[str]:
    """What keeps ``path`` from being a whole file written by ``torch.save`` (a zip), or None: missing, a
    dangling link, a folder, not a regular file, truncated (a write that never finished)."""
    path = Path(path)
    if not path.exists():
        return "is a dangling link" if path.is_symlink() else "does not exist"
    if not path.is_file():
        return "is a folder, not a checkpoint file" if path.is_dir() else "is not a regular file"
    if not zipfile.is_zipfile(path):
        return "is not a complete checkpoint (truncated, or not written by torch.save)"
    return None


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


def _temporary_name(path: Path) -> Path:
    """``.<name>.<host>-<pid>-<random>.partial`` beside ``path``: unique per writer, so two processes that
    save the same file never write into or rename each other's temporary file."""
    return path.parent / f".{path.name}.{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of ``path`` left by writers of this host that no longer run (killed mid-write)."""
    host = socket.gethostname()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.{glob.escape(host)}-*{TMP_SUFFIX}"):
        pid = tmp.name[len(f".{path.name}.{host}-") :].split("-", 1)[0]
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
    import torch  # here, not above: a table or a record written atomically loads no torch

    _atomic_write(Path(str(path).removeprefix("file://")), lambda f: torch.save(obj, f), "checkpoint ")


def atomic_write_bytes(data: bytes, path) -> None:
    """``data`` to ``path`` so that it holds either the old file or the whole new one (a table written row by
    row: a process killed between two rows leaves the earlier rows whole).  A full disk is one line."""
    _atomic_write(Path(path), lambda f: f.write(data), "")


def _atomic_write(path: Path, write, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and _no_space(e):
            kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} was written before"
            raise DiskFull(f"cannot write {what}{path}: no space left on device ({path.parent}); {kept}") from None
        raise
    _fsync_dir(path.parent)
    _remove_stale_temporaries(path)
