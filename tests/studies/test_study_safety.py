"""linrope study fails safe (issue 33): a job is its whole configuration and code, never its folder's name; paths
mean what they say from any folder; every job is checked before the first starts; odd folders are one line;
SIGTERM / SIGINT stop the driver after the running job has saved.  Finished jobs are made by hand here as a run
leaves them (the configuration Hydra saves, metrics, study_job.json); two tests train (one of them slow)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from linrope.studies.study import DONE, Study, main
from tests.studies.helpers import finished_job

ROOT = Path(__file__).resolve().parents[2]


def test_a_study_never_reports_a_run_it_did_not_train(tmp_path, capsys):
    """Issue 33, case 1: `study S model=linear_rope … max_steps=40`, then `study S model=softmax_rope …
    max_steps=80` counted the linear run as the softmax job (`1 done, 0 to run`, exit 0; --list `done`), and
    raising only the budget did the same.  Now the folder's saved configuration is compared with the request:
    --list says `differs` and names the keys, the run is refused in one line before anything trains, and
    --new-folder trains the job in a folder of its own, which later calls find."""
    s = tmp_path / "S"
    finished_job(s / "job", ["model=linear_rope", "size=tiny", "trainer.max_steps=40"])
    asked = [str(s), "model=softmax_rope", "size=tiny", "trainer.max_steps=80"]
    assert main([*asked, "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("differs  job (holds another run: ") and "done" not in out.split("(")[0]
    for change in ("model.attention.kind: linear → softmax", "trainer.max_steps: 40 → 80"):
        assert change in out
    assert "model.name" not in out  # a label: the pair it names differs already
    with pytest.raises(SystemExit) as e:
        main(asked)
    line = str(e.value)
    assert line.startswith(f"linrope study: job job: {s / 'job'} holds another run (") and "\n" not in line
    assert "trainer.max_steps: 40 → 80" in line and line.endswith(
        "pass --new-folder to train this job in a folder of its own, or choose another study folder"
    )
    assert not (s / "job.log").exists() and json.loads((s / "job" / DONE).read_text())["test"]  # nothing touched

    finished_job(s / "budget" / "job", ["model=linear_rope", "size=tiny", "trainer.max_steps=150"])
    assert main([str(s / "budget"), "model=linear_rope", "size=tiny", "trainer.max_steps=3000", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("differs") and "(holds another run: trainer.max_steps: 150 → 3000)" in out

    assert main([*asked, "--new-folder", "--list"]) == 0  # where --new-folder would train it
    assert capsys.readouterr().out.split()[:2] == ["todo", "job-run2"]
    finished_job(s / "job-run2", ["model=softmax_rope", "size=tiny", "trainer.max_steps=80"])
    assert main([*asked, "--list"]) == 0  # found again without the flag; the linear run keeps its folder
    assert capsys.readouterr().out.split()[:2] == ["done", "job-run2"]
    assert main([str(s), "model=linear_rope", "size=tiny", "trainer.max_steps=40", "--list"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["done", "job"]


def test_a_run_of_other_code_is_not_counted_as_done(tmp_path, capsys):
    """The code a run recorded (provenance.json) is part of the job: a finished job of other code differs."""
    from linrope.studies.study_jobs import current_code

    s = tmp_path / "S"
    finished_job(s / "job", ["model=linear_rope", "size=tiny"], code="0123456789ab")
    assert main([str(s), "model=linear_rope", "size=tiny", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("differs") and f"trained on code 0123456789ab, the checkout is {current_code()}" in out
    (s / "job" / "provenance.json").write_text(json.dumps({"linrope": {"code": current_code().split()[-1]}}))
    assert main([str(s), "model=linear_rope", "size=tiny", "--list"]) == 0
    assert capsys.readouterr().out.startswith("done ")


def test_keep_finished_adds_an_arm_to_a_study_of_other_code(tmp_path, capsys):
    """--keep-finished: a finished job of the same configuration and other code is done (an arm added to a finished
    study on newer code); a stopped one of other code, or a finished one of another configuration, still differs."""
    s = tmp_path / "S"
    sweep = [str(s), "model=linear_rope,softmax_rope", "size=tiny"]
    finished_job(s / "linear_rope", ["model=linear_rope", "size=tiny"], code="0123456789ab")
    finished_job(s / "softmax_rope", ["model=softmax_rope", "size=tiny", "trainer.max_steps=40"], code="0123456789ab")
    assert main([*sweep, "--list"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["differs", "differs"]
    assert main([*sweep, "--keep-finished", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["done", "linear_rope"]
    assert out[1].startswith("differs") and "trainer.max_steps" in out[1] and "code" not in out[1]
    (s / "linear_rope" / DONE).unlink()  # stopped: resuming it would mix two codes in one run
    (s / "linear_rope" / "checkpoints").mkdir()
    (s / "linear_rope" / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert main([*sweep, "--keep-finished", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("differs") and "trained on code 0123456789ab" in out[0]


def test_a_stopped_job_of_another_configuration_is_not_resumed(tmp_path):
    """The same check when a stopped job would resume from its last.ckpt."""
    folder = tmp_path / "S" / "job"
    finished_job(folder, ["model=linear_rope", "size=tiny", "trainer.max_steps=40"])
    (folder / DONE).unlink()
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
    study = Study(tmp_path / "S", ["model=linear_rope", "size=tiny", "trainer.max_steps=80"], threads=1, commit=False)
    assert study.status(0) == "differs"
    with pytest.raises(SystemExit, match=r"trainer.max_steps: 40 → 80"):
        study.run(jobs=1)
    same = Study(tmp_path / "S", ["model=linear_rope", "size=tiny", "trainer.max_steps=40"], threads=1, commit=False)
    assert same.status(0) == "partial" and not same.conflicts()


def test_every_job_is_checked_before_the_first_starts(tmp_path):
    """Bad values and impossible pairings are refused in one line per job before any job launches (they were
    each launched and `FAILED … see job.log`)."""
    study = Study(
        tmp_path / "s",
        ["size=tiny", "attention=linear", "position=t5,rope", "trainer.max_steps=2"],
        threads=1,
        commit=False,
    )
    with pytest.raises(SystemExit) as e:
        study.run(jobs=1)
    lines = str(e.value).splitlines()
    assert lines and all(line.startswith("linrope study: job positiont5: ") for line in lines)
    assert "t5" in lines[0] and "linear" in lines[0]
    assert not (tmp_path / "s").exists()  # nothing launched, nothing written


def test_odd_study_folders_are_one_line(tmp_path, monkeypatch):
    """A study path that is a file (was FileExistsError, and --list said `todo`), a read-only folder (OSError),
    a .study.lock that is a folder (IsADirectoryError)."""
    (tmp_path / "file").write_text("mine")
    for extra in ([], ["--list"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path / "file"), "model=linear_rope", *extra])
        assert str(e.value) == f"linrope study: {tmp_path / 'file'} is a file, not a study folder; choose another path"
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    try:
        with monkeypatch.context() as m:
            if os.geteuid() == 0:  # root writes anywhere: the permission is faked
                m.setattr("linrope.studies.study.os.access", lambda path, mode: False)
            with pytest.raises(SystemExit) as e:
                Study(tmp_path / "ro" / "s", ["model=linear_rope", "size=tiny"], threads=1, commit=False).run(1)
        assert (
            str(e.value) == f"linrope study: {tmp_path / 'ro'} is not writable: the study cannot write its runs there"
        )
    finally:
        (tmp_path / "ro").chmod(0o755)
    (tmp_path / "s" / "job" / ".study.lock").mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        Study(tmp_path / "s", ["model=linear_rope", "size=tiny"], threads=1, commit=False).run(1)
    assert (
        str(e.value)
        == f"linrope study: {tmp_path / 's' / 'job' / '.study.lock'} is a folder, not the study's lock file; remove it"
    )


def test_a_deleted_claim_is_not_shared_by_two_drivers(tmp_path):
    """A .study.lock deleted while a driver holds it: a second driver's claim is taken on a new file, and the
    first driver's claim on the deleted one is not trusted (the path no longer names it)."""
    import fcntl

    from linrope.studies.study import _claim

    folder = tmp_path / "job"
    folder.mkdir()
    first = _claim(folder)
    assert first is not None and _claim(folder) is None  # held
    (folder / ".study.lock").unlink()
    second = _claim(folder)
    try:
        assert second is not None and os.fstat(second).st_ino == os.stat(folder / ".study.lock").st_ino
        assert _claim(folder) is None  # the file at the path is held again
        with pytest.raises(BlockingIOError):
            fcntl.flock(os.open(folder / ".study.lock", os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(first)
        os.close(second)


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


TINY = ["size=tiny", "trainer.val_check_interval=2", "data.val_windows=2", "data.test_windows=2"]


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_relative_study_folder_outside_the_checkout_trains_there(tmp_path):
    """Issue 33, case 2: `cd /tmp/x && python -m linrope study relstudy …` trained into <checkout>/relstudy/job
    while the driver looked in /tmp/x/relstudy (`FAILED (no test metric was logged)`).  A relative data.path
    means the caller's file too."""
    (tmp_path / "corpus.txt").write_bytes((Path(os.__file__).read_bytes() * 2)[:60_000])
    cmd = [
        sys.executable,
        "-m",
        "linrope",
        "study",
        "relstudy",
        *TINY,
        "trainer.max_steps=4",
        "model=linear_rope",
        "data.path=corpus.txt",
        "--threads",
        "1",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1/1 jobs done" in done.stdout
    assert (tmp_path / "relstudy" / "job" / DONE).is_file() and not (ROOT / "relstudy").exists()
    saved = OmegaConf.load(tmp_path / "relstudy" / "job" / ".hydra" / "config.yaml")
    assert saved.data.path == "corpus.txt"
    again = subprocess.run(cmd + ["--list"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert again.stdout.split()[:2] == ["done", "job"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_driver_stops_after_the_job_saved_and_starts_nothing(tmp_path, sig):
    """SIGTERM (preemption) or SIGINT (Ctrl+C) to the driver: the running job saves last.ckpt and is left
    resumable (not FAILED), the next job never starts, one line gives the command that resumes, exit 143 / 130
    (SIGTERM marked the job FAILED and started the next; Ctrl+C ended in a KeyboardInterrupt traceback)."""
    cmd = [
        sys.executable,
        "-m",
        "linrope",
        "study",
        str(tmp_path / "s"),
        *TINY,
        "trainer.max_steps=100000",
        "model=linear_rope,linear",
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not list((tmp_path / "s" / "linear_rope").glob("csv/metrics.csv")) and time.time() < deadline:
        time.sleep(0.5)  # training (SignalStop installed): the first values are logged
    time.sleep(2)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, out
    assert "Traceback" not in out and "FAILED" not in out
    assert f"[linear_rope] stopped by {sig.name}" in out and "last.ckpt saved" in out and "[linear]" not in out
    last = out.strip().splitlines()[-1]
    assert (
        last.startswith(f"linrope study: stopped by {sig.name}; resume with: python -m linrope study {tmp_path / 's'} ")
        and "model=linear_rope,linear" in last
    )
    assert (tmp_path / "s" / "linear_rope" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "s" / "linear").exists()
    listed = subprocess.run(cmd + ["--list"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [["partial", "linear_rope"], ["todo", "linear"]]


def test_the_label_is_not_part_of_a_jobs_identity():
    """train.py writes the chosen pair's label into the saved config (``attention=softmax position=none`` saves
    ``model.name: softmax_none``) while the study composes the preset's; the label changes nothing a job computes."""
    from linrope.studies.study_jobs import differences

    assert differences({"model.name": "softmax_none"}, {"model.name": "linear_rope"}) == []
    assert differences({"model.d_model": 64}, {"model.d_model": 128}) == ["model.d_model: 64 → 128"]


def test_a_tokenizer_rewritten_under_the_same_path_makes_another_job(tmp_path, monkeypatch):
    """Issue 52, case 2: a finished data=text job whose tokenizer file changed since it trained is not the job asked
    for now (a study would have counted it done and averaged runs of two tokenizers); the same file is."""
    import json

    from linrope.data.tokenizer import file_digest
    from linrope.studies.study_jobs import mismatch

    monkeypatch.chdir(tmp_path)
    tok = tmp_path / "tok.json"
    tok.write_text('{"model": 1}')
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("data:\n  tokenizer: tok.json\nseed: 1\n")
    (run / "study_job.json").write_text("{}")
    data = {"tokenizer": {"spec": "tok.json", "path": str(tok), "sha256": file_digest(tok)[:16], "vocab_size": 9}}
    (run / "provenance.json").write_text(json.dumps({"data": data}))
    requested = {"data.tokenizer": "tok.json", "seed": 1}
    assert mismatch(run, requested, None) is None
    tok.write_text('{"model": 2}')
    why = mismatch(run, requested, None)
    assert why and why.startswith("tokenizer tok.json changed since the run (sha256 "), why
