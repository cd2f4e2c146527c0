"""An output folder checked before the work that fills it: ``writable_folder`` creates it if missing and creates and
removes a file there, so that a path a command cannot write is one line before hours of work, not a traceback
after them.  Standard library only."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from linrope.base.errors import OutputPathError

REASONS = {errno.ENOTDIR: "not a folder", errno.EACCES: "permission denied", errno.EROFS: "read-only file system",
           errno.ENOSPC: "no space left on device", errno.EEXIST: "not a folder", errno.EPERM: "not permitted"}  # fmt: skip


def writable_folder(folder, option: str, target=None) -> Path:
    """``folder`` (created with its parents if missing), once a file could be created in it; else OutputPathError:
    ``<option> <target>: cannot write into <folder> (<reason>)`` (``target``: what the option named, the folder
    by default)."""
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        fd, probe = tempfile.mkstemp(prefix=".linrope-write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = REASONS.get(e.errno, e.strerror or type(e).__name__)
        named = (
            f"{option}={target if target is not None else folder}" if option.isidentifier() else f"{option} {target}"
        )
        raise OutputPathError(f"{named}: cannot write into {folder} ({reason})") from None
    return folder
