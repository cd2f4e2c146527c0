"""Where ``data=text`` and ``python -m linrope tokenize`` read documents from.

A local file, folder or glob: a ``.jsonl`` file holds one document per line (the string in ``field``), a
``.parquet`` file one per row (the column ``field``, read by pyarrow), any other file is one document (its
text).  A folder is walked in sorted order (``test``/``tests``/hidden folders skipped, as data=bytes does) and
keeps files ending in ``suffixes``; with no path, the default corpus of data=bytes (the Python standard
library's ``.py`` sources, each file a document).  Or a Hugging Face dataset, only when named
(``hf_dataset``, ``hf_config``, ``hf_split``), read by ``datasets`` in streaming mode.

Only UTF-8 text is tokenised: a file that looks binary (``linrope.data.bytes.head_reason``, the check data=bytes
makes of a folder's files) or that is not valid UTF-8 is skipped and named in one warning, and the shards'
manifest lists it (``source.skipped``); a corpus of one such file, or of nothing else, is refused in one line.
A Latin-1 file was decoded with replacement characters, so its bytes were counted as U+FFFD's, not its own.
Entries that are not regular files (FIFOs, links to nothing) are skipped and named as data=bytes names them.

Each document has an identity — its file's path relative to the corpus root, with ``:<line>`` or ``:<row>`` for a
record — from which its split is drawn (``linrope.data.bytes.split_of``: the same hash data=bytes uses on a
file's path, so a folder of text files splits as data=bytes splits it).
"""

from __future__ import annotations

import codecs
import fnmatch
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from dataclasses import field as attribute
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from linrope.base.errors import CorpusError, first_names

from .bytes import head_reason, list_files, skipped_line, stdlib_dir

DEFAULT_SUFFIXES = (".txt", ".jsonl", ".parquet", ".md")
RECORD_SUFFIXES = (".jsonl", ".parquet")


