"""Test documents that are not independent draws: clusters of near-duplicates, the units that
linrope.analysis.bootstrap resamples (docs/methods.md, "Evidence").

**The rule.**  A document's *shingles* are its distinct substrings of ``SHINGLE`` = 8 bytes, each read as one 64-bit
integer (exact: no hashing, no collisions).  Two documents are *linked* when the Jaccard similarity of their shingle
sets, ``|A ∩ B| / |A ∪ B|``, is at least ``THRESHOLD`` = 0.2.  The clusters are the connected components of the links
(single linkage: a chain of links puts its two ends in one cluster, however far apart they are).  A document shorter
than 8 bytes has one shingle, the document itself: it links to an identical document only.  Cluster ids are 0, 1, …
in the order of each cluster's first document in the list given; the rule reads the bytes, never the names.

**Why 8 bytes and 0.2** (measured on the stdlib corpus's test split of 33 files and on English prose).  Shorter
shingles are shared by any two texts of one language: with 5-byte shingles, consecutive 15 kB chunks of one English
text (the GPL, Rust's release notes, pyenv's README) reach 0.26 and unrelated Python files 0.12, where the generated
codec tables reach 0.29; with 8 bytes the chunks of one English text stay at or below 0.11 and unrelated Python files
at or below 0.075, while the codec tables (files written by one generator, ``encodings/cp*.py`` and ``mac_*.py``)
link at 0.94, 0.74, 0.74, 0.25, 0.22 and 0.22.  0.2 lies in the gap between these and the next pair, two lib2to3
fixers written from one template (0.13): files of one project, or of one language, stay apart; files generated from
one template around one shared table join.

**Cost.**  Each document's shingles once (a sort), then per pair a look-up of one set in the other: O(n² · mean
size) for n documents, about 0.03 s for the 33 test files (427 kB), seconds for a few hundred.  Light: numpy only."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from linrope.base.errors import ResultsError

SHINGLE = 8  # bytes per shingle: one uint64, exact
THRESHOLD = 0.2  # the Jaccard similarity at which two documents are linked
FILE = "clusters.csv"  # a study folder's record of its test documents' clusters (linrope.analysis.evidence)
COLUMNS = ("document", "cluster", "bytes", "nearest", "jaccard")


def shingles(data: bytes, k: int = SHINGLE) -> Optional[np.ndarray]:
    """The distinct k-byte substrings of ``data`` (1 ≤ k ≤ 8), each as one uint64, sorted; None for a document
    shorter than k bytes (its one shingle is itself: ``similarity`` compares it whole)."""
    if not 1 <= k <= 8:
        raise ValueError(f"a shingle is 1 to 8 bytes (one uint64), got {k}")
    a = np.frombuffer(bytes(data), dtype=np.uint8).astype(np.uint64)
    if a.size < k:
        return None
    n = a.size - k + 1
    h = np.zeros(n, dtype=np.uint64)
    for i in range(k):
        h = (h << np.uint64(8)) | a[i : i + n]
    return np.unique(h)


def similarities(documents: Sequence[Tuple[str, bytes]], k: int = SHINGLE) -> np.ndarray:
    """The n × n matrix of the documents' pairwise Jaccard similarities (1 on the diagonal)."""
    data = [bytes(b) for _, b in documents]
    sets = [shingles(b, k) for b in data]
    n = len(data)
    sim = np.eye(n)
    long = [i for i, s in enumerate(sets) if s is not None]
    if long:  # one id per distinct shingle of all documents, then a mask per document
        ids = np.unique(np.concatenate([sets[i] for i in long]), return_inverse=True)[1]
        cut = np.cumsum([0] + [sets[i].size for i in long])
        parts = [ids[cut[j] : cut[j + 1]] for j in range(len(long))]
        mark = np.zeros(int(ids.max()) + 1, dtype=bool)
        for a, i in enumerate(long):
            mark[parts[a]] = True
            for b in range(a + 1, len(long)):
                j = long[b]
                common = int(np.count_nonzero(mark[parts[b]]))
                sim[i, j] = sim[j, i] = common / (parts[a].size + parts[b].size - common)
            mark[parts[a]] = False
    for i, s in enumerate(sets):  # a short document: 1 with an identical one, else 0
        if s is None:
            for j in range(n):
                if j != i:
                    sim[i, j] = sim[j, i] = float(data[i] == data[j])
    return sim


def cluster_ids(sim: np.ndarray, threshold: float = THRESHOLD) -> List[int]:
    """Connected components of the links ``sim ≥ threshold`` (single linkage), numbered 0, 1, … in the order of
    each component's first document."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"a Jaccard threshold is in (0, 1], got {threshold}")
    n = sim.shape[0]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(*np.nonzero(np.triu(sim >= threshold, 1))):
        a, b = root(int(i)), root(int(j))
        if a != b:
            parent[max(a, b)] = min(a, b)
    number: Dict[int, int] = {}
    return [number.setdefault(root(i), len(number)) for i in range(n)]


def clusters(documents: Sequence[Tuple[str, bytes]], threshold: float = THRESHOLD, k: int = SHINGLE) -> Dict[str, int]:
    """{document name: cluster id} of ``documents`` ((name, bytes) pairs, names distinct), by the module's rule."""
    names = [name for name, _ in documents]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ResultsError(
            f"documents named twice: {', '.join(twice[:3])} (a cluster is keyed by its documents' names)"
        )
    return dict(zip(names, cluster_ids(similarities(documents, k), threshold)))


def records(documents: Sequence[Tuple[str, bytes]], threshold: float = THRESHOLD, k: int = SHINGLE) -> List[Dict]:
    """One row per document for ``clusters.csv``: its cluster, its bytes, and its most similar other document with
    their Jaccard similarity (what a reader checks the threshold against)."""
    sim = similarities(documents, k)
    ids = cluster_ids(sim, threshold)
    out = []
    for i, (name, data) in enumerate(documents):
        row = np.where(np.arange(len(documents)) == i, -1.0, sim[i])
        j = int(np.argmax(row)) if len(documents) > 1 else None
        out.append(
            {
                "document": name,
                "cluster": ids[i],
                "bytes": len(data),
                "nearest": "" if j is None else documents[j][0],
                "jaccard": "" if j is None else f"{sim[i, j]:.4f}",
            }
        )
    return out


def write(rows: Sequence[Dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def read(path: Path) -> Optional[Dict[str, int]]:
    """{document: cluster} of a ``clusters.csv``, or None when there is none (or it is not one)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {r["document"]: int(r["cluster"]) for r in rows}
    except (OSError, KeyError, TypeError, ValueError):
        return None
