"""Rewrite the old module paths a run folder saved before linrope's folders became its layers.

    python tools/migrate_runs.py DIR [DIR ...]           # rewrite, in place, every saved .yaml/.yml/.json under DIR
    python tools/migrate_runs.py --check DIR [DIR ...]   # say what would change, change nothing (exit 1 if anything)

Run folders (``.hydra/config.yaml``), a study's compact ``runs.json`` and the other records saved before the move
name classes by their old paths (``callbacks.movement._target_: linrope.movement.PositionMovement``).  linrope no
longer maps old paths when it imports or compares them: a saved config is compared as written (a resume, a study's
job identity, a report's grouping of runs), so a folder saved then differs from one composed now until its old
paths are rewritten here.  Only the value of a ``_target_`` key is rewritten (it is the only place a saved config
names code), as text, in place: the rest of each file is kept byte for byte, its line endings too.  A ``_target_`` is
a key: at the start of a line after its indentation (and a list's ``- ``), or in JSON after ``{`` or ``,``.  Other
strings that merely look like one (``my_target_: linrope.x``, a value ``"_target_: linrope.runs.x"``, the format tag
``"linrope.runs/1"``, a report's prose) are not touched.

Said, one line each, never skipped silently: every file rewritten (how many paths), every ``_target_`` naming a
``linrope.`` path that is neither old nor importable today (left as it is; exit status 1), every file that cannot
be read as text, every symbolic link inside a folder (skipped: its target may lie outside the folder, and replacing
the link would turn it into a copy).  A symbolic link named on the command line is refused (exit status 2): name
the file or folder it points to.  A file is replaced atomically (a temporary file beside it, then a rename; its mode
kept).

Checkpoints (``*.ckpt``) are never rewritten: linrope loads them with ``torch.load(weights_only=True)`` and rebuilds
the model from plain values, never instantiating a ``_target_``, and a resume does not compare their ``callbacks.*``
(linrope.run.resume_diff.NOT_COMPARED), the only keys that held old paths.  Rewriting one would mean unpickling and
pickling it again; the tool says instead which checkpoints hold old paths (a byte search of the file, no unpickling).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import mmap
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

# old dotted module name -> its name today (the table the import hook linrope.base.moved held until it was removed)
MOVED = {
    "linrope.after_training": "linrope.training.after_training",
    "linrope.atomic": "linrope.base.atomic",
    "linrope.attention": "linrope.models.attention",
    "linrope.caveats": "linrope.analysis.report.caveats",
    "linrope.checkpoint": "linrope.run.checkpoint",
    "linrope.command_line": "linrope.config.command_line",
    "linrope.compiling": "linrope.base.compiling",
    "linrope.errors": "linrope.base.errors",
    "linrope.extrapolation": "linrope.evaluation.extrapolation",
    "linrope.figures": "linrope.analysis.figures",
    "linrope.lit": "linrope.training.lit",
    "linrope.memory": "linrope.base.memory",
    "linrope.model": "linrope.models.model",
    "linrope.movement": "linrope.training.movement",
    "linrope.naming": "linrope.base.naming",
    "linrope.optim": "linrope.models.optim",
    "linrope.plots": "linrope.base.plots",
    "linrope.provenance": "linrope.run.provenance",
    "linrope.report_files": "linrope.analysis.report.files",
    "linrope.report_provenance": "linrope.analysis.report.provenance",
    "linrope.resume_diff": "linrope.run.resume_diff",
    "linrope.rope": "linrope.ops.rope",
    "linrope.runs": "linrope.analysis.runs",
    "linrope.schema": "linrope.base.options",
    "linrope.spec": "linrope.models.spec",
    "linrope.stats": "linrope.analysis.stats",
    "linrope.study_jobs": "linrope.studies.study_jobs",
    "linrope.tables": "linrope.evaluation.tables",
}
# modules that became packages of the same name: their old attributes live in one module of the package
BECAME_PACKAGES = {"linrope.config": "linrope.config.checks", "linrope.training": "linrope.training.builders"}
SAVED = (".yaml", ".yml", ".json")
# a _target_ key and its value, in YAML (`_target_: x`, `- '_target_': "x"`) or JSON (`"_target_": "x"`): the key
# starts a line (after its indentation, a list's `- `) or, in JSON on one line, follows `{` or `,`; so neither
# `my_target_: linrope.x` nor a string holding "_target_: linrope.x" is taken for one
TARGET = re.compile(
    r"""(?P<key>(?:^[ \t]*(?:-[ \t]+)*(?:_target_|"_target_"|'_target_')|[{,][ \t]*"_target_")[ \t]*:[ \t]*["']?)"""
    r"""(?P<name>linrope(?:\.\w+)+)""",
    re.MULTILINE,
)


def current_name(dotted: str) -> str:
    """The dotted name today of a path saved before the move (unchanged when it did not move)."""
    for old, new in MOVED.items():
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old) :]
    for old, new in BECAME_PACKAGES.items():
        rest = dotted[len(old) + 1 :] if dotted.startswith(old + ".") else ""
        if rest and source(f"{old}.{rest.split('.')[0]}") is None:  # not a module of the package
            return f"{new}.{rest}"
    return dotted


