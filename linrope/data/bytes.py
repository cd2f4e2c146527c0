"""Byte-level language modelling on a corpus that needs no download.

Default corpus: the Python standard library's own ``.py`` sources (found through
``sysconfig``; ``test``/``tests`` folders and site-packages excluded), about 30 MB
of real text on every machine.  Any text file or folder can be used instead
(``data.path=...``).  Files are split deterministically *by file* into
train/val/test from a hash of their relative path, so the split does not depend on
the machine, the file order or the seed.

Training samples random windows of ``context + 1`` bytes; window ``i`` of the run
is a pure function of ``(seed, i)``, so a resumed run sees exactly the data an
uninterrupted one would.  Evaluation uses contiguous, non-overlapping windows.

A single file is memory-mapped, never read whole (a 2 GB file costs no 2 GB of memory); a folder's files
are read into memory.  Binary content is not trained on without a word: a single file that looks binary
(NUL bytes, or mostly control bytes, in blocks sampled across it) is refused in one line unless
``data.allow_binary=true``, a folder's binary files are skipped and named, and a file whose sampled bytes
are all zero (a sparse or zeroed file: nothing to learn) is refused whatever ``allow_binary`` says.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from linrope.base.errors import CorpusError, first_names

from .tasks import IGNORE
from .windows import window_ends

LN2 = math.log(2.0)  # bits per byte = cross-entropy per byte (nats) / LN2

Document = Tuple[str, int, int]  # (name, start, end): the bytes [start, end) of a split that one file holds

SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "__pycache__", "idle_test"}
SPLITS = ("train", "val", "test")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path, suffixes: Optional[Sequence[str]], skipped: Optional[List[Path]] = None) -> List[Path]:
    """The regular files of a corpus (a file, or a folder walked in sorted order), each once: a link to a file
    already listed is left out (its text would otherwise stand in two splits).  Anything else — a FIFO, a
    socket, a device, a link to nothing — is left out too (reading a FIFO would wait forever); when ``skipped``
    is given, every entry left out is appended to it."""
    if root.is_file():
        return [root]
    files, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if skipped is not None:  # a link to a folder is not walked (a loop, or text outside the corpus): named
            skipped += [Path(dirpath) / d for d in dirnames if (Path(dirpath) / d).is_symlink()]
        for f in sorted(filenames):
            if suffixes is None or f.endswith(tuple(suffixes)):
                path = Path(dirpath) / f
                real = os.path.realpath(path)
                if path.is_file() and real not in seen:  # a link to a file read already: one document, one split
                    files.append(path)
                    seen.add(real)
                elif skipped is not None:
                    skipped.append(path)
    return files


def skipped_line(root: Path, skipped: List[Path]) -> str:
    """The warning that names what ``list_files`` left out of a folder."""
    return (
        f"data.path {root}: skipped {len(skipped)} entries that are not regular files or repeat one (a link): "
        f"{_named(skipped)}"
    )


SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 4096  # a file is judged on at most 16 blocks of 4 KB spread over it
TEXT_CONTROL = frozenset(b"\t\n\r\f\v\b\x1b")  # control bytes that text holds


def sample(data) -> bytes:
    """At most ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BLOCK`` bytes of ``data`` (bytes or a uint8 array), evenly
    spread from its start to its end."""
    n = len(data)
    if n <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
        return bytes(data[:n])
    starts = np.linspace(0, n - SAMPLE_BLOCK, SAMPLE_BLOCKS).astype(np.int64)
    return b"".join(bytes(data[int(a) : int(a) + SAMPLE_BLOCK]) for a in starts)


def binary_reason(block: bytes) -> Optional[str]:
    """Why ``block`` (a sample of a file) is not text, or None: all zero, NUL bytes, or over 30% control bytes."""
    if not block:
        return None
    if block.count(0) == len(block):
        return "every sampled byte is 0 (a sparse or zeroed file)"
    if b"\0" in block:
        return f"it holds NUL bytes ({block.count(0)} of {len(block)} sampled bytes)"
    control = sum(1 for b in block if b < 32 and b not in TEXT_CONTROL)
    if control > 0.3 * len(block):
        return f"{control} of {len(block)} sampled bytes are control bytes"
    return None


HEAD = SAMPLE_BLOCK * 2  # a folder's file is judged on its first 8 KB (data=bytes and data=text alike)


def head_reason(handle) -> Optional[str]:
    """Why a file, open for reading in binary mode at its start, is not text (``binary_reason`` of its first
    ``HEAD`` bytes), or None: the one check of a corpus's files, data=bytes' and data=text's."""
    return binary_reason(handle.read(HEAD))


def _named(paths: Sequence[Path]) -> str:
    """``a, b, c and 7 more``: the first three paths of a message."""
    return first_names(map(str, paths), 3, more=" and")


