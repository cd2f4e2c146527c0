"""linrope study: a sweep run job by job into named folders; finished jobs are skipped on the next call,
stopped ones resume, a failed one is reported and left to run again; the finished ones are kept in the study's
compact results, committed as one commit with --commit."""

import json
import subprocess

import pytest
from omegaconf import OmegaConf

from linrope.base.naming import job_names
from linrope.studies.study import DONE, Study, state
from linrope.studies.sweeps import compose_train


def test_job_names_are_the_values_that_differ():
    jobs = [["experiment=budget", "model=linear", "seed=1"], ["experiment=budget", "model=linear_rope", "seed=2"]]
    assert job_names(jobs) == ["linear-seed1", "linear_rope-seed2"]
    assert job_names([["trainer.max_steps=800", "a=b"], ["trainer.max_steps=3200", "a=b"]]) == [
        "max_steps800",
        "max_steps3200",
    ]


def test_state_of_a_job_folder(tmp_path):
    assert state(tmp_path / "never") == "todo"
    (tmp_path / "stopped" / "checkpoints").mkdir(parents=True)
    (tmp_path / "stopped" / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert state(tmp_path / "stopped") == "partial"
    (tmp_path / "stopped" / DONE).write_text("{}")
    assert state(tmp_path / "stopped") == "done"


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_study_runs_each_job_once_and_skips_finished_ones(tmp_path, capsys):
    """Two tiny jobs in a git repository with --commit: each finished job is kept in the compact results at
    once, and the part is one commit (the second job amended the first one's), without its run folders."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "start")
    git(tmp_path, "config", "user.name", "t")
    git(tmp_path, "config", "user.email", "t@t")
    overrides = [
        "size=tiny",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "data.val_windows=2",
        "data.test_windows=2",
        "model=linear_rope,softmax_rope",
        "seed=1",
    ]
    study = Study(tmp_path / "s", overrides, threads=1, commit=True)
    assert study.names == ["linear_rope", "softmax_rope"]
    assert study.run(jobs=2) == 0
    records = {n: json.loads((tmp_path / "s" / n / DONE).read_text()) for n in study.names}
    for name, record in records.items():
        assert record["test"]["test/bpb"] > 0 and f"model={name}" in record["job"]
        assert "logger=csv" in record["command"] and f"hydra.run.dir={tmp_path / 's' / name}" in record["command"]
        assert (tmp_path / "s" / name / "study.log").is_file() and (
            tmp_path / "s" / name / "csv" / "metrics.csv"
        ).is_file()
    assert (tmp_path / "s" / ".gitignore").read_text().split() == [
        "*.ckpt",
        "*.pt",
        ".linrope.lock",
        ".study.lock",
        "/*/",
    ]
    kept = json.loads((tmp_path / "s" / "runs.json").read_text())["runs"]
    assert {r["run"]: r["study"] for r in kept} == records
    assert git(tmp_path, "rev-list", "--count", "HEAD") == "2\n"  # one commit for the part
    assert git(tmp_path, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "s:",
        "2",
        "of",
        "2",
        "jobs",
        "finished",
        "s/.gitignore",
        "s/curves.csv",
        "s/results.csv",
        "s/runs.json",
    ]
    assert not git(tmp_path, "status", "--porcelain")  # the run folders are ignored, nothing else left out
    capsys.readouterr()
    again = Study(tmp_path / "s", overrides, threads=1, commit=False)
    assert again.run(jobs=1) == 0
    out = capsys.readouterr().out
    assert "2 done, 0 to run" in out and "training" not in out
    assert {n: json.loads((tmp_path / "s" / n / DONE).read_text()) for n in study.names} == records
    # what Hydra saved for each run is what the study composes for the same request (else nothing would be
    # counted as done); one setting more is another job, which the finished folders are not
    more = Study(tmp_path / "s", [o.replace("max_steps=4", "max_steps=6") for o in overrides], threads=1, commit=False)
    assert [line.split(" holds another run ")[1].split(";")[0] for line in more.conflicts()] == [
        "(trainer.max_steps: 4 → 6)"
    ] * 2


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_failed_job_is_named_and_left_unfinished(tmp_path, capsys):
    """A job that passes the checks made before launching but fails once it runs (a corpus folder with no
    file in it is only measured when read)."""
    (tmp_path / "empty").mkdir()
    study = Study(
        tmp_path / "s",
        ["size=tiny", "trainer.max_steps=2", "model=linear_rope", f"data.path={tmp_path / 'empty'}"],
        threads=1,
        commit=False,
    )
    assert study.run(jobs=1) == 1
    out = capsys.readouterr().out
    assert "[job] FAILED (exit status 1)" in out and "not finished: job" in out
    assert state(tmp_path / "s" / "job") == "todo" and "empty" in (tmp_path / "s" / "job.log").read_text()


def test_a_job_another_process_holds_is_left_to_it(tmp_path, capsys):
    """Two drivers may share a study: a job whose run folder is locked by a live run is not started again."""
    import fcntl
    import os

    folder = tmp_path / "s" / "job"
    folder.mkdir(parents=True)
    (tmp_path / "s" / ".gitignore").write_text("*.ckpt\nmine\n")  # an older study's: it gains what it lacks
    fd = os.open(folder / ".linrope.lock", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"pid 1 on elsewhere\n")
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        study = Study(
            tmp_path / "s", ["size=tiny", "trainer.max_steps=2", "model=linear_rope"], threads=1, commit=False
        )
        assert study.run(jobs=1) == 0  # nothing failed: the job is left to the run that holds it
    finally:
        os.close(fd)
    out = capsys.readouterr().out
    assert "[job] running elsewhere (pid 1 on elsewhere): left to it" in out and "training" not in out
    assert "0/1 jobs done; not finished: job (job running elsewhere)" in out
    assert not (tmp_path / "s" / "job.log").exists()
    assert (tmp_path / "s" / ".gitignore").read_text().split() == [
        "*.ckpt",
        "mine",
        "*.pt",
        ".linrope.lock",
        ".study.lock",
        "/*/",
    ]
    claim = os.open(folder / ".study.lock", os.O_RDWR | os.O_CREAT)  # another driver's claim, before its run starts
    fcntl.flock(claim, fcntl.LOCK_EX)
    try:
        assert (
            Study(
                tmp_path / "s", ["size=tiny", "trainer.max_steps=2", "model=linear_rope"], threads=1, commit=False
            ).run(jobs=1)
            == 0
        )
    finally:
        os.close(claim)
    assert "[job] running elsewhere (another driver): left to it" in capsys.readouterr().out


def test_a_users_config_folder_reaches_the_dry_run_and_the_study(tmp_path, capsys):
    """--config-dir DIR becomes Hydra's search path for linrope sweeps and linrope study, as for train.py; a
    typo in such a preset is refused by the dry run in one line."""
    from linrope.studies import sweeps
    from linrope.studies.study import main

    (tmp_path / "mine" / "model").mkdir(parents=True)
    (tmp_path / "mine" / "model" / "my_preset.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /attention: linear\n  - override /position: rope\n"
        "model:\n  name: my_preset\n"
    )
    (tmp_path / "mine" / "model" / "typo.yaml").write_text("# @package _global_\nmodel:\n  d_modle: 5\n")
    assert main([str(tmp_path / "s"), "model=my_preset,linear", "seed=1", "-cd", str(tmp_path / "mine"), "--list"]) == 0
    out = capsys.readouterr().out
    assert "my_preset" in out and "todo" in out
    assert sweeps.main(["--config-dir", str(tmp_path / "mine"), "model=typo"]) == 1
    assert "REFUSED: model.d_modle: unknown option; did you mean d_model?" in capsys.readouterr().out


def test_a_typo_on_the_study_or_dry_run_command_line_is_one_line_and_writes_nothing(tmp_path):
    """An unknown key or group option stops linrope study and linrope sweeps before any job is composed
    (Hydra's compose would end in a traceback), and the study's folder is not created."""
    from linrope.studies import sweeps
    from linrope.studies.study import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "s"), "experiment=budget", "trainer.max_step=3"])
    assert str(e.value) == "linrope study: trainer.max_step: unknown option; did you mean max_steps?"
    assert not (tmp_path / "s").exists()
    with pytest.raises(SystemExit) as e:
        sweeps.main(["model=linear_rop", "seed=1,2"])
    assert str(e.value).startswith("linrope sweeps: model=linear_rop: no such option")


def test_options_may_sit_between_the_overrides(tmp_path, capsys):
    """`<dir> experiment=x --jobs 2 --commit model=a,b seed=1,2` (as conf/experiment/headline.yaml writes it)
    was refused by argparse ("unrecognized arguments: model=... seed=..."): every override is kept, wherever
    the options sit."""
    from linrope.studies.study import main

    assert (
        main([str(tmp_path / "s"), "size=tiny", "--jobs", "2", "--list", "model=linear,linear_rope", "seed=1,2"]) == 0
    )
    jobs = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("todo")]
    assert jobs == ["linear-seed1", "linear-seed2", "linear_rope-seed1", "linear_rope-seed2"]


def test_a_job_that_turned_its_test_off_is_done_with_its_last_validation(tmp_path):
    """``test=false`` in a main job: no test metric is logged, and the job is done with its last step and validation
    values, not failed (and resumed on the next start, which renamed its finished history)."""
    from linrope.studies.study import _test_outcome

    for test, expected in ((False, True), (True, False)):
        folder = tmp_path / f"test-{test}"
        (folder / ".hydra").mkdir(parents=True)
        OmegaConf.save(compose_train(["size=tiny", f"test={test}"]), folder / ".hydra" / "config.yaml")
        (folder / "csv").mkdir()
        (folder / "csv" / "metrics.csv").write_text("step,train/loss,val/bpb\n9,2.0,\n19,1.5,\n19,,2.25\n29,1.2,\n")
        outcome = _test_outcome(folder, ["size=tiny"])
        assert (outcome is not None) == expected, test
        if expected:
            record, shown = outcome
            assert record == {"test": {}, "test_off": {"last_step": 29, "val/bpb": 2.25}}
            assert shown == "test off: step 29, val/bpb 2.2500"


def test_a_job_another_driver_finished_with_another_configuration_is_not_counted_done(tmp_path, capsys):
    """Two drivers share a study: after this one placed its folders, another finished the same job folder with
    another budget.  It was counted done (2/2, exit 0) and its run kept as this study's; now it is named and the
    exit status is 1."""
    from tests.studies.helpers import finished_job

    jobs = ["size=tiny", "trainer.max_steps=2", "model=linear_rope"]
    study = Study(tmp_path / "s", jobs, threads=1, commit=False)
    finished_job(tmp_path / "s" / "job", ["size=tiny", "trainer.max_steps=80", "model=linear_rope"])
    assert study.run(jobs=1) == 1
    out = capsys.readouterr().out
    assert "[job] finished meanwhile by another driver with another configuration" in out
    assert "0/1 jobs done; not finished: job" in out


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--threads", "-3"], "--threads must be at least 1 (default: cores / jobs)"),
        (["--threads", "0"], "--threads must be at least 1 (default: cores / jobs)"),
    ],
)
def test_bad_driver_options_are_one_line(tmp_path, capsys, argv, why):
    from linrope.studies.study import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "s"), "model=linear_rope", *argv])
    assert e.value.code == 2 and why in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_a_forgotten_study_folder_is_refused_not_created(tmp_path, capsys, monkeypatch):
    """`python -m linrope study experiment=budget model=...` took the first override for the folder (creating
    ./experiment=budget/) and dropped it from the jobs."""
    from linrope.studies.study import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["experiment=budget", "model=linear_rope", "--list"])
    assert e.value.code == 2 and "experiment=budget looks like an override, not the study's folder" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "experiment=budget").exists()


def test_the_resume_command_keeps_new_folder(tmp_path):
    """A study stopped with --new-folder printed a resume command without it, which was then refused."""
    from linrope.studies import study as study_module

    seen = {}

    class Stub:
        def __init__(self, folder, overrides, threads, commit, new_folder, resume, **kw):
            seen["resume"] = resume

        def run(self, jobs):
            return 0

    import unittest.mock

    with unittest.mock.patch.object(study_module, "Study", Stub):
        study_module.main([str(tmp_path / "s"), "model=linear_rope", "--new-folder"])
    assert seen["resume"].endswith("--jobs=1 --new-folder")
