"""Test documents that are not independent draws: clusters of near-duplicates, the units that
linrope.analysis.bootstrap resamples (docs/methods.md, "Uncertainty": the rule and why its numbers).

Two documents are linked when the Jaccard similarity of their sets of ``SHINGLE``-byte substrings is at least
``THRESHOLD``; the clusters are the connected components of the links, numbered in the order of their first
document.  ``document_clusters`` gives a report its clusters (computed from the runs' corpus, else a recorded
``clusters.csv``); ``cluster_lines``, ``cluster_text``, ``floor_text`` and ``holm_floor_text`` are what a report
says of them and of its p floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from linrope.analysis.cells import write_csv
from linrope.analysis.runs import Run
from linrope.analysis.stats import P_FLOOR
from linrope.base.csv_files import read_rows
from linrope.base.errors import ResultsError

SHINGLE = 8  # bytes per shingle: one uint64, exact
THRESHOLD = 0.2  # the Jaccard similarity at which two documents are linked
FILE = "clusters.csv"  # a study folder's record of its test documents' clusters (linrope.analysis.evidence)


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
    if long:  # one id per distinct shingle of all documents: the shingles two documents share, by a sparse product
        from scipy.sparse import csr_matrix

        ids = np.unique(np.concatenate([sets[i] for i in long]), return_inverse=True)[1]
        cut = np.cumsum([0] + [sets[i].size for i in long])
        has = csr_matrix((np.ones(ids.size), ids, cut), shape=(len(long), int(ids.max()) + 1))
        common = (has @ has.T).toarray()
        size = np.diag(common)
        sim[np.ix_(long, long)] = common / (size[:, None] + size[None, :] - common)
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
    from scipy.sparse.csgraph import connected_components  # here: a report without documents never needs it

    _, labels = connected_components(sim >= threshold, directed=False)
    number: Dict[int, int] = {}
    return [number.setdefault(int(c), len(number)) for c in labels]


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


def read(path: Path) -> Optional[Dict[str, int]]:
    """{document: cluster} of a ``clusters.csv``, or None when there is none (or it is not one)."""
    try:
        return {r["document"]: int(r["cluster"]) for r in read_rows(path)[1]}
    except (OSError, KeyError, TypeError, ValueError):
        return None


def runs_corpus(groups: Mapping[str, Sequence[Run]]):
    """(the corpus the runs name, read here from their data config, or None; why not): None when it cannot be read
    or its test split has not the bytes the runs scored (another Python's standard library, say)."""
    run = next(run for runs in groups.values() for run in runs)
    scored = next((r["scored"] for r in run.extrapolation if r.get("per_document")), None)
    try:
        from linrope.data.bytes import load_corpus

        splits = load_corpus(
            run.get("data.path"),
            context=int(run.get("context") or 1),
            val_fraction=float(run.get("data.val_fraction", 0.05)),
            test_fraction=float(run.get("data.test_fraction", 0.05)),
            max_bytes=run.get("data.max_bytes"),
        )
    except Exception as e:  # noqa: BLE001 - a corpus not on this machine: the report goes on without it
        return None, f"the runs' corpus cannot be read here ({str(e).splitlines()[0][:120]})"
    if scored is not None and len(splits["test"]) - 1 != int(scored):
        return None, (
            f"the corpus here has a test split of {len(splits['test']) - 1} scored bytes, the "
            f"runs scored {scored} (another Python's standard library?)"
        )
    return splits, ""


def scored_documents(groups: Mapping[str, Sequence[Run]]) -> Dict[str, float]:
    """{document: bytes} of every document a run's extrapolation row scored (the test split's, by name)."""
    return {
        d["document"]: float(d["bytes"])
        for runs in groups.values()
        for run in runs
        for r in run.extrapolation
        for d in r.get("per_document") or ()
    }


def document_clusters(
    groups: Mapping[str, Sequence[Run]], out: Path, write: bool = True
) -> Tuple[Optional[Dict[str, int]], str]:
    """({document: cluster} of the documents the runs scored, or None; why None): computed by
    linrope.analysis.clusters from the corpus the runs name when it is here and holds those documents (then
    written to ``out/clusters.csv`` when ``write``), else read from a ``clusters.csv`` that lists them all, in
    ``out`` or in a folder of the runs; None, each document its own cluster, with neither."""
    names = scored_documents(groups)
    if not names:
        return None, "the runs kept no loss per document"
    splits, why = runs_corpus(groups)
    if splits is not None:
        data = splits["test"]
        docs = [(n, bytes(data[a:b])) for n, a, b in splits.documents["test"] if n in names]
        if len(docs) == len(names):
            rows = records(docs)
            if write:
                write_csv(rows, Path(out) / FILE)
            return {r["document"]: int(r["cluster"]) for r in rows}, ""
        lacking = sorted(set(names) - {n for n, _ in docs})
        why = f"the corpus here lacks {len(lacking)} of the documents the runs scored ({', '.join(lacking[:3])})"
    folders = dict.fromkeys([Path(out), *(run.path.parent for runs in groups.values() for run in runs)])
    for folder in folders:
        found = read(folder / FILE)
        if found is not None and set(names) <= set(found):
            return {n: found[n] for n in sorted(names)}, ""
    return None, f"{why}, and no {FILE} records them"


def cluster_lines(groups: Mapping[str, Sequence[Run]], grouping: Optional[Dict[str, int]], why: str) -> List[str]:
    """The Evidence section's paragraph on what the bootstrap draws: the clusters of more than one document, or
    that each document is its own."""
    sizes = scored_documents(groups)
    if not sizes:
        return []
    rule = (
        f"linrope.analysis.clusters: two documents are linked when their sets of {SHINGLE}-byte "
        f"substrings have Jaccard similarity ≥ {THRESHOLD:g}; a cluster is a connected component of the "
        f"links"
    )
    if grouping is None:
        return [
            f"**Test documents in clusters:** none known ({why}): each of the {len(sizes)} documents is its own "
            f"cluster, as if every document were an independent draw, which near-copies among them would make "
            f"optimistic ({rule}).",
            "",
        ]
    members: Dict[int, List[str]] = {}
    for name in sorted(sizes):
        members.setdefault(grouping[name], []).append(name)
    total = sum(sizes.values())
    several = sorted((m for m in members.values() if len(m) > 1), key=lambda m: (-len(m), m))
    text = "; ".join(
        f"{', '.join(m)} ({sum(sizes[n] for n in m):,.0f} bytes, {100 * sum(sizes[n] for n in m) / total:.1f}% of "
        f"the scored bytes)"
        for m in several
    )
    return [
        f"**Test documents in clusters** ({rule}; {FILE}).  {len(sizes)} documents in {len(members)} "
        f"clusters"
        + (f"; of more than one document: {text}." if several else ", each of one document.")
        + "  The comparisons' bootstrap draws clusters, not documents: a drawn cluster brings all its documents.",
        "",
    ]


def cluster_text(groups: Mapping[str, Mapping[str, Sequence[Run]]], grouping: Mapping[str, Tuple], arms) -> str:
    """A study table's sentence on what the bootstrap of each arm with documents drew (``grouping``: arm name ->
    what ``document_clusters`` gave)."""
    parts = []
    for arm in arms:
        if arm.name not in grouping:
            continue
        mapping, why = grouping[arm.name]
        n = len(scored_documents(groups[arm.name]))
        parts.append(
            f"{arm.name}, {n} documents in {len(set(mapping.values()))} clusters ({arm.name}/{FILE})"
            if mapping
            else f"{arm.name}, each of its {n} documents its own cluster ({why})"
        )
    if not parts:
        return ""
    return (
        " The bootstrap draws clusters of near-duplicate test documents, not documents (linrope.analysis.clusters: "
        f"a cluster brings all its documents): {'; '.join(parts)}."
    )


def floor_text(adjusted: Sequence[Any]) -> str:
    """The Evidence legend's sentence on how precisely its p-values are printed."""
    floors = sorted({a.p_floor for a in adjusted if a.p is not None})
    if not floors:
        return ""
    return (
        f"No p is printed below what the bootstrap resolves: max(10/B, 1/N) up to a power of ten, B the replicates "
        f"and N the distinct resamples of the seeds and clusters ({' or '.join(f'{f:g}' for f in floors)} here); a "
        f'p below it reads "< floor", and the verdicts rest on the p computed.'
    )


def holm_floor_text(floors: Iterable[float]) -> str:
    """A study table's sentence on how precisely its Holm p-values are printed."""
    floors = sorted(set(floors))
    if not floors:
        return ""
    return (
        f' No Holm p is printed below {" or ".join(f"{f:g}" for f in floors)} ("< floor" instead): a bootstrap\'s '
        f"max(10/B, 1/N) up to a power of ten, B its replicates and N the distinct resamples of its seeds and "
        f"clusters, and {P_FLOOR:g} for a t over seeds (linrope.analysis.bootstrap.p_floor); a finer tail is the t "
        f"model's, not the data's."
    )
