"""Reports fail safe (issue 33): they read only linrope runs, never write over a file they did not write, refuse
runs of mixed code across a study's arms under every flag, and take an arm's label from what its runs recorded.
Odd files (a binary metrics.csv, an unrelated hparams.yaml, a read-only folder) are one line."""

import json
import os
from pathlib import Path

import pytest

from linrope.analysis import study_config
from linrope.analysis.arms import arms_table
from linrope.analysis.report import build_report
from linrope.analysis.report.command import main
from linrope.analysis.report.files import MANIFEST
from linrope.run import provenance as P
from tests.analysis.helpers import lm_rows, recorded, write_budget, write_run, write_width


def users_files(folder: Path):
    (folder / "report.md").write_text("# my notes\n")
    (folder / "summary.csv").write_text("mine,1\n")


def one_run(folder: Path, seed: int = 1):
    write_run(
        folder,
        name="linear_rope",
        kind="linear",
        position="rope",
        seed=seed,
        rows=lm_rows((3.0, 2.5), 2.4 + seed / 10, (1000, 1000)),
    )


def test_a_folder_with_a_metrics_csv_of_no_linrope_run_is_not_reported_nor_overwritten(tmp_path):
    """Issue 33, case 3: a folder with exp1/metrics.csv and the user's own report.md and summary.csv: both were
    replaced, exit 0, exp1 reported as a bytes configuration."""
    (tmp_path / "exp1").mkdir()
    (tmp_path / "exp1" / "metrics.csv").write_text("step,loss\n1,2.0\n2,1.5\n")
    users_files(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert str(e.value) == (
        f"linrope report: no linrope runs (csv/metrics.csv) under {tmp_path} "
        f"({tmp_path / 'exp1' / 'metrics.csv'}: no provenance.json or .hydra/config.yaml of a "
        f"linrope run beside it)"
    )
    assert (tmp_path / "report.md").read_text() == "# my notes\n" and (
        tmp_path / "summary.csv"
    ).read_text() == "mine,1\n"


def test_a_study_with_only_tuning_runs_says_so(tmp_path):
    """A study part whose tuning stage is running (its runs compact in <part>/tuning/, no main run yet): the report
    has nothing to table, and says how far the study has come instead of only "no runs"."""
    tuning = tmp_path / "study" / "steps3200" / "tuning"
    tuning.mkdir(parents=True)
    runs = [{"run": "linear-lr0.002"}, {"run": "linear-lr0.004"}]
    (tuning / "runs.json").write_text(json.dumps({"format": "linrope.runs/1", "runs": runs}))
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "study")])
    assert str(e.value).startswith(f"linrope report: no linrope runs (csv/metrics.csv) under {tmp_path / 'study'}; ")
    assert f"only tuning runs have finished (2 in {tuning})" in str(e.value) and "--list" in str(e.value)


def test_a_report_never_writes_over_a_file_it_did_not_write(tmp_path, capsys):
    """Runs of linrope beside the user's own report.md and summary.csv: refused in one line, nothing written;
    a report's own files are replaced by the next report, unless edited since."""
    one_run(tmp_path / "sweep" / "0")
    users_files(tmp_path / "sweep")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "sweep")])
    assert str(e.value) == (
        f"linrope report: {tmp_path / 'sweep'} holds report.md, summary.csv, not written by a "
        f"linrope report: nothing written; move them away, or write the report elsewhere with --out"
    )
    assert (tmp_path / "sweep" / "report.md").read_text() == "# my notes\n"
    assert not (tmp_path / "sweep" / "runs.csv").exists() and not (tmp_path / "sweep" / MANIFEST).exists()
    out = tmp_path / "out"
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    first = (out / "report.md").read_text()
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0  # its own files: replaced
    assert (out / "report.md").read_text() == first
    (out / "summary.csv").write_text((out / "summary.csv").read_text() + "my row\n")
    with pytest.raises(SystemExit, match=r"holds summary.csv \(changed since linrope report wrote it\), not written"):
        main([str(tmp_path / "sweep"), "--out", str(out)])
    assert (out / "summary.csv").read_text().endswith("my row\n")


