"""The published results hold together: every interval in ``docs/results/<study>/`` is recomputed from the
per-run values committed beside it (``runs.csv``), every table of a study committed in compact form
(linrope.analysis.compact: ``runs.json`` and ``curves.csv``, no run folders) is recomputed from those two files,
and every number ``docs/results.md`` (the claims, evidence protocol), ``docs/results-old-protocol.md`` (the record
of the studies before it) and README's results section (the headline lines) quote is one of those report tables'
numbers."""

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from linrope.analysis import study_config
from linrope.analysis.report import columns_for
from linrope.analysis.runs import TUNING
from linrope.analysis.stats import mean_ci, paired

pytestmark = pytest.mark.results  # committed study data: CI's results stage (pytest -m results)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
STUDIES = ("precision",)  # the sweeps (multirun folders, not compact) docs/results-old-protocol.md quotes
# a mean with its interval as the reports write it: "3.100 ± 0.248" (tables), "-0.150 [-0.274, -0.026]" (pairs)
NUMBER = re.compile(r"[+-]?\d+\.\d+ ± \d+\.\d+|[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\]")


def rows(path: Path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(text: str):
    return None if text in ("", None) else float(text)


def results_page() -> str:
    return (ROOT / "docs" / "results.md").read_text()


def old_protocol_page() -> str:
    return (ROOT / "docs" / "results-old-protocol.md").read_text()


def readme_results() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("study", STUDIES)
def test_the_study_is_committed_with_its_per_run_values(study):
    folder = RESULTS / study
    for name in ("report.md", "summary.csv", "pairs.csv", "runs.csv"):
        assert (folder / name).is_file(), f"{folder / name} missing"
    assert f"docs/results/{study}/report.md" in old_protocol_page()
    assert f"experiment={study}" in old_protocol_page()
    assert "docs/results.md" in readme_results()


@pytest.mark.parametrize("study", STUDIES)
def test_every_interval_is_recomputed_from_the_runs(study):
    folder = RESULTS / study
    values = defaultdict(dict)  # (task, configuration) -> seed -> headline value
    for r in rows(folder / "runs.csv"):
        header = columns_for(r["task"])[0][0]
        values[(r["task"], r["configuration"])][r["seed"]] = number(r[header])
    summary = rows(folder / "summary.csv")
    assert {(r["task"], r["configuration"]) for r in summary} == set(values)
    for r in summary:
        header = columns_for(r["task"])[0][0]
        seeds = values[(r["task"], r["configuration"])]
        iv = mean_ci(list(seeds.values()))
        assert int(r["n"]) == len(seeds) == iv.n
        assert number(r[f"{header} mean"]) == pytest.approx(iv.mean, abs=1e-12)
        assert number(r[f"{header} lo"]) == pytest.approx(iv.lo, abs=1e-12)
        assert number(r[f"{header} hi"]) == pytest.approx(iv.hi, abs=1e-12)
    checked = set()
    for r in rows(folder / "pairs.csv"):
        # runs.csv holds each run's headline value only: a pair at any other metric (an extrapolation length) would
        # rest on run folders that are not committed (studies with length tables are compact, recomputed below)
        assert r["metric"] == columns_for(r["task"])[0][1], f"{study}: pairs at {r['metric']} without their runs"
        res = paired(values[(r["task"], r["a"])], values[(r["task"], r["b"])])
        assert int(r["n"]) == res.diff.n
        assert number(r["mean difference"]) == pytest.approx(res.diff.mean, abs=1e-12)
        assert number(r["ci low"]) == pytest.approx(res.diff.lo, abs=1e-12)
        assert number(r["p"]) == pytest.approx(res.p, abs=1e-12)
        assert (r["resolved"] == "True") == res.diff.excludes_zero()
        checked.add((r["task"], r["a"], r["b"]))
    declared = study_config.for_runs([{"task_name": study}]).compared  # the study's config, as the report reads it
    present = {(t, a, b) for t, _ in values for a, b in declared if (t, a) in values and (t, b) in values}
    assert checked and present <= checked  # every declared pair (and those added with --pair)


@pytest.mark.parametrize("where", ["docs/results.md", "docs/results-old-protocol.md", "README.md"])
def test_every_interval_the_results_quote_is_in_a_committed_report(where):
    reports = "\n".join((RESULTS / s / "report.md").read_text() for s in STUDIES)
    reports += "\n".join(p.read_text() for s in ARMED for p in sorted((RESULTS / s).glob("*.md")))  # budget.md, …
    reports += "\n".join(p.read_text() for s in ARMED for p in sorted((RESULTS / s).glob("*/report.md")))
    text = {"docs/results.md": results_page, "README.md": readme_results}.get(where, old_protocol_page)()
    quoted = NUMBER.findall(text)
    assert len(quoted) >= (3 if where == "README.md" else 20), f"{where} quotes the study tables"
    missing = [q for q in quoted if q not in reports]
    assert not missing, f"{where} quotes numbers no committed report holds: {missing}"


# ---- studies run job by job (linrope study), committed in compact form, read by arm --------------------------------
ARMED = {
    "budget": ("steps", "budget.md"),
    "recall": ("width", "recall.md"),
    "headline": ("steps", "headline.md"),  # issue 34's studies, as they land
    "recall2/len32": ("width", "recall2.md"),
    "recall2/len64": ("width", "recall2.md"),
    "recall2/len64-steps3000": ("width", "recall2.md"),
    "offset2": ("steps", "offset2.md"),
    "prose": ("steps", "prose.md"),  # issue 55's second corpus
}
COMPACT_PARTS = sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("runs.json"))


