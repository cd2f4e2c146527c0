"""linrope.analysis.clusters: the rule that groups test documents into clusters of near-duplicates (8-byte
shingles, Jaccard ≥ 0.2, connected components), checked against plain Python sets; and where a report gets the
clusters (linrope.analysis.evidence.document_clusters): the corpus here, else the recorded clusters.csv, else none."""

import math
import time
from pathlib import Path

import numpy as np
import pytest

from linrope.analysis import clusters as C
from linrope.analysis.cells import write_csv
from linrope.analysis.clusters import cluster_lines, document_clusters
from linrope.analysis.runs import Run
from linrope.base.errors import ResultsError

LN2 = math.log(2.0)


def text(rng, n: int) -> bytes:
    """n bytes of lower-case 'words': random, so two such texts share few 8-byte substrings."""
    letters = rng.integers(ord("a"), ord("z") + 1, n).astype(np.uint8)
    letters[rng.random(n) < 0.18] = ord(" ")
    return letters.tobytes()


def edited(rng, data: bytes, n: int) -> bytes:
    """``data`` with ``n`` bytes replaced (a near-copy: another codec table of one generator)."""
    out = bytearray(data)
    for i in rng.choice(len(out), n, replace=False):
        out[i] = ord("#")
    return bytes(out)


def reference(a: bytes, b: bytes, k: int = 8) -> float:
    """Jaccard similarity of the two documents' k-byte substrings, with Python sets."""
    sa = {a[i : i + k] for i in range(len(a) - k + 1)} if len(a) >= k else {a}
    sb = {b[i : i + k] for i in range(len(b) - k + 1)} if len(b) >= k else {b}
    return len(sa & sb) / len(sa | sb)


def test_similarities_are_the_jaccard_of_8_byte_substrings():
    rng = np.random.default_rng(0)
    base = text(rng, 3000)
    docs = [("a", base), ("b", edited(rng, base, 40)), ("c", base[:1500] + text(rng, 1500)), ("d", text(rng, 800)),
            ("e", b"tiny"), ("f", b"tiny"), ("g", b"tinx"), ("h", b"aaaaaaaaaaaa")]  # fmt: skip
    sim = C.similarities(docs)
    for i, (_, a) in enumerate(docs):
        for j, (_, b) in enumerate(docs):
            assert sim[i, j] == pytest.approx(reference(a, b), abs=1e-12), (docs[i][0], docs[j][0])
    assert 0.3 < sim[0, 1] < 1 and 0.2 < sim[0, 2] < 0.6 and sim[0, 3] < 0.01 and sim[4, 5] == 1 and sim[4, 6] == 0


def test_two_near_copies_are_one_cluster_and_unrelated_documents_are_their_own():
    rng = np.random.default_rng(1)
    table = text(rng, 4000)
    docs = [("one.py", text(rng, 2000)), ("table_a.py", table), ("two.py", text(rng, 3000)),
            ("table_b.py", edited(rng, table, 60)), ("three.py", text(rng, 500))]  # fmt: skip
    assert C.clusters(docs) == {"one.py": 0, "table_a.py": 1, "two.py": 2, "table_b.py": 1, "three.py": 3}
    renamed = [(f"x{i}", data) for i, (_, data) in enumerate(docs)]  # the rule reads bytes, never names
    assert list(C.clusters(renamed).values()) == [0, 1, 2, 1, 3]


def test_the_threshold_links_at_equality_and_not_below():
    """Two documents at Jaccard exactly J are linked at threshold J and not at the next float above it."""
    rng = np.random.default_rng(2)
    base = text(rng, 2000)
    docs = [("a", base), ("b", base[:700] + text(rng, 1300))]
    j = reference(docs[0][1], docs[1][1])
    assert 0.1 < j < 0.5
    assert C.clusters(docs, threshold=j) == {"a": 0, "b": 0}
    assert C.clusters(docs, threshold=float(np.nextafter(j, 1.0))) == {"a": 0, "b": 1}
    assert C.THRESHOLD == 0.2 and C.SHINGLE == 8
    with pytest.raises(ValueError, match="threshold"):
        C.clusters(docs, threshold=0.0)


def test_single_linkage_joins_a_chain_whose_ends_are_unrelated():
    """a ~ b and b ~ c, a and c unrelated: one cluster (connected components), the link is not transitive."""
    rng = np.random.default_rng(3)
    left, right = text(rng, 2000), text(rng, 2000)
    docs = [("a", left), ("c", right), ("b", left + right), ("d", text(rng, 1000))]
    assert reference(left, right) < 0.01 < C.THRESHOLD < reference(left, left + right)
    assert C.clusters(docs) == {"a": 0, "c": 0, "b": 0, "d": 1}


