"""A study's compact results (linrope.analysis.compact) read back as the same runs as its run folders
(linrope.analysis.runs.find_runs): a tiny study fabricated by hand, written compact, its folders removed."""

import csv
import json
import shutil
from dataclasses import astuple

from linrope.analysis import compact
from linrope.analysis.runs import find_runs, group_runs
from tests.analysis.helpers import fake_run


def study(tmp_path):
    s = tmp_path / "study"
    fake_run(s / "a-seed1", "a", 1)
    fake_run(s / "a-seed2", "a", 2, parameters=False)
    fake_run(s / "b-seed1", "b", 1, extrapolation=False)
    fake_run(s / "b-seed2", "b", 2, lr=1e-3)  # another setting: a configuration of its own
    fake_run(s / "b-seed3", "b", 3, finished=False)  # still training
    return s


def test_the_compact_files_read_back_as_the_same_runs(tmp_path):
    s = study(tmp_path)
    before = find_runs(s)
    assert len(before) == 5 and before[1].n_params == 1234 and before[0].position == {"slopes": {"moved": 0.5}}
    assert compact.write(s) == 5
    assert find_runs(s) == before  # the folders win: nothing is read twice
    for run in s.iterdir():
        if run.is_dir():
            shutil.rmtree(run)
    after = find_runs(s)
    assert [astuple(r) for r in after] == [astuple(r) for r in before]  # path, config, curves, tables, provenance
    assert [repr(astuple(r)) for r in after] == [repr(astuple(r)) for r in before]  # and the types of every value
    assert after[0].config["model.name"] == "a_logged" and after[0].config["optim.betas"] == [0.9, 0.95]
    assert after[0].series["val/bpb"] == [(1, 3.35), (3, 3.1)]
    assert len(after[0].extrapolation) == 4 and after[0].extrapolation[1] == {
        "length": 16,
        "factor": 2.0,
        "protocol": "sliding",
        "scaling": "none",
        "window": None,
        "loss": 2.5,
        "bpb": 4.1,
        "acc": None,
        "examples": 5,
        "scored": 80,
        "bytes": None,  # a table from before the column: no value
        "documents": None,
        "stride": 8,
        "scored_hash": "abc",
        "seconds": 0.5,
        "status": "ok",
    }
    assert after[0].provenance["linrope"]["code"] == "abcdefabcdef" and (after[1].n_params, after[1].position) == (
        1234,
        {},
    )
    labels = {
        task: {label: [r.path for r in runs] for label, runs in g.items()} for task, g in group_runs(after).items()
    }
    assert labels == {
        task: {label: [r.path for r in runs] for label, runs in g.items()} for task, g in group_runs(before).items()
    }
    assert set(labels["bytes"]) == {"a_logged", "b_logged lr=0.001", "b_logged lr=0.003"}
    assert compact.write(s) == 5  # written again from the compact files alone: the same files
    assert find_runs(s) == after


def test_a_study_writes_its_finished_runs_and_a_folder_still_there_wins(tmp_path):
    s = study(tmp_path)
    assert compact.write(s, finished_only=True) == 4
    records = json.loads((s / "runs.json").read_text())["runs"]
    assert [r["run"] for r in records] == ["a-seed1", "a-seed2", "b-seed1", "b-seed2"]
    assert records[0]["study"]["wall_s"] == 6.0 and records[0]["config"]["data"]["seed"] == "${seed}"
    metrics = s / "a-seed1" / "csv" / "metrics.csv"
    metrics.write_text(metrics.read_text().replace(",,3.0375", ",,2.5"))  # the folder changed since
    shutil.rmtree(s / "a-seed2")
    runs = {r.path.name: r for r in find_runs(s)}
    assert set(runs) == {"a-seed1", "a-seed2", "b-seed1", "b-seed2", "b-seed3"}
    assert runs["a-seed1"].value("test/bpb", "last") == 2.5  # the folder, not its older record
    assert runs["a-seed2"].value("test/bpb", "last") == 3.1375  # the record of a folder gone


def test_results_csv_is_one_row_per_run_with_every_last_value_and_its_provenance(tmp_path):
    s = study(tmp_path)
    compact.write(s)
    with open(s / "results.csv", newline="") as f:
        table = {r["run"]: r for r in csv.DictReader(f)}
    assert list(table) == ["a-seed1", "a-seed2", "b-seed1", "b-seed2", "b-seed3"]
    a = table["a-seed1"]
    assert list(a)[:10] == [
        "run",
        "model",
        "task",
        "seed",
        "job",
        "steps",
        "n_params",
        "test/bpb",
        "val/bpb",
        "train/loss",
    ]
    assert (a["model"], a["seed"], a["job"], a["steps"], a["n_params"]) == (
        "a_logged",
        "1",
        "model=a seed=1",
        "4",
        "999",
    )
    assert (float(a["test/bpb"]), float(a["val/bpb"]), float(a["train/loss"])) == (3.0375, 3.1, 3.225)
    assert (a["bpb@8"], a["bpb@16"], a["bpb@16 pi"]) == ("3.1", "4.1", "3.6") and "bpb@32" not in a
    assert (a["commit"], a["code"], a["torch"], a["machine"], a["threads"], a["wall_s"]) == (
        "c" * 40,
        "abcdefabcdef",
        "2.13.0",
        "AMD EPYC",
        "1",
        "6.0",
    )
    assert table["b-seed1"]["bpb@8"] == "" and table["b-seed3"]["job"] == "model=b" and table["b-seed3"]["wall_s"] == ""


