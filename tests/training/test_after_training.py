"""After training (linrope/training/after_training.py): a signal during the test or the extrapolation ends the run with one
line naming what finished, what did not and the command that completes it; a sweep whose objective no run can
log is refused before its first trial."""

import os
import shlex
import signal
import subprocess
import sys

import lightning as L
import pytest

from linrope.studies.sweeps import compose_train
from linrope.training.after_training import objective_problem
from tests.helpers import ROOT, run_main, target, tiny

TINY = tiny(
    "logger=csv",
    "trainer.max_steps=4",
    "trainer.val_check_interval=4",
    "extrapolation.enabled=true",
    "extrapolation.scored_bytes=4096",
    "extrapolation.factors=[1,2]",
)


class SigtermAt(L.Callback):
    """Test-only: SIGTERM to this process during the test (after its first batch) or as the extrapolation starts;
    ``when=test_end``: SIGINT once the test has logged its metrics, before its table is printed."""

    def __init__(self, when: str):
        self.when = when
        self.sent = False

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.when == "test":
            os.kill(os.getpid(), signal.SIGTERM)

    def on_test_end(self, trainer, pl_module):
        if self.when == "test_end" and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        if self.when != "extrapolation":
            return
        import linrope.evaluation.evaluate as T

        original = T.extrapolate_after_test

        def stopped(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return original(*args, **kwargs)

        T.extrapolate_after_test = stopped


def train(tmp_path, *overrides, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout)


@pytest.mark.parametrize(
    "when, complete", [("extrapolation", False), pytest.param("test", True, marks=pytest.mark.slow)]
)
@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_sigterm_after_training_says_what_is_left_and_how_to_finish_it(tmp_path, when, complete):
    """Stopped during the extrapolation (default suite) or the test (slow: then its command completes the run)."""
    run = tmp_path / "run"
    stop = [f"+callbacks.stop._target_={target(SigtermAt)}", f"+callbacks.stop.when={when}"]
    r = train(tmp_path, *TINY, *stop, f"hydra.run.dir={run}")
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("linrope:")]
    ckpt = next((run / "checkpoints").glob("best-*.ckpt"))
    finish = [*TINY, "train=false", f"ckpt_path={ckpt}", f"hydra.run.dir={run}"]
    command = shlex.join(["python", "train.py", *TINY, *stop, *finish[len(TINY) :]])
    if when == "extrapolation":
        expected = (
            f"linrope: stopped by SIGTERM during the extrapolation: finished training and the test (checkpoint "
            f"{ckpt}); not done: the extrapolation; complete it with: {command}"
        )
    else:
        expected = (
            f"linrope: stopped by SIGTERM during the test: finished training (checkpoint {ckpt}); not done: "
            f"the test, the extrapolation; complete it with: {command}"
        )
    assert lines == [expected], r.stderr[-3000:]
    assert not (run / "extrapolation.csv").exists()
    if not complete:
        return
    # the command completes it (here without the test-only callback that stops it)
    again = train(tmp_path, *finish)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "extrapolation.csv").is_file()


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_sigint_once_the_test_has_logged_says_the_run_completed_and_where(tmp_path):
    """Issue 33: a SIGINT just after the test table ended the run with no line although it had completed.  Sent as
    the test's metrics are logged (no extrapolation): one line saying the run completed and where its results are;
    the test's table and metrics.csv are written as without the signal; exit status 130."""
    run = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("extrapolation.")]
    r = train(
        tmp_path,
        *tiny,
        f"+callbacks.stop._target_={target(SigtermAt)}",
        "+callbacks.stop.when=test_end",
        f"hydra.run.dir={run}",
    )
    assert r.returncode == 130, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("linrope:")]
    assert lines == [
        f"linrope: stopped by SIGINT after the run completed (training and the test): its results are in {run}"
    ], r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "test/bpb" in r.stdout  # the test's table
    assert "test/bpb" in (run / "csv" / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_run_completed_lets_it_finish_then_exits(capsys, tmp_path, signum):
    """A signal while the loggers finish (after ``completed()``): the line, the finishing code runs to its end,
    then exit 128 + the signal; the handlers are restored."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from linrope.training.after_training import explain_stop

    cfg = OmegaConf.create({"train": True, "test": False, "paths": {"output_dir": str(tmp_path)}})
    trainer = SimpleNamespace(is_global_zero=True, callback_metrics={})
    before = signal.getsignal(signum)
    finished = []
    with pytest.raises(SystemExit) as e:
        with explain_stop(cfg, trainer) as progress:
            progress.completed()
            os.kill(os.getpid(), signum)
            finished.append(True)  # the rest of the run still runs
    assert e.value.code == 128 + signum and finished == [True]
    assert capsys.readouterr().err.splitlines() == [
        f"linrope: stopped by {signal.Signals(signum).name} after the run completed (training): its results are in "
        f"{tmp_path}"
    ]
    assert signal.getsignal(signum) is before


# ---- a sweep's objective -------------------------------------------------------------------------------------------
def test_an_objective_no_run_can_log_is_named_with_the_setting_to_change():
    base = ["hparams_search=optuna", "size=tiny"]
    problem = objective_problem(compose_train([*base, "trainer.max_steps=10"]))
    assert problem == (
        "the sweep optimises optimized_metric=val/bpb, which is never logged: no validation before "
        "trainer.max_steps=10 (trainer.val_check_interval=100); set trainer.val_check_interval=10 or "
        "less, or trainer.max_steps=100 or more"
    )
    assert objective_problem(compose_train([*base, "trainer.max_steps=10", "trainer.val_check_interval=10"])) is None
    assert objective_problem(compose_train(base)) is None  # 500 steps, validation every 100
    assert "task bytes never logs (it logs val/loss, val/bpb): set optimized_metric=val/loss" in objective_problem(
        compose_train([*base, "optimized_metric=val/acc"])
    )
    assert objective_problem(compose_train([*base, "data=mqar"])) is None  # val/bpb becomes val/loss for a task
    assert "task mqar never logs" in objective_problem(compose_train([*base, "data=mqar", "optimized_metric=val/bpb2"]))
    assert "returns before testing: set optimized_metric=val/bpb" in objective_problem(
        compose_train([*base, "optimized_metric=test/bpb"])
    )
    assert "train=false" in objective_problem(compose_train([*base, "train=false"]))
    assert "limit_val_batches=0" in objective_problem(compose_train([*base, "trainer.limit_val_batches=0"]))


def test_the_optuna_sweepers_storage_works(tmp_path):
    """hydra.sweeper.storage=sqlite:///…: optuna 2.10, the one the sweeper allows, fails on SQLAlchemy 2 as the study
    is created (an AssertionError); the sweep and dev extras hold SQLAlchemy below 2."""
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="linrope")
    study.optimize(lambda trial: trial.suggest_float("lr", 1e-4, 1e-2), n_trials=2)
    assert len(study.trials) == 2 and (tmp_path / "study.db").stat().st_size > 0


def test_a_search_the_wrong_way_is_refused_before_its_first_trial():
    """optuna's preset minimises; a task's accuracy (higher is better) was minimised without a word."""
    from omegaconf import OmegaConf

    from linrope.training.after_training import direction_problem

    def cfg(metric, direction, task="mqar"):
        return OmegaConf.create(
            {"optimized_metric": metric, "data": {"task": task}, "hydra": {"sweeper": {"direction": direction}}}
        )

    assert direction_problem(cfg("val/acc", "minimize")) == (
        "hydra.sweeper.direction=minimize with optimized_metric=val/acc, where higher is better: "
        "set hydra.sweeper.direction=maximize"
    )
    assert "where lower is better: set hydra.sweeper.direction=minimize" in direction_problem(
        cfg("val/bpb", "maximize")
    )
    assert direction_problem(cfg("val/acc", "maximize")) is None
    assert direction_problem(cfg("val/bpb", "minimize", task="bytes")) is None
    assert (
        direction_problem(OmegaConf.create({"optimized_metric": "val/acc"})) is None
    )  # no direction: the basic sweeper


DIVERGES = tiny(
    "logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=2", "test=false", "optim.warmup_steps=0"
)


@pytest.mark.slow  # two runs in a subprocess
def test_a_diverged_job_of_a_sweep_fails_that_job_only(tmp_path, monkeypatch):
    """A job whose loss diverges (learning rate 1e6) is a failed job: its one line, then the sweep's other jobs run
    (a SystemExit ended the sweep there, and the next job never ran); the sweep ends with exit status 1 and the line,
    no traceback, and the report counts the diverged run as failed.  The failed job's wandb run is finished: the
    next job logs to a run of its own (it took the open one over)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = tmp_path / "sweep"
    args = [o for o in DIVERGES if not o.startswith("logger=")] + ["logger=default"]  # csv and wandb
    r = train(tmp_path, "-m", "optim.lr=1e6,1e-3", *args, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1, r.stderr[-3000:]
    line = "linrope: loss is nan at step"
    assert [ln.startswith(line) for ln in r.stderr.splitlines()].count(True) == 2  # the job's, then the sweep's
    assert "Traceback" not in r.stderr
    assert (sweep / "lr0.001" / "checkpoints" / "last.ckpt").is_file()  # the job after the diverged one ran
    assert (sweep / "lr1000000.0" / "provenance.json").is_file()
    runs = {
        job: {p.name.rsplit("-", 1)[1] for p in (sweep / job / "wandb").glob("*run-*-*")}
        for job in ("lr0.001", "lr1000000.0")
    }
    assert len(runs["lr0.001"]) == len(runs["lr1000000.0"]) == 1 and runs["lr0.001"] != runs["lr1000000.0"]


@pytest.mark.slow
def test_an_optuna_trial_that_diverges_is_a_failed_trial_and_the_search_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    r = train(tmp_path, "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2", "optim.lr=tag(log, interval(1e5, 1e6))",
              *DIVERGES, f"hydra.sweep.dir={sweep}")  # fmt: skip
    assert [ln.startswith("linrope: loss is nan") for ln in r.stderr.splitlines()].count(True) == 2, r.stderr[-3000:]
    assert len([p for p in sweep.iterdir() if p.is_dir()]) == 2  # both trials ran


def test_a_sweep_with_a_job_that_would_be_refused_starts_none(tmp_path):
    """Every job of train.py -m is checked before the first starts: a bad value in the last job was found only when
    that job started, after the others had trained."""
    sweep = tmp_path / "sweep"
    r = train(tmp_path, "-m", "optim.lr=0.001,-5", "size=tiny", "logger=none", f"hydra.sweep.dir={sweep}", timeout=120)
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("linrope: 1 of the sweep's jobs would be refused, so none started: job #1 (optim.lr=-5")
    assert "optim.lr=-5: expected a number > 0" in line and not sweep.exists()


def test_the_optuna_sweep_that_cannot_score_is_refused_before_its_first_trial(tmp_path):
    sweep = tmp_path / "sweep"
    r = train(
        tmp_path,
        "-m",
        "hparams_search=optuna",
        "size=tiny",
        "trainer.max_steps=10",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep}",
        timeout=120,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "linrope: the sweep optimises optimized_metric=val/bpb, which is never logged: no validation before "
        "trainer.max_steps=10 (trainer.val_check_interval=100); set trainer.val_check_interval=10 or less, or "
        "trainer.max_steps=100 or more"
    ]
    assert not sweep.exists() or not any(sweep.iterdir())  # no trial ran


# ---- a finished run says where it is and what next ----------------------------------------------------------------
@pytest.mark.parametrize("validates", [True, False])
def test_a_finished_run_says_where_its_results_are_and_what_to_run_next(
    compose, capsys, tmp_path, monkeypatch, validates
):
    """The last lines of a run (stdout): its folder, the checkpoint the test scored, and the report, evaluate and
    generate commands, which name files that exist; the report command runs as printed.  A run too short to
    validate says so at its start (stderr), and its end does not claim a checkpoint chosen on validation."""
    from linrope.analysis.report.command import main as report

    monkeypatch.chdir(tmp_path.parent)
    interval = 2 if validates else 100
    cfg = compose(*tiny("logger=csv", "trainer.max_steps=4", f"trainer.val_check_interval={interval}"))
    run_main(cfg)
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    at = lines.index("next:")
    assert lines[at - 2] == f"run folder: {tmp_path.name} (checkpoints/, csv/metrics.csv, provenance.json)"
    commands = [shlex.split(line.split("    #")[0]) for line in lines[at + 1 :]]
    assert [c[:4] for c in commands] == [
        ["python", "-m", "linrope", name] for name in ("report", "evaluate", "generate")
    ]
    ckpt = commands[1][4].removeprefix("ckpt=")
    assert commands[2][4] == commands[1][4] and (tmp_path.parent / ckpt).is_file()
    warned = "linrope: warning: this run will not validate: no validation before trainer.max_steps=4" in captured.err
    if validates:
        assert lines[at - 1] == f"the test scored {ckpt} (the best on validation)" and "/best-step" in ckpt
        assert not warned
    else:
        assert lines[at - 1] == "the test scored the last weights: no validation ran, so no checkpoint was chosen on it"
        assert ckpt.endswith("checkpoints/last.ckpt") and warned
    assert report(commands[0][4:]) == 0 and (tmp_path / "report.md").is_file()


def test_a_run_without_the_csv_logger_names_no_metrics_file_and_no_report(compose, capsys, tmp_path, monkeypatch):
    """logger=none writes no csv/metrics.csv: the last lines named it, and a report command that failed with "no
    linrope runs"."""
    monkeypatch.chdir(tmp_path.parent)
    run_main(compose(*tiny("logger=none", "trainer.max_steps=2", "trainer.val_check_interval=2")))
    lines = capsys.readouterr().out.strip().splitlines()
    at = lines.index("next:")
    assert lines[at - 2] == f"run folder: {tmp_path.name} (checkpoints/, provenance.json)"
    assert not any("linrope report" in line for line in lines[at:]) and "linrope evaluate" in lines[at + 1]


def test_a_run_that_cannot_validate_is_warned_at_its_start_and_one_that_can_is_not():
    from linrope.training.after_training import validation_warning

    base = ["size=tiny"]
    assert "no validation before trainer.max_steps=20 (trainer.val_check_interval=100)" in validation_warning(
        compose_train([*base, "trainer.max_steps=20"])
    )
    assert "trainer.limit_val_batches=0" in validation_warning(compose_train([*base, "trainer.limit_val_batches=0"]))
    assert validation_warning(compose_train(base)) is None  # 500 steps, validation every 100
    assert validation_warning(compose_train([*base, "trainer.max_steps=20", "train=false"])) is None  # no training