def split_of(relpath: str, val_fraction: float, test_fraction: float) -> str:
    """Deterministic split of one file from a hash of its relative path."""
    u = int.from_bytes(hashlib.sha1(relpath.encode()).digest()[:8], "big") / 2.0**64
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def position_split(n: int, val_fraction: float, test_fraction: float) -> Tuple[int, int]:
    """Where a single-file corpus of n bytes is cut: train [0, a), val [a, b), test [b, n)."""
    return int(n * (1 - val_fraction - test_fraction)), int(n * (1 - test_fraction))


class Corpus(dict):
    """{split: uint8 array}, and ``documents``: {split: [(name, start, end), ...]}, the files each split holds,
    in order, covering it without gaps (a file's bytes and the newline that joins it to the next one).  A
    single-file corpus is one document per split."""

    def __init__(self, parts: Dict[str, np.ndarray], documents: Dict[str, List[Document]]):
        super().__init__(parts)
        self.documents = documents


def document_index(documents: Sequence[Document], offsets: np.ndarray) -> np.ndarray:
    """The document (its index in ``documents``) that holds the byte at each offset of the split."""
    starts = np.asarray([d[1] for d in documents], dtype=np.int64)
    return np.searchsorted(starts, np.asarray(offsets, dtype=np.int64), side="right") - 1


def _documents(names: Sequence[str], sizes: Sequence[int], total: int) -> List[Document]:
    """The spans of files joined by one newline each, cut at ``total`` bytes (a ``max_bytes`` budget)."""
    docs, start = [], 0
    for i, (name, size) in enumerate(zip(names, sizes)):
        end = min(start + size + (1 if i < len(sizes) - 1 else 0), total)  # the joining newline is the file's
        if end > start:
            docs.append((name, start, end))
        start += size + 1
        if start >= total:
            break
    return docs


def load_corpus(
    path: Optional[str],
    *,
    context: int,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    suffixes: Optional[Sequence[str]] = None,
    max_bytes: Optional[int] = None,
    allow_binary: bool = False,
) -> dict:
    """Read a corpus into {split: uint8 array} (a ``Corpus``, which also lists each split's documents).  Refuses a missing, empty or too-short corpus, and binary
    content unless ``allow_binary`` (see the module docstring).

    A single file is split by position (first 90% train, then val, then test), memory-mapped."""
    from .corpora import resolve

    path = resolve(path)  # corpus:<name>: the folder of a named corpus's documents (linrope.data.corpora)
    root = Path(path).expanduser() if path else stdlib_dir()
    if suffixes is None and not path:
        suffixes = (".py",)
    if not root.exists():
        raise CorpusError(f"data.path {root}: does not exist")
    if not root.is_file() and not root.is_dir():
        raise CorpusError(f"data.path {root}: is not a regular file or a folder (a FIFO, socket or device)")
    skipped: List[Path] = []
    files = list_files(root, suffixes, skipped)
    if skipped:
        warnings.warn(skipped_line(root, skipped))
    if not files:
        raise CorpusError(
            f"data.path {root}: no files{(' ending in ' + ', '.join(suffixes)) if suffixes else ''} found"
        )
    need = context + 1
    if root.is_file():
        if root.stat().st_size == 0:
            raise CorpusError(f"data.path {root}: the file is empty")
        data = np.memmap(root, dtype=np.uint8, mode="c")  # copy-on-write: pages are read when used, never written
        if max_bytes:
            data = data[:max_bytes]
        n = len(data)
        why = binary_reason(sample(data))
        if why and (why.startswith("every") or not allow_binary):
            raise CorpusError(
                f"data.path {root}: does not look like text: {why}; "
                + (
                    "there is nothing to learn"
                    if why.startswith("every")
                    else "linrope trains byte-level models on text — pass data.allow_binary=true to train on it anyway"
                )
            )
        a, b = position_split(n, val_fraction, test_fraction)
        parts = {"train": data[:a], "val": data[a:b], "test": data[b:]}
        documents = {s: [(root.name, 0, len(p))] for s, p in parts.items()}
    else:
        chunks = {s: [] for s in SPLITS}
        names: Dict[str, List[str]] = {s: [] for s in SPLITS}
        unreadable: List[Path] = []
        binary: List[Path] = []
        for f in files:
            try:
                with open(f, "rb") as handle:
                    skip = not allow_binary and head_reason(handle) is not None
                raw = b"" if skip else f.read_bytes()  # a binary file is not read whole
            except OSError:
                unreadable.append(f)
                continue
            if skip:
                binary.append(f)
                continue
            if raw:
                rel = f.relative_to(root).as_posix()
                chunks[split_of(rel, val_fraction, test_fraction)].append(raw)
                names[split_of(rel, val_fraction, test_fraction)].append(rel)
        if unreadable and len(unreadable) == len(files):
            raise CorpusError(f"data.path {root}: no file could be read ({_named(unreadable)})")
        if unreadable:
            warnings.warn(f"data.path {root}: skipped {len(unreadable)} unreadable files: {_named(unreadable)}")
        if binary and len(binary) + len(unreadable) == len(files):
            raise CorpusError(
                f"data.path {root}: every file looks binary ({_named(binary)}); linrope trains "
                f"byte-level models on text — pass data.allow_binary=true to train on them anyway"
            )
        if binary:
            warnings.warn(
                f"data.path {root}: skipped {len(binary)} binary files (NUL or control bytes in their first "
                f"{HEAD} bytes; data.allow_binary=true keeps them): {_named(binary)}"
            )
        if not any(chunks.values()):
            raise CorpusError(f"data.path {root}: the corpus is empty (every file has 0 bytes)")
        parts = {s: np.frombuffer(bytearray(b"\n".join(c)), dtype=np.uint8) for s, c in chunks.items()}
        if max_bytes:  # keep each split's share of the budget
            share = {"train": 1.0 - val_fraction - test_fraction, "val": val_fraction, "test": test_fraction}
            parts = {s: p[: max(int(max_bytes * share[s]), 1)] for s, p in parts.items()}
        documents = {s: _documents(names[s], [len(c) for c in chunks[s]], len(parts[s])) for s in SPLITS}
    for s in SPLITS:
        if len(parts[s]) < need:
            total = sum(len(p) for p in parts.values())
            why = ""
            if not root.is_file():
                counts = ", ".join(f"{k} {len(c)}" for k, c in chunks.items())
                why = (
                    f" (files are split whole by a hash of their path — {counts} files"
                    + (f", {len(binary)} binary ones skipped" if binary else "")
                    + "; a folder needs many files, or point data.path at one file, which is split by position)"
                )
            raise CorpusError(
                f"data.path {root}: too short — the {s} split has {len(parts[s])} bytes (corpus {total} bytes) but one "
                f"context window needs {need}{why}; use a larger corpus or a smaller context"
            )
    return Corpus(parts, documents)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A counter-based hash: window i of a run is a pure function of (seed, i)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class RandomWindows(Dataset):
    """``length`` random windows of ``context + 1`` bytes; item i is window number ``start + i``."""

    def __init__(self, data: np.ndarray, context: int, seed: int, length: int, start: int = 0):
        self.data, self.context, self.length, self.start = torch.from_numpy(np.asarray(data)), context, length, start
        self.key = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x100000001B3)
        self.span = len(data) - context - 1

    def __len__(self):
        return self.length

    def offset(self, i: int) -> int:
        return int(
            splitmix64(np.array([self.key ^ np.uint64(self.start + i)], dtype=np.uint64))[0] % np.uint64(self.span + 1)
        )

    def __getitem__(self, i):
        o = self.offset(i)
        w = self.data[o : o + self.context + 1].long()
        return w[:-1], w[1:]


