"""A study part's one commit (``linrope study --commit``; docs/methods.md, "Studies that outlive a session"): the part's
compact results (linrope.analysis.compact), its ``tuning.json`` and ``tuning/`` included, committed as each job
finishes, so a killed session loses no finished run; the commit is amended only while it is HEAD, has one parent,
changes nothing outside the part's folder and no other ref holds it, else a new one starts.  Subject ``<part>: N of M
jobs finished``, a body line per finished job and per tuning choice, trailer ``Study-part: <part>``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from linrope.analysis import compact, tuning
from linrope.analysis.runs import TUNING, compact_index


def _git(dir_: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=dir_, capture_output=True, text=True)


def _amendable(dir_: Path, trailer: str, part: str) -> bool:
    """HEAD is this study part's commit, still to itself: its message ends in ``trailer``, it has one parent,
    changes nothing outside the part's folder, and no ref but the current branch holds it (not merged, pushed
    or branched from)."""
    if trailer not in _git(dir_, "log", "-1", "--format=%B").stdout.splitlines():
        return False
    if len(_git(dir_, "rev-list", "--parents", "-n", "1", "HEAD").stdout.split()) != 2:
        return False
    changed = _git(dir_, "diff-tree", "--no-commit-id", "--name-only", "-r", "HEAD").stdout.split()
    if not changed or any(not p.startswith(f"{part}/") for p in changed):
        return False
    holders = set(_git(dir_, "for-each-ref", "--contains", "HEAD", "--format=%(refname)").stdout.split())
    return holders <= {_git(dir_, "symbolic-ref", "-q", "HEAD").stdout.strip()}


def commit_part(dir_: Path, jobs: int) -> None:
    """git-commit the part's compact results (only their paths), amending the part's commit when
    ``_amendable``; retried while another git holds the index.  The message lists every finished job."""
    top = _git(dir_, "rev-parse", "--show-toplevel").stdout.strip()
    if not top:
        print(f"linrope study: {dir_} is not in a git checkout: nothing committed", file=sys.stderr)
        return
    part = Path(os.path.relpath(os.path.realpath(dir_), os.path.realpath(top))).as_posix()
    kept = (*compact.FILES, ".gitignore", tuning.RECORD, *(f"{TUNING}/{f}" for f in (*compact.FILES, ".gitignore")))
    paths = [str(dir_ / f) for f in kept if (dir_ / f).is_file()]
    trailer = f"Study-part: {part}"
    done = [(r["run"], r["study"]) for r in compact_index(dir_) if isinstance(r.get("study"), dict)]
    subject = f"{part}: {len(done)} of {jobs} jobs finished"
    if len(subject) > 72:
        subject = f"{dir_.name}: {len(done)} of {jobs} jobs finished"
    lines = [
        f"{name}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in sorted((s.get("test") or {}).items()) if "@" not in k)
        + (f" ({s['wall_s'] / 60:.1f} min)" if isinstance(s.get("wall_s"), (int, float)) else "")
        for name, s in done
    ]
    chosen = tuning.read(dir_) or {}
    lines += [
        f"tuning {e.get('configuration')}: {chosen.get('key')} "
        + (f"{e['chosen']:g} ({tuning.where(e)})" if isinstance(e.get("chosen"), (int, float)) else "not chosen yet")
        + "; tried "
        + ", ".join(f"{t.get('value'):g}" for t in e.get("tried") or [])
        for e in chosen.get("configurations") or []
    ]
    message = "\n".join(
        [
            subject,
            "",
            "The study's compact results (runs.json, curves.csv, results.csv), written by",
            "linrope study as each job finishes and amended into this one commit, so that",
            "no finished run waits for the part to end.",
            "",
            *lines,
            "",
            trailer,
        ]
    )
    for _ in range(30):
        amend = ["--amend"] if _amendable(dir_, trailer, part) else []
        add = _git(dir_, "add", "--", *paths)
        result = _git(dir_, "commit", "-q", *amend, "-m", message, "--", *paths) if add.returncode == 0 else add
        if result.returncode == 0 or (
            add.returncode == 0 and not _git(dir_, "diff", "--cached", "--name-only", "--", *paths).stdout.strip()
        ):
            return  # committed, or nothing of the part changed
        if "index.lock" not in result.stderr and "cannot lock ref" not in result.stderr:
            print(
                f"linrope study: could not commit {dir_}: {(result.stderr or result.stdout).strip()}", file=sys.stderr
            )
            return
        time.sleep(2)
    print(f"linrope study: could not commit {dir_}: the git index stayed locked", file=sys.stderr)