def test_a_report_from_before_the_manifest_is_still_its_own(tmp_path):
    """Folders reported before linrope kept a manifest (the committed results): report.md's first line is the
    report's own, so the report and its siblings are replaced; a user's report.md is not."""
    one_run(tmp_path / "sweep" / "0")
    build_report([tmp_path / "sweep"], tmp_path / "sweep")
    (tmp_path / "sweep" / MANIFEST).unlink()
    build_report([tmp_path / "sweep"], tmp_path / "sweep")
    assert (tmp_path / "sweep" / MANIFEST).is_file()


def test_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    """Was an OSError traceback at val_curves.png (root writes anywhere: the permission is then faked)."""
    one_run(tmp_path / "sweep" / "0")
    (tmp_path / "sweep").chmod(0o555)
    if os.geteuid() == 0:
        monkeypatch.setattr("linrope.analysis.report.files.os.access", lambda path, mode: False)
    try:
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path / "sweep")])
    finally:
        (tmp_path / "sweep").chmod(0o755)
    assert str(e.value) == (
        f"linrope report: {tmp_path / 'sweep'} is not writable: nothing written (choose another folder with --out)"
    )


def test_a_binary_metrics_csv_and_an_unrelated_hparams_yaml_are_one_line(tmp_path):
    """A binary metrics.csv was a UnicodeDecodeError traceback; an hparams.yaml that is no logger's an
    AttributeError."""
    one_run(tmp_path / "sweep" / "0")
    (tmp_path / "sweep" / "0" / "csv" / "hparams.yaml").write_text("model: 5\n")
    build_report([tmp_path / "sweep"], tmp_path / "out")  # the saved config names the model
    assert "| linear_rope |" in (tmp_path / "out" / "report.md").read_text()
    (tmp_path / "sweep" / "0" / "csv" / "hparams.yaml").write_text("- [a\n")
    build_report([tmp_path / "sweep"], tmp_path / "out")
    (tmp_path / "sweep" / "0" / "csv" / "metrics.csv").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SystemExit) as e:
        build_report([tmp_path / "sweep"], tmp_path / "out")
    assert str(e.value).startswith(
        f"linrope: {tmp_path / 'sweep' / '0' / 'csv' / 'metrics.csv'}: not a metrics CSV file ("
    ) and "\n" not in str(e.value)


def test_budget_arms_are_labelled_by_the_steps_their_runs_recorded(tmp_path):
    """Issue 33, case 4: steps800/ holding runs trained 20 steps was tabled as 'test/bpb at 800'."""
    write_budget(tmp_path, 800, {"linear": [3.3, 3.32], "linear_rope": [3.0, 3.03]})
    write_budget(tmp_path, 3200, {"linear": [3.1, 3.12], "linear_rope": [3.2, 3.23]})
    wrong = tmp_path / "steps800" / "linear-seed1" / ".hydra" / "config.yaml"
    wrong.write_text(wrong.read_text().replace("max_steps: 800", "max_steps: 20"))
    for flags in ([], ["--no-reports"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path), *flags])
        assert str(e.value) == (
            "linrope report: steps800/linear-seed1 ran with trainer.max_steps=20, not 800 as its "
            "folder steps800/ says: move it to the arm it belongs to"
        )
    assert not (tmp_path / "budget.md").exists() and not (tmp_path / "steps800" / "report.md").exists()


