"""tools/device_studies.sh: study lines side by side, stopped at a set time, the folders packed into one file
without checkpoints (what a GPU call returns, even one killed at its limit).  Its CPU stand-in runs the same
mechanics here on a 4-step study."""

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def device_studies(tmp_path, study: Path, seconds: int):
    listing = tmp_path / f"{study.name}.list"
    listing.write_text(
        "# one study line: two 4-step runs, the rate given (no tuning stage)\n"
        f"{study} experiment=recall2 model=linear seed=1,2 trainer.max_steps=4 trainer.val_check_interval=2 "
        "optim.lr=0.003 --jobs 1 --threads 1\n"
    )
    out = tmp_path / f"{study.name}.out"
    env = {
        "DEVICE_STUDIES_CPU": "1",
        "DEVICE_STUDIES_POLL": "1",
        "PYTHON": sys.executable,
        "OUT": str(out),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "device_studies.sh"), str(listing), str(seconds)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    packed = out / "studies.tar.gz"
    names = tarfile.open(packed).getnames() if packed.is_file() else []  # none: stopped before a folder existed
    return done.stdout, (out / "device_studies.log").read_text(), names


@pytest.mark.slow  # two 4-step runs of the tiny recall model, one at a time, and a stopped one (about a minute)
def test_device_studies_packs_finished_runs_without_checkpoints_and_stops_on_time(tmp_path):
    study = tmp_path / "study"
    stdout, log, names = device_studies(tmp_path, study, 600)
    assert "SIGTERM" not in log  # both runs finished well within the time
    finished = sorted(Path(n).parent.name for n in names if n.endswith("study_job.json"))
    assert finished == ["seed1", "seed2"] and f"{study}: 2 runs finished" in stdout
    assert any(n.endswith("metrics.csv") for n in names)  # the runs' logs came back
    assert not [n for n in names if n.endswith((".ckpt", ".pt", ".lock"))]  # checkpoints stay behind
    assert list(study.glob("*/checkpoints/*.ckpt"))  # (they were there)

    stopped = tmp_path / "stopped"
    stdout, log, names = device_studies(tmp_path, stopped, 0)
    assert "SIGTERM after 0 s" in log and f"{stopped}: 0 runs finished" in stdout
    assert "Cowardly" not in log  # no folder yet: nothing packed, no tar error
    assert not [n for n in names if n.endswith(("study_job.json", ".ckpt"))]  # stopped before any run finished