def armed_studies():
    return [s for s in ARMED if (RESULTS / s / ARMED[s][1]).is_file()]


def test_the_job_by_job_studies_are_committed_in_compact_form():
    """Every arm of budget/ and recall/ and the recall calibration: runs.json, curves.csv and results.csv, and
    no run folder (1,072 files were 75)."""
    assert {"budget/steps800", "budget/steps3200", "recall/width64", "recall/width128", "recall/calibration"} <= set(
        COMPACT_PARTS
    )
    for part in COMPACT_PARTS:
        folder = RESULTS / part
        assert all((folder / f).is_file() for f in ("runs.json", "curves.csv", "results.csv")), part
        # (a tuning stage's runs are a compact part of their own, <part>/tuning/)
        assert not [p for p in folder.iterdir() if p.is_dir() and p.name != TUNING], (
            f"{part}: a run folder is committed"
        )


def finished(record: dict, rows: list) -> bool:
    """A compact run that finished: linrope study's record of it, or its last logged step its config's last."""
    if "study" in record:
        return True
    steps = [int(float(r["step"])) for r in rows if r.get("step")]
    return bool(steps) and max(steps) == record["config"]["trainer"]["max_steps"] - 1


@pytest.mark.parametrize("part", COMPACT_PARTS)
def test_a_compact_studys_report_is_recomputed_from_runs_json_and_curves_csv(part, tmp_path, monkeypatch):
    """linrope report of the compact files alone writes the committed report.md, summary.csv, runs.csv and
    pairs.csv again, byte for byte (the figures are drawn, not encoded: the same code writes the committed
    PNGs); every run is finished (its study record, or, for a run trained outside linrope study, curves that reach
    its max_steps), has provenance and curves, and results.csv is what linrope.analysis.compact writes of them."""
    from linrope.analysis import compact
    from linrope.analysis.report import build_report
    from linrope.analysis.runs import compact_records, find_runs

    folder = RESULTS / part
    records = compact_records(folder)
    assert records and all(finished(r, rows) and r["provenance"] and rows for r, rows in records)
    assert [r.path.name for r in find_runs(folder)] == sorted(r["run"] for r, _ in records)
    assert compact.results_csv(records) == (folder / "results.csv").read_text()
    pairs = (
        list(dict.fromkeys((r["a"], r["b"]) for r in rows(folder / "pairs.csv")))
        if (folder / "pairs.csv").is_file()
        else []
    )
    monkeypatch.setattr("linrope.base.plots.save", lambda fig, path, dpi=130: path)
    monkeypatch.chdir(ROOT)  # the report names its folder as given
    if (folder / "references.csv").is_file():  # the reference rows as committed (another Python: other stdlib text)
        from linrope.analysis.report import files as report_files

        (tmp_path / "references.csv").write_bytes((folder / "references.csv").read_bytes())
        report_files.record(tmp_path, ["references.csv"])  # as a report leaves it: its own file, read, not refitted
    report = folder / "report.md"
    # reported with --allow-mixed; a folder without report.md (a study's tuning runs) has no report to compare, and
    # its runs may span codes (an arm added later is tuned beside the first arms' runs)
    mixed = not report.is_file() or report.read_text().startswith("**Mixed provenance: ")
    build_report([Path("docs/results") / part], tmp_path, pairs, allow_mixed=mixed)
    for name in ("report.md", "summary.csv", "runs.csv", "pairs.csv", "evidence.csv"):
        if (folder / name).is_file():
            assert (tmp_path / name).read_text() == (folder / name).read_text(), f"{part}/{name}"