@dataclass
class Source:
    """What to read: ``files`` (absolute paths) under ``root``, or an HF dataset (``hf``: name, config, split)."""

    root: Optional[Path]
    files: List[Path]
    field: str = "text"
    hf: Optional[Tuple[str, Optional[str], str]] = None
    single: bool = False  # data.path named one file: refused, not skipped, when it is no UTF-8 text
    _screened: Optional[Dict[Path, Dict[str, Any]]] = attribute(default=None, repr=False, compare=False)

    def screened(self) -> Dict[Path, Dict[str, Any]]:
        """{file: {path, bytes, sha256, why}} of every file, read once: ``why`` says why a file is skipped (it
        looks binary, or is not UTF-8), else None.  The skipped files are named in one warning; a corpus with
        nothing else is one ``CorpusError``."""
        if self._screened is None:
            self._screened = {f: self._screen(f) for f in self.files}
            bad = [(f, s["why"]) for f, s in self._screened.items() if s["why"]]
            if bad and (self.single or len(bad) == len(self.files)):
                if self.single:
                    why = bad[0][1]
                    utf8 = why.startswith("not UTF-8: ")
                    what = f"not UTF-8 text ({why[11:]})" if utf8 else f"does not look like text: {why}"
                    raise CorpusError(f"data.path {bad[0][0]}: {what}; {TEXT_ONLY}")
                raise CorpusError(f"data.path {self.root}: no file is UTF-8 text: {_whys(bad)}; {TEXT_ONLY}")
            if bad:
                warnings.warn(f"data.path {self.root}: skipped {len(bad)} files: {_whys(bad)}; {TEXT_ONLY}")
        return self._screened

    def _screen(self, f: Path) -> Dict[str, Any]:
        h, why = hashlib.sha256(), None
        utf8 = codecs.getincrementaldecoder("utf-8")() if not f.name.endswith(".parquet") else None
        with open(f, "rb") as handle:
            if utf8 is not None:
                why = head_reason(handle)
                handle.seek(0)
            at = 0
            for block in iter(lambda: handle.read(1 << 20), b""):
                h.update(block)
                if utf8 is not None and why is None:
                    pending = len(utf8.getstate()[0])
                    try:
                        utf8.decode(block)
                    except UnicodeDecodeError as e:
                        why = f"not UTF-8: byte 0x{e.object[e.start]:02x} at offset {at - pending + e.start}"
                at += len(block)
            if utf8 is not None and why is None:
                try:
                    utf8.decode(b"", final=True)
                except UnicodeDecodeError:
                    why = f"not UTF-8: it ends inside a character (offset {at})"
        return {"path": self.rel(f), "bytes": at, "sha256": h.hexdigest(), "why": why}

    def identity(self) -> Dict[str, Any]:
        """What the shards' cache key and manifest say of the source: every file read with its size and hash (and
        the files skipped, with why, when there are any), or the HF dataset's name, config and split."""
        if self.hf:
            return {"hf_dataset": self.hf[0], "hf_config": self.hf[1], "hf_split": self.hf[2], "field": self.field}
        screened = self.screened().values()
        files = [{k: s[k] for k in ("path", "bytes", "sha256")} for s in screened if not s["why"]]
        out = {"root": str(self.root), "files": files, "field": self.field}
        skipped = [{"path": s["path"], "why": s["why"]} for s in screened if s["why"]]
        if skipped:  # only then: the keys of corpora with nothing skipped are as before
            out["skipped"] = skipped
        return out

    def rel(self, f: Path) -> str:
        return f.relative_to(self.root).as_posix() if self.root and self.root.is_dir() else f.name

    def documents(self) -> Iterator[Tuple[str, bytes]]:
        """(identity, UTF-8 bytes) of every document, in a fixed order; empty documents are left out."""
        if self.hf:
            yield from self._hf_documents()
            return
        screened = self.screened()
        for f in self.files:
            if screened[f]["why"]:
                continue
            rel = self.rel(f)
            if f.name.endswith(".jsonl"):
                yield from self._jsonl(f, rel)
            elif f.name.endswith(".parquet"):
                yield from self._parquet(f, rel)
            else:
                raw = f.read_bytes()
                if raw:
                    yield rel, raw

    def _text(self, value: Any, where: str, keys) -> bytes:
        if value is None:
            raise CorpusError(
                f"{where}: no field {self.field!r} (it has {', '.join(map(str, keys)) or 'none'}); set data.field / --field"
            )
        if not isinstance(value, str):
            raise CorpusError(f"{where}: field {self.field!r} is a {type(value).__name__}, not text")
        return value.encode("utf-8", errors="replace")

    def _jsonl(self, f: Path, rel: str):
        with open(f, "rb") as handle:
            for i, line in enumerate(handle):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise CorpusError(f"{f} line {i + 1}: not JSON ({e})") from None
                if not isinstance(record, dict):
                    raise CorpusError(f"{f} line {i + 1}: a JSON {type(record).__name__}, not an object with fields")
                text = self._text(record.get(self.field), f"{f} line {i + 1}", record.keys())
                if text:
                    yield f"{rel}:{i}", text

    def _parquet(self, f: Path, rel: str):
        try:
            import pyarrow.parquet as pq  # comes with `datasets` (the text extra)
        except ImportError:
            raise CorpusError(f"{f}: reading Parquet needs pyarrow (pip install 'linrope[text]')") from None
        table = pq.ParquetFile(f)
        if self.field not in table.schema_arrow.names:
            names = ", ".join(table.schema_arrow.names)
            raise CorpusError(f"{f}: no column {self.field!r} (it has {names}); set data.field / --field")
        row = 0
        for batch in table.iter_batches(columns=[self.field]):
            for value in batch.column(0).to_pylist():
                text = self._text(value, f"{f} row {row}", [self.field]) if value is not None else b""
                if text:
                    yield f"{rel}:{row}", text
                row += 1

    def _hf_documents(self):
        try:
            import datasets
        except ImportError:
            raise CorpusError(
                "data.hf_dataset: reading a Hugging Face dataset needs `datasets` (pip install 'linrope[text]')"
            ) from None
        name, config, split = self.hf
        try:
            ds = datasets.load_dataset(name, config, split=split, streaming=True)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CorpusError(f"data.hf_dataset={name}: cannot be read ({first})") from None
        for i, record in enumerate(ds):
            text = self._text(record.get(self.field), f"data.hf_dataset={name} record {i}", record.keys())
            if text:
                yield f"{name}/{config or ''}/{split}:{i}", text


