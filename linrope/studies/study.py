"""A study that outlives a session: the jobs of a sweep, one folder each, finished ones skipped.

    python -m linrope study docs/results/budget/steps3200 experiment=budget --jobs 2 --commit
    python -m linrope study docs/results/budget/steps3200 experiment=budget --list
    python -m linrope study /tmp/s experiment=budget optim.lr=3e-3    (no tuning: the learning rate is given)

The jobs are those ``python train.py -m <overrides>`` would launch (``linrope sweeps``), each checked
(linrope.config.checks) before the first starts.  Each trains in ``<dir>/<name>`` (``linear_rope-seed1``) as
``python -m linrope train <job> hydra.run.dir=... ckpt_path=auto`` (``logger=csv`` and no progress bar unless given),
with cores / jobs threads each unless ``--threads``; paths are read from where the driver was started.  What the
driver keeps (skips, resumes, locks, stops, commits, tuning): docs/methods.md, "Studies that outlive a session", and
docs/reliability.md, "Studies and reports: what they guarantee, and the tests that check them"; the parts live in
linrope.studies.study_jobs (which folder is which job), study_tuning, study_git (``--commit``),
linrope.analysis.compact and linrope.run.folder (a job another driver holds, by its lock, is left to it).  A failed
job is reported with its log, the others go on, exit status 1.

``python -m linrope report <dir>`` reads whatever has finished."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from linrope.analysis import compact
from linrope.analysis.runs import TUNING
from linrope.base.naming import job_names
from linrope.studies.study_git import commit_part
from linrope.studies.study_jobs import DONE, Place, current_code, finished, flat, logged, mismatch, place, saved

IGNORE = "*.ckpt\n*.pt\n.linrope.lock\n.study.lock\n/*/\n"  # run folders stay out: the compact results are committed
DEFAULTS = ("logger=csv", "trainer.enable_progress_bar=false")  # unless given: the log is the study's progress
_ROOT = Path(__file__).resolve().parents[2]
CLAIM = ".study.lock"


def state(folder: Path) -> str:
    if finished(folder):
        return "done"
    if any(folder.glob("checkpoints/*.ckpt")):
        return "partial"
    return "todo"


def launch(cmd: List[str], env: Dict[str, str], out) -> subprocess.Popen:
    """A job's process, its output into ``out``, in a session of its own (the tests put a stand-in here)."""
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _test_outcome(folder: Path, job: Sequence[str]) -> Optional[Tuple[Dict[str, Any], str]]:
    """A main job's record (its last logged ``test/*`` values) and the line that shows them, None when it logged
    none.  A job whose own config turned the test off (``test=false``) has none to log: its record is then its last
    logged step and ``val/*`` values (``test_off``), where it was once counted as failed and resumed on the next
    start."""
    series = logged(folder)
    metrics = {k: v[-1][1] for k, v in series.items() if k.startswith("test/") and v}
    if metrics:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if "@" not in k)
        return {"test": metrics}, shown
    values = {k: v[-1][1] for k, v in series.items() if k.startswith("val/") and v}
    if (saved(folder) or {}).get("test") is False and values:
        step = max(s for v in series.values() for s, _ in v)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(values.items()))
        return {"test": {}, "test_off": {"last_step": step, **values}}, f"test off: step {step}, {shown}"
    return None