def test_details_written_before_the_tokens_column_read_as_bytes_rows(tmp_path):
    """Per-position and per-document files from runs before text runs (no ``tokens`` column; the headline study's
    runs) attach to their rows with ``tokens`` blank, as a bytes row writes it today."""
    from linrope.analysis.runs import attach
    from linrope.evaluation.tables import read_details

    path = tmp_path / "extrapolation_positions.csv"
    path.write_text("length,protocol,scaling,window,start,end,bytes,nats\n128,windows,none,,0,32,100,70.5\n")
    rows = [{"length": 128, "protocol": "windows", "scaling": "none", "window": None}]
    attach(rows, read_details(path), "positions")
    assert rows[0]["per_position"] == [{"start": 0, "end": 32, "bytes": 100, "nats": 70.5, "tokens": None}]


def test_runs_of_two_tokenizers_under_one_path_are_two_configurations():
    """Issue 52, case 2: a study's next job trained on a tokenizer rewritten under the same path; its runs are another
    configuration (a label of their own), not averaged with the first into one value."""
    from pathlib import Path

    from linrope.analysis.runs import Run

    def run(seed, sha):
        prov = {"data": {"tokenizer": {"sha256": sha}, "corpus": {"content": "c1"}}}
        config = {"model.name": "linear_rope", "data.tokenizer": "tok.json", "seed": seed}
        return Run(Path(f"r{seed}{sha}"), config, {}, provenance=prov)

    groups = group_runs([run(1, "aaaa"), run(2, "aaaa"), run(1, "bbbb")])["bytes"]
    assert sorted(len(rs) for rs in groups.values()) == [1, 2] and len(groups) == 2, groups
    assert all("sha256=" in label for label in groups), list(groups)


def test_a_resume_that_logged_nothing_still_finds_its_run(tmp_path):
    """A resume that stopped before it logged (its checkpoint already at max_steps) leaves only
    metrics.before-resume-0.csv: the run is still found, its curves read from that history."""
    from linrope.analysis.runs import metrics_files, read_metrics, run_folders

    run_dir = tmp_path / "sweep" / "0"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("model:\n  name: m\n")
    (run_dir / "csv").mkdir()
    (run_dir / "csv" / "metrics.before-resume-0.csv").write_text("step,val/bpb\n0,3.0\n10,2.5\n")
    assert run_folders(tmp_path / "sweep") == [(run_dir, run_dir / "csv" / "metrics.csv")]
    assert metrics_files(run_dir) == [run_dir / "csv" / "metrics.csv"]
    assert read_metrics(run_dir / "csv" / "metrics.csv") == {"val/bpb": [(0, 3.0), (10, 2.5)]}


def test_a_resumed_runs_history_before_the_resume_is_kept(tmp_path):
    """linrope.run.loggers renames metrics.csv to metrics.before-resume-<k>.csv when a run resumes; the resumed run
    logs again from its checkpoint's step.  The curves (and a compact copy) hold every step once, the earlier file's
    rows up to where the next one starts (a resumed run's compact copy kept only the rows after the resume)."""
    from linrope.analysis.runs import metrics_rows

    d = tmp_path / "csv"
    d.mkdir()
    (d / "metrics.before-resume-0.csv").write_text("step,val/bpb\n0,3.0\n10,2.5\n20,2.4\n")
    (d / "metrics.before-resume-1.csv").write_text("step,val/bpb,train/loss\n20,2.45,1.0\n30,2.3,0.9\n")
    (d / "metrics.csv").write_text("step,train/loss\n30,0.95\n40,0.8\n")
    columns, rows = metrics_rows(d / "metrics.csv")
    assert columns == ["step", "val/bpb", "train/loss"]
    assert [(r["step"], r.get("val/bpb"), r.get("train/loss")) for r in rows] == [
        ("0", "3.0", None), ("10", "2.5", None), ("20", "2.45", "1.0"), ("30", None, "0.95"), ("40", None, "0.8")
    ]  # fmt: skip


def test_a_test_logged_at_step_0_does_not_cut_the_history_before_a_resume(tmp_path):
    """Under ddp_spawn the test runs in a fresh process and logs at step 0: the resumed file then "started" at 0 and
    every row before the resume was dropped (a resumed run's validation curve was its last point). Where a file
    starts is read from its training and validation rows."""
    from linrope.analysis.runs import metrics_rows

    d = tmp_path / "csv"
    d.mkdir()
    (d / "metrics.before-resume-0.csv").write_text("step,val/bpb\n1,3.0\n3,2.5\n")
    (d / "metrics.csv").write_text("step,val/bpb,test/bpb\n5,2.4,\n0,,2.35\n")
    _, rows = metrics_rows(d / "metrics.csv")
    assert [(r["step"], r.get("val/bpb") or r.get("test/bpb")) for r in rows] == [
        ("1", "3.0"), ("3", "2.5"), ("5", "2.4"), ("0", "2.35")
    ]  # fmt: skip
