"""The files a report writes, and only those: a report never replaces a file it did not write.

``claim`` refuses, in one line and before any file is touched, a file that exists unless ``.linrope-outputs.json``
in its folder (``MANIFEST``, written by ``record``) lists it with the SHA-256 of its content, or the folder predates
the manifest and its main file begins with the tool's own first line (``legacy``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from linrope.analysis.runs import read_json
from linrope.base.atomic import atomic_write_bytes

MANIFEST = ".linrope-outputs.json"
TOOL = "linrope report"  # a sweep's report and a study's table over its arms alike


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(folder: Path) -> Optional[Dict[str, str]]:
    return read_json(folder / MANIFEST)


def _legacy(folder: Path, legacy: Dict[str, Sequence[str]]) -> bool:
    """A folder a report wrote before the manifest: its main file begins with the tool's own first line."""
    for name, starts in legacy.items():
        try:
            with open(folder / name, encoding="utf-8") as f:
                first = f.readline()
        except (OSError, UnicodeDecodeError):
            continue
        if first.startswith(tuple(starts)):
            return True
    return False


def claim(folder: Path, names: Iterable[str], legacy: Dict[str, Sequence[str]]) -> None:
    """Refuse (SystemExit, one line) unless every file of ``names`` in ``folder`` may be written; see the module
    docstring.  ``legacy``: {main file: the first lines a report has written in it}."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise SystemExit(f"{TOOL}: {existing} is a file: cannot write the report into {folder}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"{TOOL}: {existing} is not writable: nothing written (choose another folder with --out)")
    known = manifest(folder)
    adopted = known is None and _legacy(folder, legacy)
    foreign: List[str] = []
    for name in names:
        path = folder / name
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_symlink() or not path.is_file():
            foreign.append(f"{name} (not a regular file)")
        elif known is not None and name in known:
            if known[name] != _sha(path):
                foreign.append(f"{name} (changed since {TOOL} wrote it)")
        elif not adopted:
            foreign.append(name)
    if foreign:
        raise SystemExit(
            f"{TOOL}: {folder} holds {', '.join(foreign)}, not written by a linrope report: nothing "
            f"written; move {'it' if len(foreign) == 1 else 'them'} away, or write the report elsewhere with --out"
        )


def record(folder: Path, names: Iterable[str]) -> None:
    """Add the files of ``names`` that exist in ``folder`` to its manifest, with the hash of what was written."""
    folder = Path(folder)
    known = manifest(folder) or {}
    known.update({name: _sha(folder / name) for name in names if (folder / name).is_file()})
    atomic_write_bytes((json.dumps(dict(sorted(known.items())), indent=1) + "\n").encode(), folder / MANIFEST)
