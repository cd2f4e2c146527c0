"""Scale-out and reliability with real processes (``pytest -m slow``): DDP on CPU (gloo) gives the
loss of one process with the same global batch; runs killed with SIGKILL — in the middle of
training or while a checkpoint is being written — resume (``ckpt_path=last`` in the run folder, or
an explicit path in a new one) and end where an uninterrupted run ends; sweeps run with
``trainer=ddp_spawn`` and through the submitit launcher."""

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import lightning as L
import pytest
import torch

from tests.helpers import ROOT, target

pytestmark = pytest.mark.slow

TINY = [
    "size=tiny",
    "logger=csv",
    "trainer.enable_progress_bar=false",
    "data.max_bytes=400000",
    "data.val_windows=4",
    "data.test_windows=4",
    "data.eval_batch_size=4",
    "trainer.log_every_n_steps=1",
    "test=false",
    "trainer.accelerator=cpu",
]  # DDP through gloo on CPU processes, on any machine


class SigkillAt(L.Callback):
    """Test-only: SIGKILL this process (``group``: its whole process group, every DDP rank) after
    optimizer step ``step`` — or, with ``during_save``, half-way through writing that step's checkpoint."""

    def __init__(self, step: int, during_save: bool = False, group: bool = False):
        self.step, self.during_save, self.group = int(step), during_save, group

    def kill(self):
        sys.stdout.flush()
        sys.stderr.flush()
        if self.group:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def setup(self, trainer, pl_module, stage):
        if not self.during_save:
            return
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("global_step") == self.step and hasattr(f, "write"):
                buf = io.BytesIO()
                real_save(obj, buf, *args, **kwargs)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                f.flush()
                os.fsync(f.fileno())
                self.kill()
            return real_save(obj, f, *args, **kwargs)

        torch.save = save

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.during_save and trainer.global_step == self.step:
            self.kill()


def train(tmp_path, run_dir, *overrides, expect=0, timeout=300, program=(str(ROOT / "train.py"),)):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    cmd = [sys.executable, *program, *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    r = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout, start_new_session=True
    )  # its own process group: SigkillAt(group=true) kills only the run
    if expect is not None:
        assert r.returncode == expect, f"exit {r.returncode}\n{r.stderr[-4000:]}"
    return r


def metrics(run_dir) -> dict:
    """{step: {name: value}} of the run's csv/metrics.csv."""
    out = {}
    with open(Path(run_dir) / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["step"]), {}).update(
                {k: float(v) for k, v in row.items() if v != "" and k != "step"}
            )
    return out


def weights(ckpt):
    c = torch.load(ckpt, map_location="cpu", weights_only=True)
    return c["global_step"], c["state_dict"]


def assert_same_end(a_dir, b_dir, last_step, tol=1e-4):
    a, b = metrics(a_dir), metrics(b_dir)
    for key in ("train/loss", "val/loss"):
        assert abs(a[last_step - 1][key] - b[last_step - 1][key]) <= tol, (key, a[last_step - 1], b[last_step - 1])
    # every step the resumed run logged equals the uninterrupted run's (data order and LR schedule)
    for step, row in b.items():
        for key in ("train/loss", "train/lr"):
            if key in row:
                assert abs(row[key] - a[step][key]) <= tol * max(1.0, abs(a[step][key])), (step, key, row, a[step])
    sa, wa = weights(Path(a_dir) / "checkpoints" / "last.ckpt")
    sb, wb = weights(Path(b_dir) / "checkpoints" / "last.ckpt")
    assert sa == sb == last_step
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5


# ---- DDP --------------------------------------------------------------------------------------------------
def test_spawned_gloo_ranks_exit_cleanly(tmp_path):
    """Without the group destroyed at exit, one round in five to eight lost a rank to SIGABRT ("terminate
    called without an active exception") after its work was done: 8 and 12 of 60 rounds in two runs on
    this machine (python benchmarks/gloo_exit.py --rounds 60 --no-cleanup)."""
    from benchmarks.gloo_exit import run_rounds

    assert run_rounds(12, True, tmp_path) == []


def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """2 processes × batch 4 (gloo on CPU) against 1 process × batch 8: the same samples per step
    (sample i to rank i mod 2), so the same losses — train/loss is the mean over processes."""
    steps = [
        "trainer.max_steps=5",
        "trainer.val_check_interval=5",
        "callbacks.last_checkpoint.every_n_train_steps=null",
    ]
    train(tmp_path, tmp_path / "ddp", *steps, "trainer=ddp", "trainer.devices=2", "data.batch_size=4")
    train(tmp_path, tmp_path / "one", *steps, "data.batch_size=8")
    ddp, one = metrics(tmp_path / "ddp"), metrics(tmp_path / "one")
    losses = [(one[s]["train/loss"], ddp[s]["train/loss"]) for s in range(5)]
    assert all(abs(a - b) < 1e-4 for a, b in losses), losses
    assert abs(one[4]["val/loss"] - ddp[4]["val/loss"]) < 1e-4


