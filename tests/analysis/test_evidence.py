"""The evidence section of a bytes report (linrope.analysis.evidence): scored text, reference rows, failed seeds
as counts, intervals over seeds and documents with raw and adjusted p, the loss by position."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linrope.analysis.evidence import documents_of, row_for, section
from linrope.analysis.runs import Run
from tests.analysis.helpers import write_references

LN2 = math.log(2.0)
DOCS = [f"doc{i}.py" for i in range(6)]
ROOT = Path(__file__).resolve().parents[2]


def fake_run(config: str, seed: int, shift: float, rng, *, diverged: bool = False) -> Run:
    """A run whose per-document bpb is 2 + shift + document and seed noise, at 64 (the test's windows) and 128."""
    rows = []
    for length, protocol, window in ((64, "windows", None), (128, "sliding", None), (128, "windows", None),
                                     (128, "windows", 64)):  # fmt: skip
        docs = []
        for i, name in enumerate(DOCS):
            n = 1000 + 100 * i
            bpb = 2.0 + shift + 0.05 * i + 0.01 * seed + rng.normal(0, 0.01) + (0.1 if length == 128 else 0)
            docs.append({"document": name, "bytes": n, "nats": bpb * n * LN2})
        nats, nbytes = sum(d["nats"] for d in docs), sum(d["bytes"] for d in docs)
        row = dict(length=length, factor=length / 64, protocol=protocol, scaling="none", window=window,
                   loss=nats / nbytes, bpb=nats / nbytes / LN2, acc=None, examples=1, scored=nbytes,
                   documents=len(docs), stride=length, scored_hash="x", seconds=0.0, status="ok",
                   per_document=docs)  # fmt: skip
        if protocol == "windows":
            row["per_position"] = [
                {"start": s, "end": s + 16, "bytes": 100, "nats": (2.0 + shift + s / 1000) * 100 * LN2}
                for s in range(0, length, 16)
            ]
        rows.append(row)
    test = float("nan") if diverged else rows[0]["bpb"]
    series = {"test/bpb": [(10, test)], "test/bytes": [(10, 9000.0)], "test/documents": [(10, 6.0)]}
    return Run(Path(f"/x/{config}-seed{seed}"), {"seed": seed, "context": 64, "model.name": config}, series, rows)


@pytest.fixture
def groups():
    rng = np.random.default_rng(0)
    return {
        "a": [fake_run("a", s, -0.10, rng) for s in (1, 2, 3)],
        "b": [fake_run("b", s, 0.0, rng) for s in (1, 2, 3)],
        "c": [fake_run("c", s, 0.001, rng, diverged=s == 2) for s in (1, 2, 3)],
    }


def test_a_metric_reads_its_row_and_the_documents(groups):
    run = groups["a"][0]
    assert row_for(run, "test/bpb")["length"] == 64 and row_for(run, "test/bpb")["protocol"] == "windows"
    assert row_for(run, "bpb@128")["protocol"] == "sliding"
    assert row_for(run, "bpb@128 windows window64")["window"] == 64
    assert row_for(run, "bpb@4096") is None
    cells = documents_of(groups["a"], "test/bpb")
    assert sorted(cells) == [1, 2, 3] and sorted(cells[1]) == DOCS and cells[1]["doc0.py"][1] == 1000


def test_the_section_has_every_part_and_adjusted_p(groups, tmp_path):
    every = [r for runs in groups.values() for r in runs]
    write_references(tmp_path / "references.csv", every, {"unigram": 4.5, "5-gram": lambda key: 1.5 + key[1] / 1000})
    comparisons = [
        ("A beats B", "test/bpb", "a", "b"),
        ("A beats B at 2x", "bpb@128", "a", "b"),
        ("C against B", "test/bpb", "c", "b"),
        ("no such row", "bpb@4096", "a", "b"),
    ]
    lines, records = section(groups, comparisons, tmp_path)
    text = "\n".join(lines)
    assert "| a | 3 | 9,000 bytes, 6 documents |" in text  # the scored text
    assert "| row (windows) | unigram bpb | 5-gram bpb |" in text  # the reference rows, one per model row:
    assert "| test/bpb = bpb@64 windows (windows of 64) | 4.500 | 1.564 |" in text  # the test's own windows
    assert "| bpb@128 windows window64 (windows of 128, last 64 keys) | 4.500 | 1.628 |" in text
    assert "| c | 1 of 3 seeds fail (1 diverged); the other 2:" in text  # a failed seed is a count
    assert [r["claim"] for r in records] == ["A beats B", "A beats B at 2x", "C against B"]  # no row: no comparison
    first = records[0]
    assert first["diff"] == pytest.approx(-0.10, abs=0.01) and first["lo"] < first["diff"] < first["hi"] < 0
    assert first["p"] <= first["p_bh"] <= first["p_holm"] and first["verdict"] == "resolved"
    assert first["family_lo"] < first["lo"]  # the simultaneous interval is wider
    third = records[2]
    assert third["seeds"] == 2 and "failed seeds left out: c 2" in third["note"]
    assert "| A beats B | a − b | test/bpb |" in text and "p Holm" in text and "p BH" in text
    # p far below what 10 000 replicates of 3 seeds × 6 documents resolve is printed as "< 0.001", never 1e-12
    assert first["p"] < 1e-5 and first["p_floor"] == pytest.approx(1e-3)
    row = next(line for line in text.splitlines() if line.startswith("| A beats B | a − b | test/bpb |"))
    assert row.split(" | ")[5:8] == ["< 0.001"] * 3 and "e-" not in row
    assert (
        "No p is printed below what the bootstrap resolves" in text
        and '(0.001 here); a p below it reads "< floor"' in text
    )
    # no corpus with these documents here and none recorded: each document its own cluster, said
    assert first["clusters"] == 6 and "**Test documents in clusters:** none known (" in text
    assert "each of the 6 documents is its own cluster" in text
    # the loss by position, beside the context-limited control, and its figure
    assert "| a, last 64 keys | 128 |" in text and (tmp_path / "positions.png").stat().st_size > 0


def test_the_section_draws_the_clusters_recorded_beside_it(groups, tmp_path):
    """With a clusters.csv in the report's folder (and no corpus here with these documents), the comparisons
    resample those clusters: the Evidence section's estimate is the bootstrap with them."""
    from linrope.analysis import clusters
    from linrope.analysis.bootstrap import bpb_difference
    from linrope.analysis.cells import write_csv

    grouping = {d: int(d[3]) // 2 for d in DOCS}  # three clusters of two documents
    rows = [{"document": d, "cluster": k, "bytes": 1, "nearest": "", "jaccard": ""} for d, k in grouping.items()]
    write_csv(rows, tmp_path / clusters.FILE)
    lines, records = section(groups, [("A beats B", "test/bpb", "a", "b")], tmp_path)
    text = "\n".join(lines)
    cells = {c: documents_of(groups[c], "test/bpb") for c in ("a", "b")}
    expected = bpb_difference(cells, "a", "b", clusters=grouping)
    assert records[0]["clusters"] == 3 and (records[0]["lo"], records[0]["hi"]) == (expected.lo, expected.hi)
    assert "6 documents in 3 clusters; of more than one document: doc0.py, doc1.py (" in text


def diverge_at(run: Run, length: int, protocol: str) -> None:
    """The run's loss at one row turns NaN (it diverged at that length only; its test is fine)."""
    for row in run.extrapolation:
        if row["length"] == length and row["protocol"] == protocol:
            row["bpb"] = float("nan")
            for d in row["per_document"]:
                d["nats"] = float("nan")


def test_a_seed_that_diverged_at_one_row_is_left_out_there_and_counted(groups, tmp_path):
    """b's seed 2 is NaN at the 2x sliding row only: that comparison leaves the seed out and says so (no report
    stops on it), counts it above the unigram (no verdict); the test's comparison keeps all three seeds."""
    diverge_at(groups["b"][1], 128, "sliding")
    comparisons = [("A beats B", "test/bpb", "a", "b"), ("A beats B at 2x", "bpb@128", "a", "b")]
    _, records = section(groups, comparisons, tmp_path)  # no references: left out, said in the note
    assert records[0]["seeds"] == 3 and records[0]["note"] == ""
    assert records[1]["seeds"] == 2 and records[1]["note"] == "failed seeds left out: b 2"
    assert records[1]["verdict"] in ("resolved", "not resolved") and math.isfinite(records[1]["diff"])
    write_references(tmp_path / "references.csv", [r for runs in groups.values() for r in runs], {"unigram": 4.5})
    _, records = section(groups, comparisons, tmp_path)
    assert records[0]["verdict"] == "resolved"
    assert records[1]["verdict"] == "no verdict (above the unigram at this row: b 1 of 3)"
    # a study's claim at that row (report.claims: the bootstrap over the seeds that kept finite documents)
    from linrope.analysis.report.claims import claim_results
    from linrope.analysis.study_config import Claim

    claim = Claim("A beats B at 2x", "bpb@128", "a", "b")
    result = claim_results(groups, [claim])[claim]
    assert result.seeds == (1, 3) and result.diff.n == 2 and math.isfinite(result.diff.mean)


def test_a_comparison_left_with_one_seed_has_no_test(tmp_path):
    """Two of c's three seeds failed: one seed is left, no interval and no p; the verdict says there was no test
    (not "not resolved", which reads as a test that could not tell)."""
    rng = np.random.default_rng(1)
    groups = {"a": [fake_run("a", s, -0.1, rng) for s in (1, 2, 3)]}
    groups["c"] = [fake_run("c", s, 0.0, rng, diverged=s != 1) for s in (1, 2, 3)]
    _, (record,) = section(groups, [("A beats C", "test/bpb", "a", "c")], tmp_path)
    assert record["seeds"] == 1 and record["p_holm"] is None
    assert record["verdict"] == "no test (fewer than 2 seeds)" and record["note"] == "failed seeds left out: c 2, 3"


def test_the_loss_by_position_has_one_set_of_bands_whatever_the_order(tmp_path):
    """b's table ends at the training context (no rows at 128): every row shares the header's bands (b's past 64
    are "–"), listed first or last (the header was the last configuration's, so a row had more cells)."""
    from linrope.analysis.evidence import position_lines

    rng = np.random.default_rng(2)
    a, b = [fake_run("a", s, -0.1, rng) for s in (1, 2)], [fake_run("b", s, 0.0, rng) for s in (1, 2)]
    for run in b:
        run.extrapolation[:] = [r for r in run.extrapolation if r["length"] == 64]
    for groups in ({"a": a, "b": b}, {"b": b, "a": a}):
        rows = [row for text in position_lines(groups, tmp_path) for row in text.splitlines() if row.startswith("|")]
        assert rows[0] == "| configuration | length | positions 0–31 | positions 32–63 | positions 64–127 |"
        assert all(row.count("|") == rows[0].count("|") for row in rows)
        assert next(row for row in rows if row.startswith("| b |")).endswith("| – |")


def test_a_row_above_the_unigram_is_counted_and_its_comparison_gets_no_verdict(groups, tmp_path):
    """A unigram between b's test rows and its rows at 128: every b seed collapsed at 128 (counted per row), none
    at the test, so "A beats B" keeps its verdict and "A beats B at 2x" gets none (still in the family)."""
    rows = {m: [row_for(r, m)["bpb"] for r in groups["b"]] for m in ("test/bpb", "bpb@128")}
    bar = (max(rows["test/bpb"]) + min(rows["bpb@128"])) / 2
    assert max(rows["test/bpb"]) < bar < min(rows["bpb@128"])
    write_references(tmp_path / "references.csv", [r for runs in groups.values() for r in runs], {"unigram": bar})
    comparisons = [("A beats B", "test/bpb", "a", "b"), ("A beats B at 2x", "bpb@128", "a", "b")]
    lines, records = section(groups, comparisons, tmp_path)
    text = "\n".join(lines)
    assert "| configuration | bpb@64 windows | bpb@128 | bpb@128 windows | bpb@128 windows window64 |" in text
    assert "| a | 0 of 3 | 0 of 3 | 0 of 3 | 0 of 3 |" in text  # a stays below the bar everywhere
    assert "| b | 0 of 3 | **3 of 3** | **3 of 3** | **3 of 3** |" in text
    assert records[0]["verdict"] == "resolved" and records[0]["above_unigram"] == ""
    assert records[1]["verdict"] == "no verdict (above the unigram at this row: b 3 of 3)"
    assert records[1]["diff"] < 0 and records[1]["p_holm"] is not None  # shown, and counted in the family
    assert "1 at a row above the unigram get no verdict" in text


def test_a_run_still_training_has_no_scored_text_yet(groups, tmp_path):
    """A study reported while a run trains: the run has no test values yet, and the scored text lists the others."""
    write_references(tmp_path / "references.csv", [r for runs in groups.values() for r in runs], {"unigram": 4.5})
    groups["a"].append(Run(Path("/x/a-seed4"), {"seed": 4, "context": 64, "model.name": "a"}, {}, []))
    lines, _ = section(groups, [("A beats B", "test/bpb", "a", "b")], tmp_path)
    assert "| a | 4 | 9,000 bytes, 6 documents |" in "\n".join(lines)


def test_a_collapsed_configuration_gets_no_verdict(groups, tmp_path):
    write_references(tmp_path / "references.csv", [r for runs in groups.values() for r in runs], {"unigram": 1.5})
    lines, records = section(groups, [("A beats B", "test/bpb", "a", "b")], tmp_path)
    assert "3 of 3 seeds stall (> 1.5)" in "\n".join(lines)
    assert records[0]["verdict"] == "no verdict (every seed failed)" and records[0]["diff"] is None


@pytest.mark.slow
def test_a_tiny_study_reports_its_evidence(tmp_path):
    """A study run with the study command, then its report: every part of the evidence, from real runs."""
    study = tmp_path / "study"
    common = ["experiment=headline", "model=linear,linear_rope", "seed=1,2", "size=tiny", "context=32",
              "trainer.max_steps=150", "trainer.val_check_interval=50", "data.max_bytes=300000",
              "extrapolation.factors=[1,4]", "optim.lr=3e-3"]  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "linrope", "study", str(study), *common, "--jobs", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "linrope", "report", str(study)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    report = (study / "report.md").read_text()
    from linrope.data.bytes import load_corpus

    test = load_corpus(None, context=128, max_bytes=300000)
    n, docs = len(test["test"]) - 1, len(test.documents["test"])
    assert f"| linear_rope | 2 | {n:,} bytes, {docs} documents | {n:,} bytes, {docs} documents |" in report
    assert "**Reference rows**" in report and "5-gram" in report and (study / "references.csv").is_file()
    assert "| linear_rope, last 32 keys | 128 |" in report and (study / "positions.png").is_file()
    rows = list(csv.DictReader(open(study / "evidence.csv")))
    assert {r["metric"] for r in rows} >= {"test/bpb"} and all(r["p_holm"] for r in rows if r["lo"])


def refs_of(groups, folder: Path, values):
    """The reference rows ``values`` ({model: bpb or a function of the row's key}) at every model row of ``groups``."""
    from linrope.analysis.evidence import read_references

    write_references(folder / "references.csv", [r for runs in groups.values() for r in runs], values)
    return read_references(folder)


def test_the_extrapolation_table_has_a_row_per_protocol_and_the_reference_rows(groups, tmp_path):
    """Each configuration's sliding, non-overlapping and context-limited rows (not only the first row of a length),
    the references at every length, and the paired differences on the sliding rows."""
    from linrope.analysis.report.lengths import extrapolation_table
    from linrope.analysis.stats import paired

    pair_rows = []
    refs = refs_of(
        groups, tmp_path, {"unigram": 4.5, "5-gram": lambda key: 1.5 + key[1] / 1000 + (key[0] == "sliding")}
    )
    lines = extrapolation_table("bytes", groups, [("a", "b")], pair_rows, "bpb", references=refs)
    text = "\n".join(lines)
    rows = [line for line in text.splitlines() if line.startswith("| a |")]
    cells = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in rows}
    assert set(cells) == {("a", "as trained"), ("a", "as trained, windows"), ("a", "as trained, windows, last 64 keys")}
    assert cells[("a", "as trained")].split("|")[3].strip() == "n/a"  # no sliding row at 64
    assert "| *unigram (train split)* | reference, as trained | – | 4.500 |" in text and "last N keys" in text
    # each protocol's reference through that protocol's windows: 1.564 at the test's windows of 64, not one value
    assert "| *5-gram (train split)* | reference, as trained | – | 2.628 |" in text
    assert "| *5-gram (train split)* | reference, as trained, windows | 1.564 | 1.628 |" in text
    assert "| *5-gram (train split)* | reference, as trained, windows, last 64 keys | – | 1.628 |" in text
    sliding = {g: {r.seed: row_for(r, "bpb@128")["bpb"] for r in groups[g]} for g in ("a", "b")}
    at_128 = next(r for r in pair_rows if r["metric"] == "bpb@128")
    assert at_128["mean difference"] == pytest.approx(paired(sliding["a"], sliding["b"]).diff.mean)


def test_the_reference_rows_stand_in_the_test_table_and_a_collapsed_mean_is_marked(groups, tmp_path):
    """The task table ends with the references' test bpb; at a length where a configuration's mean is above the
    unigram, its cell says so."""
    from linrope.analysis.report import task_section
    from linrope.analysis.report.lengths import extrapolation_table

    refs = refs_of(
        groups, tmp_path, {"unigram": 4.5, "5-gram": lambda key: 1.7 if key == ("windows", 64, 64, None) else 9}
    )
    text = "\n".join(task_section("bytes", groups, [], tmp_path, "", [], [], [], refs))
    assert "| *unigram (train split)* | reference | – | – | – | – | 4.500 |" in text
    assert "| *5-gram (train split)* | reference | – | – | – | – | 1.700 |" in text  # the test's windows
    sliding = {g: [row_for(r, "bpb@128")["bpb"] for r in groups[g]] for g in ("a", "b")}
    bar = (max(sliding["a"]) + min(sliding["b"])) / 2  # a's mean below it, b's above
    refs = refs_of(groups, tmp_path, {"unigram": lambda key: bar if key[0] == "sliding" else 99.0})  # this row's bar
    lines = "\n".join(extrapolation_table("bytes", groups, [], [], "bpb", references=refs)).splitlines()
    row = {line.split("|")[1].strip(): line for line in lines if "| as trained |" in line}
    assert "(collapsed)" in row["b"].split("|")[4] and "(collapsed)" not in row["a"]


def test_a_study_table_reads_the_bootstrap_over_documents_where_the_runs_kept_them(groups):
    """linrope.analysis.arms: a claim between configurations whose runs kept their loss per document is the paired
    bootstrap over seeds and documents (the Evidence section's estimate); a run without them: a t over seeds."""
    from linrope.analysis.bootstrap import bpb_difference
    from linrope.analysis.report.claims import Boot, claim_results
    from linrope.analysis.stats import Paired
    from linrope.analysis.study_config import Claim

    claim = Claim("a beats b", "test/bpb", "a", "b")
    r = claim_results(groups, [claim])[claim]
    expected = bpb_difference({c: documents_of(groups[c], "test/bpb") for c in ("a", "b")}, "a", "b")
    assert isinstance(r, Boot) and r.diff.n == 3 and r.seeds == (1, 2, 3)
    assert (r.diff.mean, r.diff.lo, r.diff.hi, r.p) == (expected.value, expected.lo, expected.hi, expected.p)
    assert r.estimate.interval(0.99)[0] < r.diff.lo  # a wider level, from the same replicates
    grouping = {d: int(d[3]) // 2 for d in DOCS}  # three clusters of two documents: drawn as clusters
    r = claim_results(groups, [claim], clusters=grouping)[claim]
    expected = bpb_difference({c: documents_of(groups[c], "test/bpb") for c in ("a", "b")}, "a", "b", clusters=grouping)
    assert r.estimate.clusters == 3 and (r.diff.lo, r.diff.hi, r.p) == (expected.lo, expected.hi, expected.p)
    groups["b"][0].extrapolation = []  # seed 1 of b lost its documents: the seeds alone
    assert isinstance(claim_results(groups, [claim])[claim], Paired)


def test_the_position_figure_merges_buckets_into_log_spaced_bins_exactly():
    """64 buckets of 32 bytes (a 2 048-byte window): the first four kept, then 4 bins per doubling (16 from 128 to
    2 048); every byte and nat is in exactly one bin, and each bin's bpb is its buckets' pooled bpb."""
    from linrope.analysis.evidence import log_bins

    rng = np.random.default_rng()
    buckets = [
        {"start": s, "end": s + 32, "bytes": int(n), "nats": float(n * b)}
        for s, n, b in zip(range(0, 2048, 32), rng.integers(50, 100, 64), rng.uniform(1, 3, 64))
    ]
    bins = log_bins(buckets)
    assert len(bins) == 4 + 16
    assert [m for m, _, _ in bins[:4]] == [16, 48, 80, 112]
    assert sum(n for _, n, _ in bins) == sum(d["bytes"] for d in buckets)
    assert sum(x for _, _, x in bins) == pytest.approx(sum(d["nats"] for d in buckets), rel=1e-12)
    mids = [m for m, _, _ in bins]
    assert mids == sorted(mids) and bins[-1][0] == pytest.approx((1728 + 2048) / 2)
    last = [d for d in buckets if d["start"] >= 1728]  # the last bin: from 2^(15/4)·128 ≈ 1 722, bucket 1 728 on
    assert bins[-1][2] / bins[-1][1] == pytest.approx(sum(d["nats"] for d in last) / sum(d["bytes"] for d in last))
