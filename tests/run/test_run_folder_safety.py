"""Issue 52: a run folder is locked before anything is written into it (Hydra's own files included), and a refused
resume changes nothing on disk.  Each test reproduces a case a hostile user found, and failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from tests.helpers import ROOT, TINY

FIRST = """
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
from linrope.run.folder import KeepEarlierRun
run = Path(sys.argv[1])
KeepEarlierRun().on_run_start(config=OmegaConf.create({"hydra": {"run": {"dir": str(run)}}, "ckpt_path": None}))
(run / ".hydra").mkdir(parents=True)                      # what Hydra does next: write the run's config
(run / ".hydra" / "config.yaml").write_text("seed: 1\\n")
print("written", flush=True)
time.sleep(60)                                           # train.py's checks and imports: 8-12 s before it claimed
"""


def test_a_run_starting_into_a_folder_holds_it_before_hydra_writes_there(tmp_path):
    """Case 7: two runs started seconds apart into one folder.  The first has written .hydra/config.yaml but not
    yet reached train.py's claim; the second must be refused before its Hydra replaces the first's config."""
    from linrope.run.folder import KeepEarlierRun

    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "written"
        config = OmegaConf.create({"hydra": {"run": {"dir": str(run)}}, "ckpt_path": None})
        with pytest.raises(SystemExit) as e:
            KeepEarlierRun().on_run_start(config=config)  # the second run, before its Hydra writes .hydra/
        assert str(e.value.code).startswith(f"linrope: run folder {run} is in use by another run (pid {first.pid} on ")
    finally:
        first.kill()
        first.wait()
    assert (run / ".hydra" / "config.yaml").read_text() == "seed: 1\n"


def train(cwd, run, *overrides, wait=True, base=TINY):
    cmd = [sys.executable, str(ROOT / "train.py"), *base, f"hydra.run.dir={run}", *overrides]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_two_train_py_started_seconds_apart_keep_the_first_ones_config(tmp_path):
    """Case 7 with two real train.py: the second starts as soon as the first's Hydra wrote its config."""
    run = tmp_path / "shared"
    first = train(tmp_path, run, "seed=11", "trainer.max_steps=400", "trainer.val_check_interval=1000", wait=False)
    try:
        for _ in range(600):
            if (run / ".hydra" / "config.yaml").is_file() or first.poll() is not None:
                break
            time.sleep(0.05)
        r = train(tmp_path, run, "seed=22", "trainer.max_steps=5")
        assert r.returncode == 1
        assert f"linrope: run folder {run} is in use by another run (pid {first.pid} on " in r.stderr
        assert "seed: 11" in (run / ".hydra" / "config.yaml").read_text()
    finally:
        first.kill()
        first.wait()


def state(folder):
    """Every file of a run folder and its bytes, but the lock and Hydra's log (which a refused run may append to)."""
    skip = {".linrope.lock", "train.log"}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name not in skip}  # fmt: skip


@pytest.mark.slow
def test_a_refused_resume_changes_nothing_in_the_finished_run(tmp_path):
    """Case 8: ``model=softmax_rope ckpt_path=last`` over a linear_rope run was refused, yet .hydra/config.yaml then
    said softmax (and the report printed ``linear_rope | softmax | rope``); a refusal for another vocabulary also
    renamed csv/metrics.csv, after which linrope report found no runs.  Both refused resumes leave every file."""
    from tests.data.helpers import write_docs

    run = tmp_path / "run"
    common = ("model=linear_rope", "logger=csv", "test=false", "trainer.max_steps=2", "trainer.val_check_interval=2")
    r = train(tmp_path, run, *common)
    assert r.returncode == 0, r.stderr[-3000:]
    before = state(run)
    assert "csv/metrics.csv" in before and "checkpoints/last.ckpt" in before
    r = train(tmp_path, run, *common, "model=softmax_rope", "ckpt_path=last")
    assert r.returncode == 1 and "is a checkpoint of another model" in r.stderr.splitlines()[-1], r.stderr[-3000:]
    assert state(run) == before
    write_docs(tmp_path / "docs", files=2, per_file=60)
    text = [o for o in TINY if not o.startswith("data.")] + ["data=text", f"data.path={tmp_path / 'docs'}"]
    r = train(tmp_path, run, *common, f"data.shards_dir={tmp_path / 'shards'}", "ckpt_path=last", base=text)
    assert r.returncode == 1 and "vocab" in r.stderr.splitlines()[-1], r.stderr[-3000:]
    assert state(run) == before