TEXT_ONLY = (
    "data=text tokenizes UTF-8 text: convert such files (iconv -f latin1 -t utf-8) or train on their bytes with "
    "data=bytes"
)


def _whys(bad: List[Tuple[Path, str]]) -> str:
    """``a.bin (why), b.bin (why), c.bin (why) and 7 more``: the first three files of a message, each with why."""
    return first_names((f"{f.name} ({why})" for f, why in bad), 3, more=" and")


def resolve_source(
    path: Optional[str] = None,
    *,
    field: str = "text",
    suffixes: Optional[Sequence[str]] = None,
    hf_dataset: Optional[str] = None,
    hf_config: Optional[str] = None,
    hf_split: str = "train",
) -> Source:
    """The ``Source`` of a path (file, folder or glob; None: the default corpus) or an HF dataset; a path that
    matches nothing, or a folder with no files to read, is one ``CorpusError`` line."""
    if hf_dataset:
        if path:
            raise CorpusError("data.path and data.hf_dataset are both set; name one source")
        return Source(None, [], field, (str(hf_dataset), hf_config, str(hf_split)))
    if not path:
        root = stdlib_dir()
        return Source(root, list_files(root, tuple(suffixes or (".py",))), field)
    from .corpora import resolve

    path = resolve(path)  # corpus:<name>: a named corpus's folder (linrope.data.corpora)
    suffixes = tuple(suffixes or DEFAULT_SUFFIXES)
    p = Path(str(path)).expanduser()
    if any(c in str(path) for c in "*?["):
        files = glob_files(str(p))
        if not files:
            raise CorpusError(f"data.path {path}: the pattern matches no file")
        root = _common_root(files)
        return Source(root, files, field)
    if not p.exists():
        raise CorpusError(f"data.path {path}: does not exist")
    if p.is_file():
        return Source(p.parent, [p], field, single=True)
    skipped: List[Path] = []
    files = list_files(p, suffixes, skipped)
    if skipped:  # as data=bytes names them
        warnings.warn(skipped_line(p, skipped))
    if not files:
        raise CorpusError(
            f"data.path {path}: no files ending in {', '.join(suffixes)} found (data.suffixes names others)"
        )
    return Source(p, files, field)


MAGIC = "*?["


def glob_files(pattern: str) -> List[Path]:
    """The regular files a glob names, each once (by its real path), sorted.  Unlike ``glob.glob``, ``**`` never
    descends into a linked folder, so a symlink loop neither repeats files nor recurses without end; ``*`` and
    ``**`` skip hidden names, as glob does.  A link to a file is read as that file."""
    parts = Path(pattern).parts
    k = next((i for i, q in enumerate(parts) if any(c in q for c in MAGIC)), len(parts))
    base, rest = Path(*parts[:k]) if k else Path("."), list(parts[k:])
    if not rest:
        return [base.resolve()] if base.is_file() else []
    if not base.is_dir():
        return []
    found, deep = set(), "**" in rest
    for folder, dirs, names in os.walk(base, followlinks=False):
        rel = Path(folder).relative_to(base).parts
        if not deep and len(rel) >= len(rest) - 1:
            dirs[:] = []  # no ``**``: no file below the pattern's depth can match
        for name in names:
            f = Path(folder) / name
            if _matches(list(rel) + [name], rest) and f.is_file():
                found.add(f.resolve())
    return sorted(found)


def _matches(parts: List[str], pats: List[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_matches(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    if not parts or (parts[0].startswith(".") and not pats[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], pats[0]) and _matches(parts[1:], pats[1:])


def _common_root(files: List[Path]) -> Path:
    parents = [f.parent for f in files]
    root = parents[0]
    while not all(root == q or root in q.parents for q in parents):
        root = root.parent
    return root