def test_ddp_runs_when_started_as_python_m_linrope_train(tmp_path):
    """Lightning's trainer=ddp starts the second process as ``python -m <__main__'s module>`` with the overrides:
    linrope.__main__ makes that the train module, not its table of commands (which would read ``size=tiny`` as a
    command and stop the second rank)."""
    steps = [
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "callbacks.last_checkpoint.every_n_train_steps=null",
    ]
    train(tmp_path, tmp_path / "ddp", *steps, "trainer=ddp", "trainer.devices=2", program=("-m", "linrope", "train"))
    assert 2 in metrics(tmp_path / "ddp")
    assert '"command": "python -m linrope train ' in (tmp_path / "ddp" / "provenance.json").read_text()


def test_ddp_killed_run_resumes_like_an_uninterrupted_one(tmp_path):
    """Both ranks killed with SIGKILL after step 7; resuming from last.ckpt (step 5) gives the run that
    was never interrupted (each rank's data restarts at its own share of the resume sample)."""
    common = [
        "trainer=ddp",
        "trainer.devices=2",
        "data.batch_size=2",
        "trainer.max_steps=10",
        "trainer.val_check_interval=5",
        "callbacks.last_checkpoint.every_n_train_steps=5",
    ]
    train(tmp_path, tmp_path / "whole", *common)
    run = tmp_path / "killed"
    train(
        tmp_path,
        run,
        *common,
        f"+callbacks.kill._target_={target(SigkillAt)}",
        "+callbacks.kill.step=7",
        "+callbacks.kill.group=true",
        expect=None,
    )
    assert weights(run / "checkpoints" / "last.ckpt")[0] == 5
    train(tmp_path, run, *common, "ckpt_path=last")
    assert_same_end(tmp_path / "whole", run, 10)


def test_ddp_nan_loss_stops_every_rank_in_one_line(tmp_path):
    r = train(
        tmp_path,
        tmp_path / "nan",
        "trainer=ddp",
        "trainer.devices=2",
        "data.batch_size=2",
        "optim.lr=1e30",
        "trainer.max_steps=20",
        "trainer.val_check_interval=10",  # a run that can validate: no start-up warning among the lines
        expect=None,
        timeout=240,
    )
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.startswith("linrope:")]
    assert lines and all("loss is nan at step" in l for l in lines), r.stderr[-3000:]
    assert "Traceback" not in r.stderr


# ---- kill and resume --------------------------------------------------------------------------------------
def test_sigkill_mid_training_and_mid_checkpoint_write_resume_to_the_same_end(tmp_path):
    """Killed with SIGKILL after step 13, or half-way through writing step 25's checkpoint: the run
    resumes — with an explicit path into a new folder, and with ckpt_path=last in its own folder —
    and ends at step 30 with the uninterrupted run's loss, logged steps, learning rates and weights.
    Dropout is on: the random state of every step is a function of (seed, step, rank)."""
    common = [
        "trainer.max_steps=30",
        "trainer.val_check_interval=10",
        "callbacks.last_checkpoint.every_n_train_steps=5",
        "data.batch_size=4",
        "model.dropout=0.1",
        "optim.warmup_steps=10",
    ]
    whole = tmp_path / "whole"
    train(tmp_path, whole, *common)

    # killed in the middle of training: last.ckpt is step 10's (written after that step's validation)
    run = tmp_path / "killed_mid_training"
    r = train(
        tmp_path, run, *common, f"+callbacks.kill._target_={target(SigkillAt)}", "+callbacks.kill.step=13", expect=None
    )
    assert r.returncode == -signal.SIGKILL
    saved = tmp_path / "step10.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", saved)
    assert weights(saved)[0] == 10
    train(tmp_path, tmp_path / "resumed_from_path", *common, f"ckpt_path={saved}")
    assert_same_end(whole, tmp_path / "resumed_from_path", 30)
    resumed = metrics(tmp_path / "resumed_from_path")
    assert min(resumed) == 10 and sorted(s for s in resumed if "val/loss" in resumed[s]) == [19, 29]

    # killed while writing step 25's checkpoint: step 20's last.ckpt is whole and loads
    run = tmp_path / "killed_mid_write"
    r = train(
        tmp_path,
        run,
        *common,
        f"+callbacks.kill._target_={target(SigkillAt)}",
        "+callbacks.kill.step=25",
        "+callbacks.kill.during_save=true",
        expect=None,
    )
    assert r.returncode == -signal.SIGKILL
    assert len(list((run / "checkpoints").glob(".last.ckpt.*.partial"))) == 1  # the half-written file, never renamed
    assert weights(run / "checkpoints" / "last.ckpt")[0] == 20
    train(tmp_path, run, *common, "ckpt_path=last")
    assert_same_end(whole, run, 30)
    assert not list((run / "checkpoints").glob(".last.ckpt.*.partial"))  # removed: its writer no longer runs


