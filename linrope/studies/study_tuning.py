"""A study's tuning stage: each configuration's value of one setting (the learning rate) chosen on validation
before its main runs, by one rule for every configuration (docs/methods.md, "Tuning"; declared as ``tuning`` in the
study's config, linrope.analysis.study_config).

A configuration's runs are in ``<study>/tuning/<configuration>-<leaf><value>/``; a run that logged no finite value of
``metric`` scores worst, and ties go to the smaller value.  The choice is recorded in ``<study>/tuning.json``
(linrope.analysis.tuning); the main jobs of a configuration wait for it."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from linrope.analysis import tuning as record_file
from linrope.analysis.runs import TUNING
from linrope.base.naming import job_names
from linrope.studies.study_jobs import DONE, finished, record
from linrope.studies.study_jobs import logged as logged_series

if TYPE_CHECKING:  # pragma: no cover
    from linrope.analysis.study_config import Tuning as Spec

SEED = "seed"


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def value_text(v: float) -> str:
    """A value as the command line and folder names give it: ``0.002``, ``1e-05``."""
    return f"{v:.6g}"


def beyond(v: float, factor: float, up: bool) -> float:
    """The next value beyond an edge, rounded to 6 significant digits (``0.01 * 3`` is ``0.03``)."""
    return float(value_text(v * factor if up else v / factor))


def stage(study: Any, spec: Optional["Spec"] = None) -> Optional["Tuning"]:
    """The tuning stage of ``study`` (``spec``, else its config's ``tuning``), None when it has none or the key
    is given on the command line (one line says so)."""
    source = "the test's tuning"
    if spec is None:
        spec, source = _declared(study)
        if spec is None:
            return None
    given = [o for o in study.given if key_of(o) == spec.key]
    given += [o for job in study.sweep for o in job if key_of(o) == spec.key and o not in given]
    if given:
        print(
            f"linrope study: {given[0]} is given: {spec.key} is not tuned (the tuning stage of {source} is skipped)",
            flush=True,
        )
        return None
    from omegaconf import OmegaConf

    missing = object()
    if OmegaConf.select(study.compose(study.sweep[0])[0], spec.key, default=missing) is missing:
        raise SystemExit(f"linrope study: {source}: tuning.key: {spec.key} is no setting of the jobs' configuration")
    return Tuning(study, spec, source)


def _declared(study: Any) -> Tuple[Optional["Spec"], str]:
    """The ``tuning`` of ``conf/study/<task_name>.yaml`` of the jobs' experiment (None: none declared)."""
    from linrope.analysis import study_config
    from linrope.base.errors import ConfigError
    from linrope.config.command_line import CONF_DIR

    tasks = sorted({str(study.compose(job)[0].get("task_name")) for job in study.sweep})
    specs = {}
    for task in tasks:
        path = CONF_DIR / "study" / f"{task}.yaml"
        if not path.is_file():
            continue
        try:
            spec = study_config.load(path).tuning
        except ConfigError as e:
            raise SystemExit(f"linrope study: {e}") from None
        if spec is not None:
            specs[task] = (spec, str(path.relative_to(CONF_DIR.parent)))
    if not specs:
        return None, ""
    if len(tasks) > 1:
        raise SystemExit(
            f"linrope study: the jobs come from {len(tasks)} experiments ({', '.join(tasks)}) and "
            f"{specs[next(iter(specs))][1]} declares a tuning stage: run each experiment as a study of its own"
        )
    return specs[tasks[0]]


class Tuning:
    """The tuning stage of one study (module docstring)."""

    def __init__(self, study: Any, spec: "Spec", source: str):
        self.study, self.spec, self.source = study, spec, source
        self.dir = study.dir / TUNING
        configs = [tuple(o for o in job if key_of(o) != SEED) for job in study.sweep]
        self.configs: List[Tuple[str, ...]] = list(dict.fromkeys(configs))
        self.of_job = [self.configs.index(c) for c in configs]
        self.names = job_names([list(c) for c in self.configs])
        self.values: List[List[float]] = [list(spec.grid) for _ in self.configs]
        self.decisions: List[Dict[str, Any]] = []
        self.plan()

    def job(self, c: int, v: float) -> List[str]:
        tuned = [f"{SEED}={self.spec.seed}", f"{self.spec.key}={value_text(v)}"]
        return [*self.configs[c], *tuned, "test=false", "extrapolation.enabled=false"]

    def run_name(self, c: int, v: float) -> str:
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{self.names[c]}-{self.spec.leaf}{value_text(v)}")

    def runs(self) -> Any:
        """The tuning runs planned so far: a study of their own in ``<study>/tuning``, committed with the study."""
        planned = [(c, v) for c in range(len(self.configs)) for v in sorted(self.values[c])]
        s = self.study
        jobs, names = [self.job(c, v) for c, v in planned], [self.run_name(c, v) for c, v in planned]
        extra = dict(tune=False, part=s, what="tuning runs", cache=s._cache, code=s.code, keep_finished=s.keep_finished)
        # a linrope.studies.study.Study (not imported here: that module imports this one)
        runs = type(s)(
            self.dir, s.given, s.threads, s.commit, s.new_folder, s.resume_command, jobs=jobs, names=names, **extra
        )
        runs.outcome, runs.expects, runs.on_keep = self.outcome, f"{self.spec.metric} value", self.write
        runs.index = {(c, v): i for i, (c, v) in enumerate(planned)}
        return runs

    def plan(self) -> None:
        """Every configuration's values to try and its decision, from the finished runs: a best at an edge
        adds the value beyond it (while extensions are left), until nothing changes."""
        while True:
            self.child = self.runs()
            self.decisions = [self.decide(c) for c in range(len(self.configs))]
            added = [(c, d["next"]) for c, d in enumerate(self.decisions) if d.get("next") is not None]
            if not added:
                return
            for c, v in added:
                self.values[c].append(v)

    def result(self, c: int, v: float) -> Optional[Dict[str, Any]]:
        """The tuning record of the finished run of (configuration, value), None while it has not finished."""
        i = self.child.index[(c, v)]
        folder = self.child.folder(i)
        if self.child.places[i].conflict or not finished(folder):
            return None
        try:
            done = json.loads((folder / DONE).read_text())
        except (OSError, ValueError):
            done = (record(folder) or {}).get("study") or {}
        found = done.get("tuning") if isinstance(done, dict) else None
        if isinstance(found, dict) and (found.get("metric"), found.get("mode")) != (self.spec.metric, self.spec.mode):
            # scored by another rule (the study's tuning metric edited since): scored again from its logged values
            again = self.outcome(folder, self.child.jobs[i])
            if again is None:
                raise SystemExit(
                    f"linrope study: tuning run {folder} was scored by {found.get('metric')} ({found.get('mode')}) "
                    f"and logged no {self.spec.metric}, which the study now tunes on: remove it to train it again"
                )
            found = again[0]["tuning"]
        return {**found, "wall_s": done.get("wall_s"), "run": folder.name} if isinstance(found, dict) else None

    def decide(self, c: int) -> Dict[str, Any]:
        """``tried`` (ascending, each with its result or None), ``chosen`` and ``interior`` once decided (None
        before), ``next``: the value beyond the edge to try next."""
        spec = self.spec
        values = sorted(self.values[c])
        results = [self.result(c, v) for v in values]
        out: Dict[str, Any] = {"values": values, "results": results, "chosen": None, "interior": None}
        if any(r is None for r in results):
            return out
        worst = math.inf if spec.mode == "min" else -math.inf

        def score(r):
            s = r.get("score")
            return s if isinstance(s, (int, float)) and math.isfinite(s) else worst

        scores = [score(r) for r in results]
        sign = 1 if spec.mode == "min" else -1
        best = min(range(len(values)), key=lambda i: (sign * scores[i], i))  # ties go to the smaller value
        interior = 0 < best < len(values) - 1
        if not interior and len(values) - len(spec.grid) < spec.max_extensions:
            out["next"] = beyond(values[best], spec.factor, up=best == len(values) - 1 and len(values) > 1)
            return out
        out.update(chosen=values[best], interior=interior)
        if all(s == worst for s in scores):  # nothing to choose by: said under the table and in the study's lines
            out["note"] = (
                f"no value tried gave a finite {spec.metric} (every tuning run diverged or logged none); "
                f"{value_text(values[best])} was kept as the smallest, not as the best"
            )
        return out

    def chosen_overrides(self) -> Dict[int, str]:
        """job index of the study -> ``<key>=<chosen>``, for the configurations whose tuning has finished."""
        return {
            i: f"{self.spec.key}={value_text(self.decisions[c]['chosen'])}"
            for i, c in enumerate(self.of_job)
            if self.decisions[c]["chosen"] is not None
        }

    def outcome(self, folder: Path, job: Sequence[str]) -> Optional[Tuple[Dict[str, Any], str]]:
        """A tuning run's record: its score (the best logged value of the metric), the step of it and the last
        step logged; None when it logged no value of the metric."""
        spec = self.spec
        series = logged_series(folder)
        logged = series.get(spec.metric) or []
        if not logged:
            return None
        finite = [(s, v) for s, v in logged if math.isfinite(v)]
        pick = min if spec.mode == "min" else max
        step, best = pick(finite, key=lambda sv: sv[1]) if finite else (None, None)
        value = next(float(o.split("=", 1)[1]) for o in reversed(job) if key_of(o) == spec.key)
        fields = dict(key=spec.key, value=value, metric=spec.metric, mode=spec.mode, score=best, best_step=step)
        fields["last_step"] = max(s for v in series.values() for s, _ in v)
        shown = (
            f"{spec.metric} {best:.4f} (best, step {step})" if best is not None else f"{spec.metric}: no finite value"
        )
        return {"tuning": fields}, shown

    def run(self, jobs: int) -> Optional[int]:
        """Tuning runs ``jobs`` at a time, in rounds (an edge's extension after the values it extends), until every
        configuration is decided or nothing more can run here (failed, held elsewhere); the exit status when a
        signal stopped the driver, else None."""
        study, skip = self.study, set()
        while study.signal is None:
            self.plan()
            runs = self.child
            todo = [
                runs.names[i]
                for i in range(len(runs.jobs))
                if not finished(runs.folder(i)) and runs.names[i] not in skip
            ]
            if not todo:
                break
            rc = runs.run(jobs, skip=sorted(skip))
            study.failed += [f"{TUNING}/{n}" for n in runs.failed]
            study.elsewhere += [f"{TUNING}/{n}" for n in runs.elsewhere]
            skip |= {*runs.failed, *runs.elsewhere}
            if runs.signal is not None:
                study.signal = runs.signal
                return rc
            if not any(finished(runs.folder(runs.names.index(n))) for n in todo):
                break
        if study.signal is not None:
            return None  # the study's run prints how to resume
        self.plan()
        self.write()
        for line in self.lines():
            print(line, flush=True)
        return None

    def entries(self) -> List[Dict[str, Any]]:
        """Per configuration what was tried and chosen, decided afresh from the runs finished by now (a run that
        finished since the last ``plan`` is in it: the record is written as each run is kept)."""
        entries = []
        for c in range(len(self.configs)):
            d = self.decide(c)
            cfg = self.study.compose(self.job(c, d["values"][0]))[0]
            tried = [
                {"value": v, "run": f"{TUNING}/{(r or {}).get('run', self.run_name(c, v))}"}
                | {k: (r or {}).get(k) for k in ("score", "best_step", "last_step", "wall_s")}
                for v, r in zip(d["values"], d["results"])
            ]
            entry = dict(
                configuration=self.names[c], overrides=list(self.configs[c]), max_steps=cfg.trainer.get("max_steps")
            )
            extensions = len(d["values"]) - len(self.spec.grid)
            entry.update(tried=tried, extensions=extensions, chosen=d["chosen"], interior=d["interior"])
            entries.append(dict(entry, note=d["note"]) if d.get("note") else entry)
        return entries

    def write(self) -> None:
        """``<study>/tuning.json``: the rule, and per configuration what was tried and chosen so far; the entries of
        configurations this call does not tune (an earlier call's, with other models) are kept as they were."""
        spec, entries = self.spec, self.entries()
        ours = {_identity(e): e for e in entries}  # by overrides: a name depends on the call's other jobs
        earlier = (record_file.read(self.study.dir) or {}).get("configurations", [])
        entries = [ours.pop(_identity(e), e) for e in earlier] + list(ours.values())
        steps = {e["max_steps"] for e in entries}
        protocol = dict(grid=list(spec.grid), factor=spec.factor, max_extensions=spec.max_extensions, seed=spec.seed)
        protocol.update(max_steps=steps.pop() if len(steps) == 1 else None, test=False, extrapolation=False)
        rule = dict(key=spec.key, metric=spec.metric, mode=spec.mode, declared=self.source, protocol=protocol)
        record_file.write(self.study.dir, dict(rule, configurations=entries))

    def lines(self) -> List[str]:
        """One line per configuration: its choice so far."""
        out = []
        for name, d in zip(self.names, self.decisions):
            tried = ", ".join(value_text(v) for v in d["values"])
            if d["chosen"] is None:
                out.append(f"linrope study: tuning {name}: not finished ({self.spec.key} {tried})")
            else:
                where = record_file.INTERIOR if d["interior"] else record_file.AT_EDGE
                out.append(
                    f"linrope study: tuning {name}: {self.spec.key}={value_text(d['chosen'])} ({where}; tried {tried})"
                    + (f"; {d['note']}" if d.get("note") else "")
                )
        return out


def _identity(entry: Dict[str, Any]) -> frozenset:
    """A tuning record entry's configuration: its overrides, in any order."""
    return frozenset(entry.get("overrides") or [entry.get("configuration")])
