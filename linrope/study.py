"""A study that outlives a session: the jobs of a sweep, one folder each, finished ones skipped.

    python -m linrope.study docs/results/budget/steps3200 experiment=budget --jobs 2 --commit
    python -m linrope.study docs/results/budget/steps3200 experiment=budget --list

The jobs are those ``python train.py -m <overrides>`` would launch (``linrope.sweeps``: the sweep of the
experiment and of the command line).  Each job trains in ``<dir>/<name>``, its name made of the values
that differ between jobs (``linear_rope-seed1``), as ``python -m linrope.train <job> hydra.run.dir=...
ckpt_path=auto`` (``logger=csv`` and no progress bar unless given), with cores / jobs threads each unless ``--threads``.

* A job whose folder holds ``study_job.json`` has finished: it is skipped.
* A job stopped part-way (a session ending, Ctrl+C) resumes from its ``last.ckpt`` on the next call.
* ``--commit`` commits each job's folder as it finishes (checkpoints excepted: ``<dir>/.gitignore``), so
  a study run in pieces across sessions keeps every finished run.
* A job that fails is reported (with its log) and left unfinished; the others go on; exit status 1.
* Two drivers may share a study (one started later to add cores): a job whose folder another run holds
  (its lock, linrope.run.folder) is left to it.

``python -m linrope.report <dir>`` reads whatever has finished."""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DONE = "study_job.json"
IGNORE = "*.ckpt\n*.pt\n.linrope.lock\n.study.lock\n/*/*.png\n"  # per-run figures and tensors stay out: the report draws the study
DEFAULTS = ("logger=csv", "trainer.enable_progress_bar=false")  # unless given: the log is the study's progress
_ROOT = Path(__file__).resolve().parents[1]


def job_names(jobs: Sequence[Sequence[str]]) -> List[str]:
    """One folder name per job, made of the override values that differ between jobs: ``model=linear_rope``
    gives ``linear_rope``, ``seed=1`` gives ``seed1``, joined by ``-``."""
    splits = [dict(o.split("=", 1) for o in job) for job in jobs]
    keys = [k for k in dict.fromkeys(k for s in splits for k in s) if len({s.get(k) for s in splits}) > 1]
    names = []
    for s in splits:
        parts = []
        for k in keys:
            v = s.get(k, "none")
            parts.append(v if k in ("model", "data", "experiment") else f"{k.split('.')[-1]}{v}")
        names.append(re.sub(r"[^A-Za-z0-9_.+-]", "_", "-".join(parts)) or "job")
    if len(set(names)) != len(names):
        raise SystemExit(f"linrope.study: two jobs would share a folder name ({names})")
    return names


def state(folder: Path) -> str:
    if (folder / DONE).is_file():
        return "done"
    if any(folder.glob("checkpoints/*.ckpt")):
        return "partial"
    return "todo"


def test_metrics(folder: Path) -> Dict[str, float]:
    """The last ``test/*`` values the run logged."""
    from linrope.runs import read_metrics  # light: csv + omegaconf
    found: Dict[str, float] = {}
    for path in sorted(folder.rglob("metrics.csv")):
        for key, series in read_metrics(path).items():
            if key.startswith("test/") and series:
                found[key] = series[-1][1]
    return found


def _commit(dir_: Path, folder: Path, message: str) -> None:
    """git add + commit of one job folder (only its paths), retried while another git holds the index."""
    for attempt in range(30):
        add = subprocess.run(["git", "add", "--", str(folder), str(dir_ / ".gitignore")], cwd=_ROOT,
                             capture_output=True, text=True)
        if add.returncode == 0:
            done = subprocess.run(["git", "commit", "-q", "-m", message, "--", str(folder), str(dir_ / ".gitignore")],
                                  cwd=_ROOT, capture_output=True, text=True)
            if done.returncode == 0:
                return
            err = done.stderr
        else:
            err = add.stderr
        if "index.lock" not in err:
            print(f"linrope.study: could not commit {folder}: {err.strip()}", file=sys.stderr)
            return
        time.sleep(2)
    print(f"linrope.study: could not commit {folder}: the git index stayed locked", file=sys.stderr)