def test_records_name_each_documents_nearest_and_round_trip_through_clusters_csv(tmp_path):
    rng = np.random.default_rng(4)
    table = text(rng, 3000)
    docs = [("a", table), ("b", text(rng, 900)), ("c", edited(rng, table, 30))]
    rows = C.records(docs)
    assert [(r["document"], r["cluster"], r["bytes"], r["nearest"]) for r in rows] == [
        ("a", 0, 3000, "c"), ("b", 1, 900, "a"), ("c", 0, 3000, "a")]  # fmt: skip
    assert float(rows[0]["jaccard"]) == pytest.approx(reference(table, docs[2][1]), abs=1e-4)
    write_csv(rows, tmp_path / C.FILE)
    assert C.read(tmp_path / C.FILE) == C.clusters(docs)
    assert C.read(tmp_path / "missing.csv") is None
    with pytest.raises(ResultsError, match="documents named twice: a"):
        C.clusters([("a", b"x" * 20), ("a", b"y" * 20)])


def test_sixty_chapters_take_seconds():
    """A corpus of 60 chapters of 30 kB each: the rule stays cheap."""
    rng = np.random.default_rng(5)
    docs = [(f"chapter{i:02d}.txt", text(rng, 30_000)) for i in range(60)]
    start = time.perf_counter()
    assert len(set(C.clusters(docs).values())) == 60
    assert time.perf_counter() - start < 10.0


# ---- where a report gets its clusters ------------------------------------------------------------------------------
def corpus(folder: Path, rng) -> dict:
    """A folder corpus of 120 files whose test split holds two near-copies (its first and third files): {test file
    name: bytes}, in the split's order."""
    from linrope.data.bytes import split_of

    folder.mkdir()
    names = [f"f{k:03d}.txt" for k in range(120)]
    test = [n for n in names if split_of(n, 0.05, 0.05) == "test"]
    assert len(test) >= 4
    table = text(rng, 3000)
    for name in names:
        data = table if name == test[0] else edited(rng, table, 50) if name == test[2] else text(rng, 1500)
        (folder / name).write_bytes(data)
    return {name: (folder / name).read_bytes() for name in test}


def runs_over(folder: Path, path: str, where: Path) -> dict:
    """Two configurations × two seeds that scored every document of ``folder``'s test split."""
    from linrope.data.bytes import load_corpus

    split = load_corpus(str(folder), context=64)
    docs = [{"document": n, "bytes": b - a, "nats": (b - a) * 2.0 * LN2} for n, a, b in split.documents["test"]]
    row = dict(length=64, protocol="windows", scaling="none", window=None, status="ok", bpb=2.0,
               scored=len(split["test"]) - 1, per_document=docs)  # fmt: skip
    config = {"context": 64, "data.path": path}
    return {
        c: [Run(where / f"{c}-seed{s}", {**config, "seed": s}, {}, [dict(row)]) for s in (1, 2)] for c in ("a", "b")
    }


def test_a_report_computes_the_clusters_from_the_corpus_then_reads_them_recorded_else_says_none(tmp_path):
    rng = np.random.default_rng(6)
    files = corpus(tmp_path / "corpus", rng)
    study = tmp_path / "study"
    study.mkdir()
    groups = runs_over(tmp_path / "corpus", str(tmp_path / "corpus"), study)
    names = list(files)
    expected = {n: 0 if i == 2 else i - (i > 2) for i, n in enumerate(names)}  # the near-copies: one cluster
    # the corpus is here: computed, and recorded where the report writes
    assert document_clusters(groups, study, write=False) == (expected, "")
    assert not (study / C.FILE).exists()
    assert document_clusters(groups, study) == (expected, "")
    assert C.read(study / C.FILE) == expected
    # the corpus is gone: the recorded clusters, from the runs' folder when the report writes elsewhere
    gone = runs_over(tmp_path / "corpus", str(tmp_path / "nowhere"), study)
    assert document_clusters(gone, tmp_path / "elsewhere", write=False) == (expected, "")
    # neither: each document its own cluster, and why
    (study / C.FILE).unlink()
    grouping, why = document_clusters(gone, study)
    assert grouping is None and "cannot be read here" in why and f"no {C.FILE} records them" in why
    lines = "\n".join(cluster_lines(gone, grouping, why))
    assert f"each of the {len(names)} documents is its own cluster" in lines and "cannot be read here" in lines
    lines = "\n".join(cluster_lines(groups, expected, ""))
    n = len(names)
    assert f"{n} documents in {n - 1} clusters; of more than one document: {names[0]}, {names[2]} (6,002 bytes" in lines