# ---- sweeps -----------------------------------------------------------------------------------------------
def sweep(tmp_path, *overrides, timeout=400):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *TINY,
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "data.batch_size=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return tmp_path / "sweep"


def test_ddp_spawn_sweep_runs_each_job_once_and_keeps_the_metrics_history(tmp_path):
    """Fit and test run in processes started for each: metrics.csv keeps the training history and
    gains the test columns (Lightning's CSV writer failed at test, or rewrote the file with test/* only)."""
    out = sweep(tmp_path, "trainer=ddp_spawn", "trainer.devices=2", "seed=1,2", "test=true")
    jobs = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["seed1", "seed2"]
    for j in jobs:
        assert weights(out / j / "checkpoints" / "last.ckpt")[0] == 3
        m = metrics(out / j)
        assert all("train/loss" in m[s] for s in (0, 1, 2))  # steps 0, 1, 2 logged
        assert "val/bpb" in m[2]
        assert [k for row in m.values() for k in row if k.startswith("test/")] == [
            "test/bpb",
            "test/bytes",
            "test/documents",
            "test/loss",
        ]


def test_ddp_in_a_sweep_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            *TINY,
            "trainer=ddp",
            "seed=1,2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.startswith("linrope:")]
    assert len(lines) == 1 and "use trainer=ddp_spawn" in lines[0], r.stderr[-3000:]


def test_submitit_local_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[cluster]'")
    out = sweep(
        tmp_path,
        "hydra/launcher=submitit_local",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
        "seed=1,2",
    )
    for j in ("seed1", "seed2"):  # named in the processes submitit started, from the sweep's multirun.yaml
        assert weights(out / j / "checkpoints" / "last.ckpt")[0] == 3
        assert (out / j / "csv" / "metrics.csv").exists()
    assert list((out / ".submitit").glob("*/*_result.pkl"))


# ---- issue 12: preemption, concurrent runs and writers, FIFOs ---------------------------------------------
class SignalAt(L.Callback):
    """Test-only: send this process ``signal`` (a name: SIGTERM, SIGINT) after optimizer step ``step``, as
    a cluster's preemption (SLURM, Kubernetes, submitit) or a Ctrl+C would; with ``rank``, only the process
    of that global rank (under DDP: rank 0 is the process a scheduler started)."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: Optional[int] = None):
        self.step, self.signal, self.rank = int(step), signal, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), getattr(signal, self.signal))


STEPS = ["trainer.max_steps=10", "trainer.val_check_interval=5", "callbacks.last_checkpoint.every_n_train_steps=5"]


def assert_signal_stops_at_step_7_and_resumes(tmp_path, name: str, *common, signal_options=()):
    """A run of 10 steps gets ``name`` after step 7, between two scheduled checkpoints (every 5 steps): it ends
    that step, writes last.ckpt at step 7, says so in one line and exits with 128 + the signal's number;
    resuming ends where a run that was never stopped ends."""
    run = tmp_path / "stopped"
    r = train(
        tmp_path,
        run,
        *STEPS,
        *common,
        f"+callbacks.stop._target_={target(SignalAt)}",
        "+callbacks.stop.step=7",
        f"+callbacks.stop.signal={name}",
        *signal_options,
        expect=None,
    )
    assert r.returncode == 128 + getattr(signal, name), r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("linrope:")]
    assert lines == [
        f"linrope: stopped by {name} at step 7: saved {run / 'checkpoints' / 'last.ckpt'} (step 7); "
        f"resume with ckpt_path=last hydra.run.dir={run}"
    ], r.stderr[-3000:]
    assert weights(run / "checkpoints" / "last.ckpt")[0] == 7
    train(tmp_path, tmp_path / "whole", *STEPS, *common)
    train(tmp_path, run, *STEPS, *common, "ckpt_path=last")
    assert_same_end(tmp_path / "whole", run, 10)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_exits_non_zero_and_the_run_resumes(tmp_path, name):
    """SIGTERM (preemption) or SIGINT (Ctrl+C)."""
    assert_signal_stops_at_step_7_and_resumes(tmp_path, name, "data.batch_size=4")


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp_sigterm_to_one_process_stops_every_rank_and_the_run_resumes(tmp_path, rank):
    """Two processes (gloo); SIGTERM reaches one of them only (rank 0: the process a scheduler started):
    every rank ends the same step.  Lightning's own handler hung both ranks when rank 1 was signalled."""
    assert_signal_stops_at_step_7_and_resumes(
        tmp_path,
        "SIGTERM",
        "trainer=ddp",
        "trainer.devices=2",
        "data.batch_size=2",
        signal_options=[f"+callbacks.stop.rank={rank}"],
    )