def source(module: str) -> Optional[Path]:
    """The file of the linrope module ``module`` (a package's ``__init__.py``), or None: found on disk, nothing of
    linrope imported beyond its top package (importing a module to look inside it could load torch)."""
    spec = importlib.util.find_spec("linrope")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("migrate_runs: linrope is not importable here: run it with linrope's Python")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*module.split(".")[1:])
    for candidate in (path / "__init__.py", path.parent / f"{path.name}.py"):
        if module.startswith("linrope") and candidate.is_file():
            return candidate
    return None


def exists(dotted: str) -> bool:
    """Whether ``dotted`` names a linrope module today, or a name its module defines or imports at its top level
    (the source read, not run)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = source(".".join(parts[:i]))
        if path is not None:
            break
    else:
        return False
    if i == len(parts):
        return True
    defined = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defined.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return parts[i] in defined


def migrate_text(text: str) -> Tuple[str, List[Tuple[str, str]], List[str]]:
    """(new text, [(old, new) rewritten], [unknown linrope names]) of one file's text."""
    changed: List[Tuple[str, str]] = []
    unknown: List[str] = []

    def replace(m: re.Match) -> str:
        old = m.group("name")
        new = current_name(old)
        if new != old:
            changed.append((old, new))
        elif not exists(old):
            unknown.append(old)
        return m.group("key") + new

    return TARGET.sub(replace, text), changed, unknown


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def files_under(roots: Iterable[Path], say=print) -> Iterable[Path]:
    """The files of ``roots``; a symbolic link is never followed (module docstring): skipped, saying so."""
    for root in roots:
        for path in [root] if root.is_file() or root.is_symlink() else sorted(root.rglob("*")):
            if path.is_symlink():
                say(f"{path}: skipped: a symbolic link")
            elif path.is_file():
                yield path


def migrate(roots: Iterable[Path], write: bool = True, say=print) -> int:
    """Rewrite (or with ``write=False`` only report) the old paths under ``roots``; the exit status: 0 when nothing
    is left to do, 1 when a name is unknown, a file unreadable, or (``write=False``) a file would change."""
    status = 0
    for path in files_under(roots, say):
        if path.suffix == ".ckpt":
            if not path.stat().st_size:
                continue
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                old = sorted({o for o in MOVED if re.search(re.escape(o).encode() + rb"\.", data)})
            if old:
                say(f"{path}: a checkpoint naming old paths ({', '.join(old)}): left as it is (module docstring)")
            continue
        if path.suffix not in SAVED:
            continue
        try:
            text = path.read_bytes().decode("utf-8")  # not read_text: its universal newlines would drop each \r
        except (OSError, UnicodeDecodeError) as e:
            say(f"{path}: cannot be read as UTF-8 text ({e}): not migrated")
            status = 1
            continue
        new, changed, unknown = migrate_text(text)
        for name in sorted(set(unknown)):
            say(f"{path}: _target_ {name}: no such module or name in linrope today, and not an old path: left as it is")
            status = 1
        if changed:
            pairs = ", ".join(f"{o} -> {n}" for o, n in sorted(set(changed)))
            if write:
                _write_atomically(path, new)
                say(f"{path}: rewrote {len(changed)} path(s): {pairs}")
            else:
                say(f"{path}: would rewrite {len(changed)} path(s): {pairs}")
                status = max(status, 1)
    return status


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python tools/migrate_runs.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("dirs", nargs="+", type=Path, help="run folders, study folders, or single saved files")
    ap.add_argument("--check", action="store_true", help="say what would change, write nothing")
    args = ap.parse_args(argv)
    links = [d for d in args.dirs if d.is_symlink()]
    if links:  # a rewrite would replace the link by a rewritten copy of its target, which may lie anywhere
        named = ", ".join(f"{d} (to {os.readlink(d)})" for d in links)
        print(f"migrate_runs: {named}: a symbolic link: name the file or folder it points to", file=sys.stderr)
        return 2
    missing = [d for d in args.dirs if not d.exists()]
    if missing:
        print(f"migrate_runs: {', '.join(map(str, missing))}: no such file or folder", file=sys.stderr)
        return 2
    return migrate(args.dirs, write=not args.check)


if __name__ == "__main__":
    sys.exit(main())