def test_runs_of_two_codes_across_arms_are_refused_under_every_flag(tmp_path, capsys):
    """Issue 33, cases 4 and 5: arms of different code were tabled side by side, and --no-reports switched the
    mixed-code refusal off (budget and recall alike)."""
    write_budget(tmp_path / "b", 800, {"linear": [3.3, 3.32], "linear_rope": [3.0, 3.03]})
    write_budget(tmp_path / "b", 3200, {"linear": [3.1, 3.12], "linear_rope": [3.2, 3.23]})
    for arm, code in (("steps800", "aaaaaaaaaaaa"), ("steps3200", "bbbbbbbbbbbb")):
        for run in (tmp_path / "b" / arm).iterdir():
            P.write(run, recorded("c" * 40, code=code))
    write_width(tmp_path / "r", 64, {"linear": [0.3, 0.35], "softmax_rope": [0.99, 0.97]})
    (tmp_path / "r" / "width64" / "softmax_rope-seed1" / "provenance.json").write_text("{}")
    P.write(tmp_path / "r" / "width64" / "linear-seed1", recorded("c" * 40, code="aaaaaaaaaaaa"))
    P.write(tmp_path / "r" / "width64" / "linear-seed2", recorded("c" * 40, code="bbbbbbbbbbbb"))
    for folder in (tmp_path / "b", tmp_path / "r"):
        for flags in ([], ["--no-reports"]):
            with pytest.raises(SystemExit) as e:
                main([str(folder), *flags])
            assert (
                "the runs come from 2 versions of the code (code aaaaaaaaaaaa, code bbbbbbbbbbbb): pass --allow-mixed"
                in str(e.value)
                and "\n" not in str(e.value)
            )
    assert not (tmp_path / "b" / "budget.md").exists() and not (tmp_path / "r" / "recall.md").exists()
    text = arms_table(tmp_path / "b", study_config.named("budget"), reports=False, allow_mixed=True)
    assert text.splitlines()[2] == (
        "**Mixed provenance: the runs come from 2 versions of the code (code aaaaaaaaaaaa, code bbbbbbbbbbbb).**"
    )


def test_budget_never_writes_over_an_arms_or_the_studys_own_files(tmp_path):
    """The budget table replaced an arm's report.md (and budget.md) that no report wrote."""
    write_budget(tmp_path, 800, {"linear": [3.3, 3.32], "linear_rope": [3.0, 3.03]})
    (tmp_path / "steps800" / "report.md").write_text("# my notes on 800 steps\n")
    with pytest.raises(SystemExit, match="steps800 holds report.md, not written by a linrope report"):
        main([str(tmp_path)])
    (tmp_path / "steps800" / "report.md").unlink()
    (tmp_path / "budget.md").write_text("my budget notes\n")
    with pytest.raises(SystemExit, match="holds budget.md, not written by a linrope report"):
        main([str(tmp_path)])
    assert (tmp_path / "budget.md").read_text() == "my budget notes\n"
    (tmp_path / "budget.md").unlink()
    assert main([str(tmp_path)]) == 0 and main([str(tmp_path)]) == 0  # its own files, again


def test_recall_on_runs_that_are_not_mqar_says_so(tmp_path):
    """The recall table on bytes runs printed an empty table and 'softmax_rope has not run yet'."""
    one_run(tmp_path / "width64" / "linear_rope-seed1")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--study", "recall"])
    assert str(e.value) == (
        f"linrope report: the runs under {tmp_path} are bytes runs, not mqar: the study of "
        f"{study_config.named('recall').path} tables mqar runs; choose another with --study"
    )


def test_report_paths_mean_what_they_say_from_any_folder(tmp_path, monkeypatch):
    """A relative sweep folder is read and written where the command was started, never in the checkout."""
    one_run(tmp_path / "here" / "sweep" / "0")
    monkeypatch.chdir(tmp_path / "here")
    assert main(["sweep"]) == 0
    assert (tmp_path / "here" / "sweep" / "report.md").is_file()
    assert not (Path(__file__).resolve().parents[2] / "sweep").exists()


def test_an_option_between_two_folders_keeps_both_folders(tmp_path, capsys):
    """`linrope report A --allow-mixed B` read B as an unrecognised argument; now both folders are read
    (the second, missing, is the one named)."""
    (tmp_path / "a").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), "--allow-mixed", str(tmp_path / "b")])
    assert f"{tmp_path / 'b'}: not a folder" in capsys.readouterr().err
