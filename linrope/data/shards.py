"""Pre-tokenised, memory-mapped token shards with a manifest: written once, read by every run that asks for the same
source, tokenizer and settings.

Layout of a shard folder (``<cache_dir>/<key>`` by default, ``key`` a hash of what the shards depend on):

- ``NNNNN.<split>.bin``: the tokens of shard NNNNN's documents of that split, in source order, each document
  followed by the end-of-document token (uint16 when the vocabulary fits, else uint32; raw, memory-mapped);
- ``NNNNN.docs.npy``: one row per document of the shard, in source order: (split code 0/1/2 for
  train/val/test, tokens with its EOD, the document's bytes); written last, so it marks the shard finished;
- ``manifest.json``: the source (files with sizes and SHA-256, or the HF dataset), the tokenizer (what was asked,
  its hash, vocabulary size, EOD id), the settings, per split the documents, tokens and bytes, and the shards
  (each file's size and content hash: ``content_hash``); written when every shard is, so its presence means the
  folder is whole.  ``building.json`` (the key and settings) is written first: a run that stops half-way is
  resumed by the next one that asks for the same key (finished shards kept, the partial one redone); a folder
  holding another key's shards is refused.

Opening a folder (``Shards``) checks it against its manifest, cheaply: every file's size (a .bin's against its
documents' tokens in docs.npy, docs.npy's counts against the manifest), every file's content hash (whole for a file
up to 1 MiB, else 16 blocks of 64 KiB spread over it), the end-of-document token at the end of sampled documents,
and the tokenizer's hash against the one the run uses; a mismatch is one line naming the file.

A shard holds ``shard_documents`` consecutive documents of the source; each document's split is drawn from its
identity (``linrope.data.sources``), so it does not depend on the order, the machine or the seed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from linrope.base.atomic import atomic_write_bytes
from linrope.base.errors import CorpusError, LinropeError

from .bytes import SPLITS, split_of
from .sources import RECORD_SUFFIXES, Source
from .tokenizer import ByteTokenizer, Tokenizer

FORMAT = 2  # bump when the layout or the tokens change: a new key, new shards (2: special tokens spelt in text)
MANIFEST, BUILDING = "manifest.json", "building.json"


def default_cache_dir() -> Path:
    """``$LINROPE_DATA_DIR/shards``, else ``data/shards`` under the launch folder (as ``paths.log_dir``: logs)."""
    return Path(os.environ.get("LINROPE_DATA_DIR", "data")) / "shards"


def shard_settings(tokenizer: Tokenizer, val_fraction: float, test_fraction: float, shard_documents: int,
                   max_documents: Optional[int]) -> Dict[str, Any]:  # fmt: skip
    return {
        "format": FORMAT,
        "tokenizer": {
            "name": tokenizer.name,
            "sha256": tokenizer.digest,
            "vocab_size": tokenizer.vocab_size,
            "eod": tokenizer.eod,
            "dtype": np.dtype(tokenizer.dtype).name,
        },  # fmt: skip
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "shard_documents": shard_documents,
        "max_documents": max_documents,
    }


def cache_key(source_identity: Dict[str, Any], settings: Dict[str, Any]) -> str:
    blob = json.dumps({"source": source_identity, "settings": settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 1 << 16


def content_hash(path: Path) -> str:
    """SHA-256 (16 hex digits) of a file's size and content: the whole file up to ``SAMPLE_BLOCKS`` blocks, else
    ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BLOCK`` bytes spread evenly from its start to its end (1 MiB read)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode() + b"\n")
    with open(path, "rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
            h.update(f.read())
        else:
            for i in range(SAMPLE_BLOCKS):
                f.seek((size - SAMPLE_BLOCK) * i // (SAMPLE_BLOCKS - 1))
                h.update(f.read(SAMPLE_BLOCK))
    return h.hexdigest()[:16]


def _files(folder: Path, k: int) -> Dict[str, Dict[str, Any]]:
    names = [f"{k:05d}.{s}.bin" for s in SPLITS] + [f"{k:05d}.docs.npy"]
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": content_hash(folder / n)} for n in names}


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def _progress(total: Optional[int], desc: str, enabled: bool):
    from tqdm.auto import tqdm  # a dependency of linrope

    return tqdm(total=total, desc=desc, unit="doc", disable=not enabled, dynamic_ncols=True)


def build_shards(
    source: Source,
    tokenizer: Tokenizer,
    *,
    out: Optional[Path] = None,
    cache_dir: Optional[Path] = None,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    shard_documents: int = 10_000,
    max_documents: Optional[int] = None,
    progress: bool = True,
) -> Path:
    """The folder of shards for ``source`` tokenised by ``tokenizer``: reused whole when its manifest says the same
    key, resumed when a run stopped half-way, written otherwise.  ``out``: that folder; else ``cache_dir / key``."""
    if source.single and not source.files[0].name.endswith(RECORD_SUFFIXES):  # before any token is made
        raise CorpusError(
            f"data.path {source.files[0]}: one file is one document, which falls in one split, so the others would "
            "be empty; use a folder of files, or a .jsonl / .parquet file (a document per line / row)"
        )
    settings = shard_settings(tokenizer, val_fraction, test_fraction, shard_documents, max_documents)
    identity = source.identity()
    key = cache_key({k: v for k, v in identity.items() if k != "root"}, settings)  # where the files lie: not in it
    folder = Path(out) if out else Path(cache_dir or default_cache_dir()) / key
    try:
        return _build(source, tokenizer, folder, key, identity, settings, max_documents, shard_documents,
                      val_fraction, test_fraction, progress)  # fmt: skip
    except OSError as e:
        if isinstance(e, LinropeError):  # a full disk: its own line
            raise
        what = f"{e.strerror or e}: {e.filename}" if e.filename else str(e.strerror or e)
        raise CorpusError(f"{folder}: cannot write the shards ({what})") from None


def read_record(path: Path, keys: Sequence[str] = ()) -> Dict[str, Any]:
    """A shard folder's JSON record (manifest.json, building.json) holding ``keys``; one line naming the file when
    it is not one (cut short, edited, another file)."""
    try:
        record = json.loads(path.read_text())
        why = "not a JSON object" if not isinstance(record, dict) else None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        record, why = None, f"not readable as JSON ({e})"
    missing = [k for k in keys if why is None and k not in record]
    if why or missing:
        why = why or f"no {', '.join(missing)}"
        raise CorpusError(f"{path}: {why}; delete {path.parent} so that its shards are rebuilt")
    return record


def _build(source: Source, tokenizer: Tokenizer, folder: Path, key: str, identity, settings, max_documents,
           shard_documents: int, val_fraction: float, test_fraction: float, progress: bool) -> Path:  # fmt: skip
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        manifest = read_record(manifest_path)
        if manifest.get("key") == key:
            return folder  # reused: nothing is read or written
        raise CorpusError(
            f"{folder}: holds shards of another source, tokenizer or settings (key {manifest.get('key')}, asked {key}); "
            "choose another --out / data.shards_dir, or delete it"
        )
    building = folder / BUILDING
    if building.is_file() and read_record(building).get("key") != key:
        raise CorpusError(f"{folder}: holds a partial build of other shards; choose another folder, or delete it")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(_json({"key": key, "settings": settings}), building)

    dtype, eod = np.dtype(tokenizer.dtype), tokenizer.eod
    raw_bytes = isinstance(tokenizer, ByteTokenizer)
    shards: List[Dict[str, Any]] = []
    batch: List = []
    index = 0  # shard number
    bar = _progress(max_documents, f"shards {folder.name}", progress)

    def finished(k: int, docs_batch: List) -> Optional[np.ndarray]:
        """Shard k as a stopped build left it, when it holds these documents (each one's split and bytes) and
        its files have the sizes its index gives (each file is written whole, then the index); else None."""
        docs_path = folder / f"{k:05d}.docs.npy"
        if not docs_path.is_file():
            return None
        docs = np.load(docs_path)
        mine = [(SPLITS.index(split), len(raw)) for _, split, raw in docs_batch]
        if docs.ndim != 2 or docs.shape[1:] != (3,) or [tuple(map(int, r)) for r in docs[:, ::2]] != mine:
            return None
        for code, split in enumerate(SPLITS):
            n = int(docs[docs[:, 0] == code, 1].sum())
            f = folder / f"{k:05d}.{split}.bin"
            if (f.stat().st_size if f.exists() else 0) != n * dtype.itemsize:
                return None
        return docs

    def flush(k: int, docs_batch: List) -> None:
        kept = finished(k, docs_batch)
        if kept is None:  # write (or redo) shard k
            rows, tokens = [], {s: [] for s in SPLITS}
            texts = None if raw_bytes else [utf8(ident, raw) for ident, _, raw in docs_batch]
            ids = [tokenizer.encode_bytes(d[2]) for d in docs_batch] if raw_bytes else tokenizer.encode_batch(texts)
            for (_ident, split, raw), doc in zip(docs_batch, ids):
                arr = np.empty(len(doc) + 1, dtype=dtype)
                arr[:-1], arr[-1] = doc, eod
                tokens[split].append(arr)
                rows.append((SPLITS.index(split), len(arr), len(raw)))  # the document's own bytes: bpb's denominator
            for split in SPLITS:
                data = np.concatenate(tokens[split]) if tokens[split] else np.empty(0, dtype)
                atomic_write_bytes(data.tobytes(), folder / f"{k:05d}.{split}.bin")
            kept = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
            partial = folder / f".{k:05d}.docs.npy.{os.getpid()}.partial"  # two processes may build at once
            with open(partial, "wb") as f:
                np.save(f, kept)
            os.replace(partial, folder / f"{k:05d}.docs.npy")
        shards.append(
            {
                "shard": f"{k:05d}",
                "documents": int(len(kept)),
                "tokens": int(kept[:, 1].sum()),
                "files": _files(folder, k),
            }
        )

    count = 0
    for ident, raw in source.documents():
        if max_documents is not None and count >= max_documents:
            break
        count += 1
        batch.append((ident, split_of(ident, val_fraction, test_fraction), raw))
        if len(batch) == shard_documents:
            flush(index, batch)
            index, batch = index + 1, []
        bar.update(1)
    if batch:
        flush(index, batch)
    bar.close()
    if not shards:
        raise CorpusError(f"{describe(source)}: no documents (every one is empty)")
    manifest = summary(folder, len(shards), dtype)
    manifest.update({"key": key, "source": identity, "settings": settings, "shards": shards})
    empty = [s for s in SPLITS if manifest["splits"][s]["documents"] == 0]
    if empty:
        raise CorpusError(
            f"{describe(source)}: the {', '.join(empty)} split has no documents ({count} documents, split by a hash "
            f"of each one's identity at val_fraction={val_fraction}, test_fraction={test_fraction}); use more documents"
        )
    manifest["bytes_mismatch_documents"] = _mismatches(folder, len(shards), tokenizer, dtype)
    atomic_write_bytes(_json(manifest), manifest_path)
    building.unlink(missing_ok=True)
    return folder


def utf8(ident: str, raw: bytes) -> str:
    """A document's text: its bytes decoded strictly (linrope.data.sources skipped the files that are not UTF-8; a
    file changed since is one line, never replacement characters)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{ident}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); changed "
                          "while it was read?") from None  # fmt: skip


def describe(source: Source) -> str:
    return f"data.hf_dataset={source.hf[0]}" if source.hf else f"data.path {source.root}"


def summary(folder: Path, n_shards: int, dtype) -> Dict[str, Any]:
    splits = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in SPLITS}
    for k in range(n_shards):
        docs = np.load(folder / f"{k:05d}.docs.npy")
        for code, s in enumerate(SPLITS):
            mine = docs[docs[:, 0] == code]
            splits[s]["documents"] += int(len(mine))
            splits[s]["tokens"] += int(mine[:, 1].sum())
            splits[s]["bytes"] += int(mine[:, 2].sum())
    total = {k: sum(v[k] for v in splits.values()) for k in ("documents", "tokens", "bytes")}
    return {"splits": splits, **total, "dtype": np.dtype(dtype).name}


def _mismatches(folder: Path, n_shards: int, tokenizer: Tokenizer, dtype) -> int:
    """Documents whose tokens' bytes (``token_bytes``, EOD counted one) differ from the document's bytes + 1."""
    table = tokenizer.token_bytes()
    bad = 0
    for k in range(n_shards):
        docs = np.load(folder / f"{k:05d}.docs.npy")
        for code, s in enumerate(SPLITS):
            mine = docs[docs[:, 0] == code]
            if not len(mine):
                continue
            tokens = np.fromfile(folder / f"{k:05d}.{s}.bin", dtype=dtype)
            per_doc = np.add.reduceat(table[tokens.astype(np.int64)], np.concatenate([[0], np.cumsum(mine[:-1, 1])]))
            bad += int((per_doc != mine[:, 2] + 1).sum())
    return bad


class Shards:
    """A finished shard folder, read: ``manifest``, and per split the token stream (its documents one after the
    other, memory-mapped piece by piece) with each document's start, tokens and bytes."""

    def __init__(self, folder: Path, tokenizer: Optional[Tokenizer] = None):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise CorpusError(f"{self.folder}: no {MANIFEST} (not a finished shard folder)")
        self.manifest = read_record(path, ("dtype", "shards"))
        self._check_tokenizer(tokenizer)
        dtype = np.dtype(self.manifest["dtype"])
        self.pieces: Dict[str, List[np.ndarray]] = {s: [] for s in SPLITS}
        docs: Dict[str, List[np.ndarray]] = {s: [] for s in SPLITS}
        for shard in self.manifest["shards"]:
            rows = self._checked_rows(shard, dtype)
            for code, s in enumerate(SPLITS):
                mine = rows[rows[:, 0] == code]
                if len(mine):
                    self.pieces[s].append(np.memmap(self.folder / f"{shard['shard']}.{s}.bin", dtype=dtype, mode="r"))
                    docs[s].append(mine[:, 1:])
                    self._check_ends(self.folder / f"{shard['shard']}.{s}.bin", self.pieces[s][-1], mine[:, 1])
        self.piece_starts = {s: np.concatenate([[0], np.cumsum([len(p) for p in self.pieces[s]])]) for s in SPLITS}
        self.doc_tokens = {s: np.concatenate(docs[s])[:, 0] for s in SPLITS}
        self.doc_bytes = {s: np.concatenate(docs[s])[:, 1] for s in SPLITS}
        self.doc_starts = {s: np.concatenate([[0], np.cumsum(self.doc_tokens[s])]) for s in SPLITS}

    def _check_tokenizer(self, tokenizer: Optional[Tokenizer]) -> None:
        """The tokenizer the manifest names (by hash) is the one this run uses, and the manifest is its key's."""
        settings, source = self.manifest.get("settings") or {}, self.manifest.get("source") or {}
        made = settings.get("tokenizer") or {}
        if tokenizer is not None and made.get("sha256") != tokenizer.digest:
            raise CorpusError(
                f"{self.folder}: its shards were built by tokenizer {made.get('name')} (sha256 {made.get('sha256')}), "
                f"not {tokenizer.name} (sha256 {tokenizer.digest}); delete the folder so that they are rebuilt"
            )
        if cache_key({k: v for k, v in source.items() if k != "root"}, settings) != self.manifest.get("key"):
            raise CorpusError(
                f"{self.folder / MANIFEST}: its key does not match its own source and settings (edited or copied "
                "over); delete the folder so that the shards are rebuilt"
            )

    def _checked_rows(self, shard: Dict[str, Any], dtype) -> np.ndarray:
        """Shard ``shard``'s docs.npy, once its files' sizes and hashes match the manifest and its rows the .bins."""
        name = shard["shard"]
        for file, want in (shard.get("files") or {}).items():  # manifests before issue 52 have no hashes
            f = self.folder / file
            size = f.stat().st_size if f.is_file() else None
            if size != want["bytes"]:
                raise CorpusError(
                    f"{f}: {'missing' if size is None else f'{size} bytes'}; the manifest says {want['bytes']} "
                    "(truncated, replaced or half-copied); delete the folder so that the shards are rebuilt"
                )
            if content_hash(f) != want["sha256"]:
                raise CorpusError(
                    f"{f}: its content differs from the manifest's hash (changed or replaced since it was "
                    "written); delete the folder so that the shards are rebuilt"
                )
        docs_path = self.folder / f"{name}.docs.npy"
        try:
            rows = np.load(docs_path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CorpusError(
                f"{docs_path}: not a shard index ({e}); delete the folder so that it is rebuilt"
            ) from None
        if (
            rows.ndim != 2
            or rows.shape[1] != 3
            or len(rows) != shard["documents"]
            or rows[:, 1].sum() != shard["tokens"]
        ):
            raise CorpusError(
                f"{docs_path}: {len(rows)} documents of {int(rows[:, 1].sum()) if rows.ndim == 2 else '?'} tokens; "
                f"the manifest says {shard['documents']} of {shard['tokens']}; delete the folder so that it is rebuilt"
            )
        for code, s in enumerate(SPLITS):
            f = self.folder / f"{name}.{s}.bin"
            want = int(rows[rows[:, 0] == code, 1].sum()) * dtype.itemsize
            size = f.stat().st_size if f.is_file() else 0
            if size != want:
                raise CorpusError(
                    f"{f}: {size} bytes; the manifest says {want} (the {s} tokens of its documents in "
                    f"{docs_path.name}: truncated or replaced); delete the folder so that the shards are rebuilt"
                )
        return rows

    def _check_ends(self, file: Path, piece: np.ndarray, tokens: np.ndarray, samples: int = 1024) -> None:
        """Up to ``samples`` documents spread over the piece end with the end-of-document token."""
        eod = (self.manifest.get("settings") or {}).get("tokenizer", {}).get("eod")
        if eod is None:
            return
        ends = np.cumsum(tokens) - 1
        picked = ends[np.linspace(0, len(ends) - 1, min(samples, len(ends))).astype(np.int64)]
        bad = picked[piece[picked] != eod]
        if len(bad):
            raise CorpusError(
                f"{file}: token {int(bad[0])} ends a document but is {int(piece[bad[0]])}, not the end-of-document "
                f"token {eod} (the shard does not match its index); delete the folder so that it is rebuilt"
            )

    def __len__(self):
        return int(self.manifest["tokens"])

    def length(self, split: str) -> int:
        return int(self.piece_starts[split][-1])

    def tokens(self, split: str, start: int, end: int) -> np.ndarray:
        """The tokens [start, end) of ``split``'s stream (across pieces), as int64."""
        starts, out, at = self.piece_starts[split], np.empty(end - start, dtype=np.int64), start
        k = int(np.searchsorted(starts, start, side="right")) - 1
        while at < end:
            lo, hi = at - starts[k], min(end, starts[k + 1]) - starts[k]
            out[at - start : at - start + hi - lo] = self.pieces[split][k][lo:hi]
            at += hi - lo
            k += 1
        return out

    def documents(self, split: str, start: int, end: int) -> np.ndarray:
        """The document index (within ``split``) of each position [start, end) of the stream."""
        return np.searchsorted(self.doc_starts[split], np.arange(start, end), side="right") - 1