class ContiguousWindows(Dataset):
    """Non-overlapping windows of the split; all of them, or ``max_windows`` spread evenly over the split (so a
    validation pass of a few windows reads many files, not the first one)."""

    def __init__(self, data: np.ndarray, context: int, max_windows: Optional[int] = None):
        self.data, self.context = torch.from_numpy(np.asarray(data)), context
        n = (len(data) - 1) // context
        m = n if not max_windows else min(n, max_windows)
        self.starts = (np.arange(m, dtype=np.int64) * n // max(m, 1)) * context  # evenly spread, in order
        self.n = m

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        o = int(self.starts[i])
        w = self.data[o : o + self.context + 1].long()
        return w[:-1], w[1:]


def default_stride(length: int) -> int:
    return max(1, length // 2)


class SlidingWindows(Dataset):
    """Windows of ``length`` bytes over ``data[0 : n + 1]`` that score the targets at offsets 1 … n once each
    (``linrope.data.windows``: where they end, and the context each scored byte gets).

    Window k ends at e_k (inputs ``data[e_k − length : e_k]``): e_0 = length, e_k = min(e_{k−1} + stride, n);
    it scores the targets at offsets e_{k−1}+1 … e_k.  With ``stride = length`` the windows do not overlap
    (the last one, ending at n, scores only what the others left).  Item: (inputs, targets with ``IGNORE``
    (-100) where not scored), and with ``offsets`` the offset of each scored target or −1 third.  Only on request:
    a third item of a language model's batch is read as document ids (``LitModel.outputs``), so offsets there
    would let each byte see only itself."""

    def __init__(self, data: np.ndarray, length: int, stride: int, n: int, offsets: bool = False):
        self.ends = window_ends(length, stride, n)  # the one definition (linrope.data.windows)
        self.data, self.length = torch.from_numpy(np.asarray(data[: n + 1])), length
        self.offsets = offsets

    def __len__(self):
        return len(self.ends)

    def __getitem__(self, k):
        end = self.ends[k]
        start = end - self.length
        first = 1 if k == 0 else self.ends[k - 1] + 1  # first offset this window scores
        w = self.data[start : end + 1].long()
        offsets = torch.arange(start + 1, end + 1)
        scored = offsets >= first
        y = torch.where(scored, w[1:], torch.full_like(w[1:], IGNORE))
        if not self.offsets:
            return w[:-1], y
        return w[:-1], y, torch.where(scored, offsets, torch.full_like(offsets, -1))
