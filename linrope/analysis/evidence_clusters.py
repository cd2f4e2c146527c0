"""Where a bytes report gets the clusters of its test documents, and what it says of them and of how precisely it
prints p-values (docs/methods.md, "Evidence"):

* ``runs_corpus`` — the corpus the runs name, read here from their data config (also what the reference rows of
  linrope.analysis.evidence are fitted on), when its test split has the bytes the runs scored;
* ``document_clusters`` — the clusters of the documents the runs scored: computed by linrope.analysis.clusters from
  that corpus and recorded as ``clusters.csv``; else read from a recorded ``clusters.csv`` (the report's folder, or
  the runs'); else none, each document its own cluster, and why;
* ``cluster_lines`` (the Evidence section's paragraph), ``cluster_text`` (a study table's sentence), ``floor_text``
  and ``holm_floor_text`` (the legends' sentence on the p floor, linrope.analysis.bootstrap.p_floor).

Light: no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from linrope.analysis import clusters as clustering
from linrope.analysis.runs import Run
from linrope.analysis.stats import P_FLOOR


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
            rows = clustering.records(docs)
            if write:
                clustering.write(rows, Path(out) / clustering.FILE)
            return {r["document"]: int(r["cluster"]) for r in rows}, ""
        lacking = sorted(set(names) - {n for n, _ in docs})
        why = f"the corpus here lacks {len(lacking)} of the documents the runs scored ({', '.join(lacking[:3])})"
    folders = dict.fromkeys([Path(out), *(run.path.parent for runs in groups.values() for run in runs)])
    for folder in folders:
        found = clustering.read(folder / clustering.FILE)
        if found is not None and set(names) <= set(found):
            return {n: found[n] for n in sorted(names)}, ""
    return None, f"{why}, and no {clustering.FILE} records them"


def cluster_lines(groups: Mapping[str, Sequence[Run]], grouping: Optional[Dict[str, int]], why: str) -> List[str]:
    """The Evidence section's paragraph on what the bootstrap draws: the clusters of more than one document, or
    that each document is its own."""
    sizes = scored_documents(groups)
    if not sizes:
        return []
    rule = (
        f"linrope.analysis.clusters: two documents are linked when their sets of {clustering.SHINGLE}-byte "
        f"substrings have Jaccard similarity ≥ {clustering.THRESHOLD:g}; a cluster is a connected component of the "
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
        f"**Test documents in clusters** ({rule}; {clustering.FILE}).  {len(sizes)} documents in {len(members)} "
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
            f"{arm.name}, {n} documents in {len(set(mapping.values()))} clusters ({arm.name}/{clustering.FILE})"
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