class Study:
    def __init__(self, dir_: Path, overrides: Sequence[str], threads: int, commit: bool):
        from linrope.sweeps import sweep_jobs
        self.dir, self.threads, self.commit = dir_, threads, commit
        self.fixed = list(overrides)
        self.jobs = sweep_jobs(self.fixed)
        self.names = job_names(self.jobs)
        given = {o.split("=", 1)[0].lstrip("+~") for o in self.fixed}
        self.fixed += [d for d in DEFAULTS if d.split("=", 1)[0] not in given]
        self._lock = threading.Lock()
        self._children: List[subprocess.Popen] = []
        self.failed: List[str] = []

    def command(self, job: Sequence[str], folder: Path) -> List[str]:
        fixed_keys = {o.split("=", 1)[0] for o in job}
        fixed = [o for o in self.fixed if o.split("=", 1)[0] not in fixed_keys]  # the sweep value wins
        return [sys.executable, "-m", "linrope.train", *fixed, *job, f"hydra.run.dir={folder}", "ckpt_path=auto"]

    def run_one(self, i: int) -> None:
        from linrope.run.folder import lock_holder  # light: no torch
        job, name = self.jobs[i], self.names[i]
        folder = self.dir / name
        if state(folder) == "done":  # finished meanwhile by another process of this study
            return
        holder = lock_holder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        claim = os.open(folder / ".study.lock", os.O_RDWR | os.O_CREAT, 0o644)  # this driver's claim on the job
        try:
            if holder:
                raise BlockingIOError
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process of this study runs it (two drivers may share a study)
            os.close(claim)
            print(f"[{name}] running elsewhere ({holder or 'another driver'}): left to it", flush=True)
            return
        try:
            if state(folder) != "done":  # not finished by another driver just before this one took the claim
                self._train(job, name, folder)
        finally:
            os.close(claim)

    def _train(self, job: Sequence[str], name: str, folder: Path) -> None:
        cmd = self.command(job, folder)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        log = self.dir / f"{name}.log"
        start = time.time()
        print(f"[{name}] {state(folder)} → training ({' '.join(job)})", flush=True)
        with open(log, "a") as out:
            proc = subprocess.Popen(cmd, cwd=_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            with self._lock:
                self._children.append(proc)
            rc = proc.wait()
        wall = time.time() - start
        metrics = test_metrics(folder)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if "@" not in k)
        if rc != 0 or not metrics:
            with self._lock:
                self.failed.append(name)
            why = f"exit status {rc}" if rc else "no test metric was logged"
            print(f"[{name}] FAILED ({why}) after {wall / 60:.1f} min: see {log}", flush=True)
            return
        record = dict(job=list(job), overrides=self.fixed, command=cmd, wall_s=round(wall, 1), threads=self.threads,
                      test=metrics, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (folder / DONE).write_text(json.dumps(record, indent=1) + "\n")
        log.replace(folder / "study.log")
        print(f"[{name}] done in {wall / 60:.1f} min: {shown}", flush=True)
        if self.commit:
            with self._lock:
                _commit(self.dir, folder, f"{self.dir.name}: {name} finished ({shown}; {wall / 60:.1f} min)")

    def run(self, jobs: int) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        gitignore = self.dir / ".gitignore"  # a folder of an older study gets the lines it lacks
        kept = gitignore.read_text().splitlines() if gitignore.exists() else []
        missing = [line for line in IGNORE.splitlines() if line not in kept]
        if missing:
            gitignore.write_text("".join(f"{line}\n" for line in kept + missing))
        todo = [i for i, n in enumerate(self.names) if state(self.dir / n) != "done"]
        print(f"linrope.study: {len(self.jobs)} jobs in {self.dir}: {len(self.jobs) - len(todo)} done, "
              f"{len(todo)} to run, {jobs} at a time with {self.threads} thread(s) each", flush=True)

        def forward(signum, _frame):
            with self._lock:
                for p in self._children:
                    if p.poll() is None:
                        p.send_signal(signum)
        previous = signal.signal(signal.SIGTERM, forward)
        try:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(self.run_one, todo))
        finally:
            signal.signal(signal.SIGTERM, previous)
        left = [n for n in self.names if state(self.dir / n) != "done"]
        print(f"linrope.study: {len(self.jobs) - len(left)}/{len(self.jobs)} jobs done"
              + (f"; not finished: {', '.join(left)}" if left else ""), flush=True)
        return 1 if self.failed or left else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m linrope.study", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example:\n  python -m linrope.study docs/results/budget/steps3200 "
                                        "experiment=budget --jobs 2 --commit")
    ap.add_argument("dir", type=Path, help="the study's folder: one sub-folder per job")
    ap.add_argument("overrides", nargs="*", help="train.py overrides (experiment=..., sweeps a=x,y)")
    ap.add_argument("--jobs", type=int, default=1, help="jobs at a time (default 1)")
    ap.add_argument("--threads", type=int, default=None, help="threads per job (default: cores / jobs)")
    ap.add_argument("--commit", action="store_true", help="git-commit each job's folder as it finishes")
    ap.add_argument("--list", action="store_true", help="list the jobs and their state, train nothing")
    ap.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR",
                    help="a folder of your own configs (presets, experiments), as for train.py")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    from linrope.command_line import check_command_line, config_dirs_as_overrides
    command_line = [*args.overrides, *(f"--config-dir={d}" for d in args.config_dir)]
    check_command_line(command_line, prefix="linrope.study")  # model=nope, trainer.max_step=3: one line
    overrides = config_dirs_as_overrides(command_line)
    study = Study(args.dir, overrides, threads, args.commit)
    if args.list:
        for job, name in zip(study.jobs, study.names):
            print(f"{state(args.dir / name):8} {name:32} {' '.join(job)}")
        return 0
    return study.run(args.jobs)


if __name__ == "__main__":
    sys.exit(main())