def check_folder(dir_: Path) -> None:
    """One line for a study path that cannot hold a study: a file, or a folder (or its parent) not writable."""
    if dir_.exists() and not dir_.is_dir():
        raise SystemExit(f"linrope study: {dir_} is a file, not a study folder; choose another path")
    existing = next(p for p in (dir_, *dir_.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"linrope study: {existing} is not writable: the study cannot write its runs there")


def _claim(folder: Path) -> Optional[int]:
    """This driver's claim on a job (an exclusive lock on ``<folder>/.study.lock``), None when another driver
    holds it."""
    from linrope.run.folder import exclusive_lock

    try:
        return exclusive_lock(folder / CLAIM)
    except IsADirectoryError:
        raise SystemExit(f"linrope study: {folder / CLAIM} is a folder, not the study's lock file; remove it") from None


class Study:
    def __init__(
        self,
        dir_: Path,
        overrides: Sequence[str],
        threads: int,
        commit: bool,
        new_folder: bool = False,
        resume_command: Optional[str] = None,
        *,
        jobs: Optional[Sequence[Sequence[str]]] = None,
        names: Optional[Sequence[str]] = None,
        tune: Union[bool, Any] = True,
        part: Optional["Study"] = None,
        what: str = "jobs",
        cache: Optional[Dict[Tuple[str, ...], Any]] = None,
        code: Optional[str] = None,
        keep_finished: bool = False,
    ):
        """``jobs`` and ``names``: these jobs in these folders (default: the sweep of ``overrides``, named by
        ``job_names``); ``tune``: run the tuning stage of the study's config (True), none (False), or this one
        (a ``linrope.analysis.study_config.Tuning``); ``part``: the study whose folder is committed (a tuning
        stage's runs: the study's)."""
        from linrope.studies.sweeps import sweep_jobs

        self.dir = Path(os.path.abspath(dir_))  # jobs run in the caller's folder: this one, given absolute
        self.threads, self.commit, self.new_folder = threads, commit, new_folder
        self.keep_finished = keep_finished
        self.given = list(overrides)
        self.fixed = list(overrides)
        self.sweep = [list(j) for j in jobs] if jobs is not None else sweep_jobs(self.fixed)
        self.names = list(names) if names is not None else job_names(self.sweep)
        given = {o.split("=", 1)[0].lstrip("+~") for o in self.fixed}
        self.fixed += [d for d in DEFAULTS if d.split("=", 1)[0] not in given]
        self.part = part or self
        self.what = what
        self._cache = {} if cache is None else cache
        self.code = code or current_code()
        self.resume_command = resume_command or " ".join(
            ["python -m linrope study", shlex.quote(str(self.dir)), *map(shlex.quote, overrides)]
        )
        self.outcome: Callable[[Path, Sequence[str]], Optional[Tuple[Dict[str, Any], str]]] = _test_outcome
        self.expects = "test metric"
        self.on_keep: Optional[Callable[[], None]] = None
        self._lock = threading.Lock()
        self._children: List[subprocess.Popen] = []
        self.failed: List[str] = []
        self.elsewhere: List[str] = []
        self.signal: Optional[int] = None  # the signal that stops the driver
        self.tuning = None
        if tune is not False:
            from linrope.studies.study_tuning import stage

            self.tuning = stage(self, None if tune is True else tune)
        self.prepare()

    def compose(self, job: Sequence[str]) -> Tuple[Any, Dict[str, Any]]:
        """(composed configuration, flat) of a job, composed once per driver."""
        from linrope.studies.sweeps import compose_train

        key = tuple(self.job_overrides(job))
        if key not in self._cache:
            cfg = compose_train(list(key))
            self._cache[key] = (cfg, flat(cfg))
        return self._cache[key]

    def prepare(self) -> None:
        """The jobs as they train: each with its configuration's tuned value (``<key>=<chosen>``) once the tuning
        stage chose it; a job whose configuration's tuning has not finished is not ready (it waits)."""
        chosen = self.tuning.chosen_overrides() if self.tuning is not None else {}
        self.jobs = [[*job, chosen[i]] if i in chosen else list(job) for i, job in enumerate(self.sweep)]
        self.ready = [self.tuning is None or i in chosen for i in range(len(self.jobs))]
        composed = [self.compose(job) for job in self.jobs]
        self.configs = [cfg for cfg, _ in composed]
        self.requested = [req for _, req in composed]
        self.places = [
            place(self.dir, name, req, self.code, self.new_folder, self.names, self.keep_finished)
            if ready
            else Place(self.dir / name)
            for name, req, ready in zip(self.names, self.requested, self.ready)
        ]

    def folder(self, i: int) -> Path:
        return self.places[i].folder

    def finished(self, i: int) -> bool:
        """Job i's folder holds its finished run: done, and the requested configuration and code (another driver
        may have finished another job there since the folders were placed)."""
        folder = self.folder(i)
        return state(folder) == "done" and not mismatch(folder, self.requested[i], self.code, self.keep_finished)

    def job_overrides(self, job: Sequence[str]) -> List[str]:
        fixed_keys = {o.split("=", 1)[0] for o in job}
        return [o for o in self.fixed if o.split("=", 1)[0] not in fixed_keys] + list(job)  # the sweep value wins

    def command(self, job: Sequence[str], folder: Path) -> List[str]:
        tail = [f"hydra.run.dir={folder}", "ckpt_path=auto"]
        return [sys.executable, "-m", "linrope", "train", *self.job_overrides(job), *tail]

    def status(self, i: int) -> str:
        """done / partial / todo, ``differs`` when the job's folder holds another job, ``waits`` while its
        configuration's tuning has not finished."""
        if not self.ready[i]:
            return "waits"
        return "differs" if self.places[i].conflict else state(self.folder(i))

    def conflicts(self) -> List[str]:
        """One line per job whose folder holds another configuration or code (the keys that differ)."""
        return [
            f"linrope study: job {self.names[i]}: {self.folder(i)} holds another run ({p.conflict}); pass "
            f"--new-folder to train this job in a folder of its own, or choose another study folder"
            for i, p in enumerate(self.places)
            if p.conflict
        ]

    def check(self) -> List[str]:
        """Every job's configuration checked before any starts (linrope.config.checks: values, pairings, the corpus)."""
        from linrope.base.errors import LinropeError
        from linrope.config.checks import validate  # torch: only when a study is about to train

        errors = []
        for i, cfg in enumerate(self.configs):
            if state(self.folder(i)) == "done":
                continue
            try:
                validate(cfg)
            except LinropeError as e:
                errors += [f"linrope study: job {self.names[i]}: {line}" for line in str(e).splitlines()]
        return errors

    def run_one(self, i: int) -> None:
        from linrope.run.folder import lock_holder  # light: no torch

        job, name, folder = self.jobs[i], self.names[i], self.folder(i)
        if self.signal is not None:
            return
        if state(folder) == "done":  # finished meanwhile by another driver: this job's run, or another one
            if mismatch(folder, self.requested[i], self.code, self.keep_finished):
                with self._lock:
                    self.failed.append(name)
                print(f"[{folder.name}] finished meanwhile by another driver with another configuration", flush=True)
            return
        holder = lock_holder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        claim = None if holder else _claim(folder)
        if claim is None:  # another process of this study runs it (two drivers may share a study)
            with self._lock:
                self.elsewhere.append(name)
            print(f"[{folder.name}] running elsewhere ({holder or 'another driver'}): left to it", flush=True)
            return
        try:
            why = mismatch(folder, self.requested[i], self.code)  # another driver's run landed here meanwhile
            if why:
                with self._lock:
                    self.failed.append(name)
                print(f"[{folder.name}] holds another run now ({why}): not trained", flush=True)
            elif state(folder) != "done" and self.signal is None:
                self._train(job, folder)
        finally:
            os.close(claim)

    def _train(self, job: Sequence[str], folder: Path) -> None:  # noqa: C901 - one job's life, in order
        name = folder.name
        cmd = self.command(job, folder)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        if (_ROOT / "pyproject.toml").is_file():  # a checkout: the jobs import this linrope from any folder
            env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        log = self.dir / f"{name}.log"
        start = time.time()
        print(f"[{name}] {state(folder)} → training ({' '.join(job)})", flush=True)
        with open(log, "a") as out:
            # a session of its own: Ctrl+C reaches the driver only, which passes it on once (twice stops at once)
            proc = launch(cmd, env, out)
            with self._lock:
                self._children.append(proc)
                if self.signal is not None:  # the driver was stopped while this job started
                    proc.send_signal(self.signal)
            rc = proc.wait()
        wall = time.time() - start
        result = self.outcome(folder, job)
        if self.signal is not None and (rc != 0 or result is None):
            ckpt = "last.ckpt saved" if state(folder) == "partial" else "no checkpoint yet"
            stopped = f"stopped by {signal.Signals(self.signal).name} after {wall / 60:.1f} min ({ckpt})"
            print(f"[{name}] {stopped}: resumable, see {log}", flush=True)
            return
        if rc != 0 or result is None:
            with self._lock:
                self.failed.append(name)
            why = f"exit status {rc}" if rc else f"no {self.expects} was logged"
            print(f"[{name}] FAILED ({why}) after {wall / 60:.1f} min: see {log}", flush=True)
            return
        record = dict(job=list(job), overrides=self.fixed, command=cmd, wall_s=round(wall, 1), threads=self.threads)
        record.update(**result[0], finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (folder / DONE).write_text(json.dumps(record, indent=1) + "\n")
        log.replace(folder / "study.log")
        print(f"[{name}] done in {wall / 60:.1f} min: {result[1]}", flush=True)
        self.keep()

    def keep(self) -> None:
        """Every finished job into the compact results, then (``--commit``) into the part's commit: one thread
        and one driver at a time (an exclusive lock on ``<dir>/.study.lock``)."""
        with self._lock, open(self.part.dir / CLAIM, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            compact.write(self.dir, finished_only=True)
            if self.on_keep is not None:
                self.on_keep()
            if self.commit:
                commit_part(self.part.dir, len(self.part.jobs))

    def _stop(self, signum, _frame) -> None:
        """SIGTERM / SIGINT: start nothing more; each running job gets the signal, saves and stops."""
        if self.signal is None:
            self.signal = signum
            name = signal.Signals(signum).name
            print(f"linrope study: {name}: stopping after the running jobs save (no job starts)", flush=True)
        with self._lock:
            for p in self._children:
                if p.poll() is None:
                    p.send_signal(signum)

    def listing(self) -> List[str]:
        """``--list``: the tuning runs (when the study tunes) and their choices so far, then every job, with its
        state."""
        lines = []
        if self.tuning is not None:
            lines += self.tuning.child.rows(TUNING + "/") + self.tuning.lines()
        return lines + self.rows()

    def rows(self, prefix: str = "") -> List[str]:
        """One line per job: its state, folder and overrides."""
        lines = []
        for i, (job, name) in enumerate(zip(self.jobs, self.names)):
            p = self.places[i]
            shown = p.folder.name if not p.conflict else f"{name} (holds another run: {p.conflict})"
            lines.append(f"{self.status(i):8} {prefix + shown:32} {' '.join(job)}")
        return lines

    def run(self, jobs: int, skip: Sequence[str] = ()) -> int:
        """Every ready job not done (nor named in ``skip``), ``jobs`` at a time; the tuning stage first."""
        errors = self.conflicts() or self.check()
        if errors:
            raise SystemExit("\n".join(errors))
        check_folder(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        gitignore = self.dir / ".gitignore"  # a folder of an older study gets the lines it lacks
        kept = gitignore.read_text().splitlines() if gitignore.exists() else []
        wanted = IGNORE + (f"!/{TUNING}/\n" if self.tuning is not None else "")  # the tuning's compact results
        missing = [line for line in wanted.splitlines() if line not in kept]
        if missing:
            gitignore.write_text("".join(f"{line}\n" for line in kept + missing))
        main_thread = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)} if main_thread else {}
        try:
            if self.tuning is not None:
                stopped = self.tuning.run(jobs)
                if stopped is not None:
                    return stopped
                self.prepare()  # the jobs with their chosen values
                errors = self.conflicts() or self.check()
                if errors:
                    raise SystemExit("\n".join(errors))
            n = len(self.jobs)
            done = [self.ready[i] and self.finished(i) for i in range(n)]
            todo = [i for i in range(n) if self.ready[i] and not done[i] and self.names[i] not in skip]
            waiting = [self.names[i] for i in range(n) if not self.ready[i]]
            print(
                f"linrope study: {n} {self.what} in {self.dir}: {sum(done)} done, {len(todo)} to run"
                + (f", {len(waiting)} waiting for their configuration's tuning" if waiting else "")
                + f", {jobs} at a time with {self.threads} thread(s) each",
                flush=True,
            )
            if self.signal is None:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    list(pool.map(self.run_one, todo))
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        left = [i for i in range(n) if not self.ready[i] or not self.finished(i)]
        print(
            f"linrope study: {n - len(left)}/{n} {self.what} done"
            + (f"; not finished: {', '.join(self.folder(i).name for i in left)}" if left else "")
            + (f" ({', '.join(self.elsewhere)} running elsewhere)" if self.elsewhere else ""),
            flush=True,
        )
        if self.signal is not None:
            stopped = f"stopped by {signal.Signals(self.signal).name}; resume with: {self.resume_command}"
            print(f"linrope study: {stopped}", flush=True)
            return 128 + int(self.signal)
        return 1 if self.failed or {self.names[i] for i in left} - set(self.elsewhere) - set(waiting) - set(skip) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # Ctrl+C before any job started (composing, checking); a job's own is handled in run
        print("linrope study: interrupted before any job started", file=sys.stderr)
        return 130


def _main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m linrope study",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="tuning: a study whose config (conf/study/<task_name>.yaml) declares `tuning` first chooses each\n"
        "configuration's learning rate on validation in <dir>/tuning/ (recorded in <dir>/tuning.json); the key on\n"
        "the command line (optim.lr=3e-3) skips it.\n\n"
        "example:\n  python -m linrope study docs/results/budget/steps3200 experiment=budget --jobs 2 --commit",
    )
    ap.add_argument("dir", type=Path, help="the study's folder: one sub-folder per job")
    ap.add_argument("overrides", nargs="*", help="train.py overrides (experiment=..., sweeps a=x,y)")
    ap.add_argument("--jobs", type=int, default=1, help="jobs at a time (default 1)")
    ap.add_argument("--threads", type=int, default=None, help="threads per job (default: cores / jobs)")
    switches = {
        "--commit": "git-commit the compact results as each job finishes, one commit per study part",
        "--list": "list the jobs and their state (the tuning runs and choices first), train nothing",
        "--compact": "write the folder's compact results (runs.json, curves.csv, results.csv) from its run folders, "
        "train nothing",
        "--new-folder": "a job whose folder holds another configuration or code trains in a folder of its own "
        "(<name>-run2) instead of being refused",
        "--keep-finished": "a finished job trained on other code counts as done (to add an arm to a finished study: "
        "each run keeps the code it recorded; a stopped one still differs)",
    }
    for flag, text in switches.items():
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument(
        "--config-dir",
        "-cd",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own configs (presets, experiments), as for train.py",
    )
    # intermixed: options may sit between the folder and the overrides (`<dir> experiment=x --jobs 2 model=a`)
    args = ap.parse_intermixed_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1 (default: cores / jobs)")
    if "=" in args.dir.name and not args.dir.exists():  # the folder forgotten: the first override taken for it
        ap.error(
            f"{args.dir} looks like an override, not the study's folder: python -m linrope study DIR {args.dir} ..."
        )
    if args.dir.exists() and not args.dir.is_dir():
        check_folder(args.dir)
    if args.compact:
        if not args.dir.is_dir():
            ap.error(f"{args.dir}: not a folder")
        n = compact.write(args.dir)
        if (args.dir / TUNING).is_dir():  # the tuning runs: their own compact results
            compact.write(args.dir / TUNING)
        if not n:
            raise SystemExit(f"linrope study: no linrope runs under {args.dir}: nothing written")
        print(f"wrote {', '.join(str(args.dir / f) for f in compact.FILES if (args.dir / f).is_file())}: {n} runs")
        return 0
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    from linrope.config.command_line import check_command_line, config_dirs_as_overrides

    command_line = [*args.overrides, *(f"--config-dir={os.path.abspath(d)}" for d in args.config_dir)]
    check_command_line(command_line, prefix="linrope study")  # model=nope, trainer.max_step=3: one line
    overrides = config_dirs_as_overrides(command_line)
    flags = [
        f"--jobs={args.jobs}",
        *([f"--threads={args.threads}"] if args.threads else []),
        *(["--commit"] if args.commit else []),
        *(["--keep-finished"] if args.keep_finished else []),
        *(["--new-folder"] if args.new_folder else []),
        *(f"--config-dir={os.path.abspath(d)}" for d in args.config_dir),
    ]
    resume = shlex.join(["python", "-m", "linrope", "study", os.path.abspath(args.dir), *args.overrides, *flags])
    study = Study(args.dir, overrides, threads, args.commit, args.new_folder, resume, keep_finished=args.keep_finished)
    if args.list:
        print("\n".join(study.listing()))
        return 0
    return study.run(args.jobs)