def test_two_runs_into_one_folder_the_second_refuses(tmp_path):
    """The first run holds the folder's lock while it trains; a second run started into the same folder
    refuses in one line and leaves the first one's files alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    run = tmp_path / "shared"
    first = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *TINY,
            "data.batch_size=4",
            "trainer.max_steps=400",
            "trainer.val_check_interval=1000",
            f"hydra.run.dir={run}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # until the first run has started training (it holds the lock from before that)
            if (run / "csv").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read()[-3000:]
        r = train(tmp_path, run, "data.batch_size=4", "trainer.max_steps=5", expect=1)
        assert r.stderr.strip().splitlines()[-1] == (
            f"linrope: run folder {run} is in use by another run (pid {first.pid} on {socket.gethostname()}); "
            f"wait for it to end, or choose another hydra.run.dir"
        )
        assert "max_steps: 400" in (run / ".hydra" / "config.yaml").read_text()  # the first run's config is kept
        assert first.wait(timeout=400) == 0
    finally:
        first.kill()
    assert weights(run / "checkpoints" / "last.ckpt")[0] == 400
    assert max(metrics(run)) == 399
    # the finished run: re-running into its folder is refused before Hydra writes its config there ...
    saved = (run / ".hydra" / "config.yaml").read_text()
    r = train(tmp_path, run, "data.batch_size=4", "trainer.max_steps=5", expect=1)
    assert r.stderr.strip().splitlines()[-1].startswith(f"linrope: run folder {run} already holds a run (")
    assert (run / ".hydra" / "config.yaml").read_text() == saved
    # ... and resuming it keeps the earlier config beside the new one
    train(
        tmp_path, run, "data.batch_size=4", "trainer.max_steps=402", "trainer.val_check_interval=1000", "ckpt_path=last"
    )
    assert (run / ".hydra.before-resume-0" / "config.yaml").read_text() == saved
    assert "max_steps: 402" in (run / ".hydra" / "config.yaml").read_text()


def test_concurrent_writers_of_one_checkpoint_all_succeed(tmp_path):
    """Two processes saving the same file 40 times each at once: every save succeeds and the file is always
    one whole checkpoint (with one shared temporary name about half of them failed)."""
    path = tmp_path / "last.ckpt"
    script = f"""
import pathlib, sys, time, torch
from linrope.base.atomic import atomic_torch_save
me = int(sys.argv[1])
pathlib.Path({str(tmp_path)!r}, f"ready{{me}}").touch()  # start together: imports take seconds
while len(list(pathlib.Path({str(tmp_path)!r}).glob("ready*"))) < 2:
    time.sleep(0.01)
for i in range(40):
    atomic_torch_save({{"state_dict": {{"w": torch.full((200_000,), float(me))}}, "global_step": i}}, {str(path)!r})
    c = torch.load({str(path)!r}, weights_only=True)
    assert c["state_dict"]["w"].unique().numel() == 1
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(k)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for k in (1, 2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert [out.strip() for out, _ in results] == ["ok", "ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "ready1", "ready2"]


def test_a_fifo_in_the_corpus_does_not_hang_the_run(tmp_path):
    """A FIFO beside the corpus files (nobody writes to it: reading it would block forever) is skipped and
    named; a FIFO as data.path is refused in one line."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):
        (corpus / f"f{i:02d}.txt").write_text(f"file {i} " * 400)
    os.mkfifo(corpus / "pipe.txt")
    script = f"""
import warnings
from linrope.data.bytes import load_corpus
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    parts = load_corpus({str(corpus)!r}, context=8, val_fraction=0.2, test_fraction=0.2)
print(sum(len(p) for p in parts.values()), [str(w.message) for w in caught])
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"skipped 1 entries that are not regular files or repeat one (a link): {corpus / 'pipe.txt'}" in r.stdout
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *TINY,
            f"data.path={corpus / 'pipe.txt'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"linrope: data.path {corpus / 'pipe.txt'}: is not a regular file or a folder (a FIFO, socket or device)"
    ]