@pytest.mark.parametrize("study", armed_studies())
def test_an_armed_studys_table_is_recomputed_from_its_committed_runs(study):
    """budget.md / recall.md equal what linrope report computes from the compact runs committed beside them and
    the study's config (conf/study/<study>.yaml); each arm's runs.csv matches its runs."""
    from linrope.analysis.arms import arm_folders, arms_table
    from linrope.analysis.runs import find_runs

    prefix, table = ARMED[study]
    folder = RESULTS / study
    config = study_config.for_runs(find_runs(folder))
    assert (
        config.name == study.split("/")[0] and config.arms["folder"] == prefix and f"{config.table['file']}.md" == table
    )
    committed = (folder / table).read_text()
    mixed = committed.startswith("**Mixed provenance", len(committed.split("\n\n")[0]) + 2)  # said at its top
    assert arms_table(folder, config, reports=False, write=False, allow_mixed=mixed) == committed
    for arm in arm_folders(folder, config):
        if not find_runs(arm):  # only its tuning stage has run so far: its tuning runs are committed
            assert (arm / "tuning.json").is_file() and f"{arm.relative_to(RESULTS).as_posix()}/tuning" in COMPACT_PARTS
            continue
        assert arm.relative_to(RESULTS).as_posix() in COMPACT_PARTS
        runs = {str(r.path.name): r for r in find_runs(arm)}
        committed = rows(arm / "runs.csv")
        assert len(committed) == len(runs)
        for r in committed:
            run = runs[Path(r["run"]).name]
            header = columns_for(r["task"])[0][0]
            assert number(r[header]) == pytest.approx(run.value(header, "last"), abs=1e-12)


@pytest.mark.parametrize(
    "manifest", sorted(RESULTS.rglob(".linrope-outputs.json")), ids=lambda p: str(p.parent.relative_to(RESULTS))
)
def test_every_committed_report_is_as_its_report_wrote_it(manifest):
    """A report's folder lists the SHA-256 of each file it wrote (linrope.analysis.report.files): a committed file
    edited by hand makes README's ``python -m linrope report docs/results/<study>`` refuse to run on a fresh
    clone (the tables recomputed above cannot see it: they are built without writing)."""
    import hashlib
    import json

    listed = json.loads(manifest.read_text())
    changed = [n for n, sha in listed.items() if hashlib.sha256((manifest.parent / n).read_bytes()).hexdigest() != sha]
    assert not changed, f"edited since the report wrote them: {changed}; run python -m linrope report on the folder"
