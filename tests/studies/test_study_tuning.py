"""The tuning stage of linrope study (issue 34, item 4): every configuration's learning rate chosen on validation
before its main runs, by one rule (grid, extension beyond an edge, seed, steps) for every configuration; recorded in
tuning.json and the report.  A stand-in trainer (``FakeTrain``) writes what linrope train leaves in a run folder
(the saved configuration, metrics.csv) with validation scores fabricated from the learning rate, so that the choice
of each configuration is known beforehand; the real trainer's part is checked by test_a_real_tuning_run."""

import json
import math
import subprocess

import pytest
from omegaconf import OmegaConf

from linrope.analysis import tuning as tuning_record
from linrope.analysis.study_config import Tuning
from linrope.studies import study as study_module
from linrope.studies.study import DONE, Study

TINY = ["experiment=budget", "size=tiny", "trainer.max_steps=4"]
FAST = ["trainer.val_check_interval=2", "data.val_windows=2", "data.test_windows=2", "data.max_bytes=400000"]
SPEC = Tuning("optim.lr", (1e-3, 2e-3, 4e-3), 2.0, 3, 0, "val/bpb", "min")  # conf/study/budget.yaml's


def val_bpb(lr, optimum):
    """The fabricated score: lowest at ``optimum``, growing with the log-distance from it."""
    return 1.0 + math.log(lr / optimum) ** 2


class FakeTrain:
    """A finished (or failed) run, at once, in the folder the driver names; the driver's own composed
    configuration is saved (the cache it shares), as Hydra would."""

    def __init__(self, cache, optima, calls, fail=()):
        self.cache, self.optima, self.calls, self.fail = cache, optima, calls, set(fail)

    def __call__(self, cmd, env, out):
        args = cmd[4:]  # python -m linrope train <overrides>
        folder = study_module.Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")))
        overrides = tuple(a for a in args if not a.startswith(("hydra.run.dir=", "ckpt_path=")))
        cfg = self.cache[overrides][0]
        self.calls.append((folder.parent.name, folder.name, overrides))
        (folder / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, folder / ".hydra" / "config.yaml")
        if folder.name in self.fail:  # stopped part-way: a checkpoint, no metrics
            (folder / "checkpoints").mkdir(exist_ok=True)
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
            return Done(1)
        optimum = self.optima[cfg.model.name]  # None: the run diverged (its scores NaN)
        score = math.nan if optimum is None else val_bpb(cfg.optim.lr, optimum)
        rows = ["step,val/bpb,val/acc,test/bpb"]
        rows += [f"{s},{score + 0.1 * (3 - s)},{1 / (score + 0.1 * (3 - s))}," for s in (1, 3)]
        if cfg.test:
            rows.append(f"3,,,{score + 0.5}")
        (folder / "csv").mkdir(exist_ok=True)
        (folder / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
        return Done(0)


class Done:
    def __init__(self, rc):
        self.returncode = rc

    def wait(self):
        return self.returncode

    def poll(self):
        return self.returncode


@pytest.fixture
def trainer(monkeypatch):
    """(cache to give the Study, calls made): ``trainer.start(optima, fail)`` puts the stand-in in place."""

    class T:
        cache, calls = {}, []

        def start(self, optima, fail=()):
            monkeypatch.setattr(study_module, "launch", FakeTrain(self.cache, optima, self.calls, fail))

    return T()


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def test_tuning_runs_first_on_validation_and_the_main_jobs_train_at_the_choice(tmp_path, trainer, capsys):
    """Two configurations: linear's best (2e-3) is interior at once; linear_rope's best sits at the grid's top
    edge (4e-3), so 8e-3 is tried, then 1.6e-2, and 8e-3 is interior.  The tuning runs train before any main job,
    at seed 0, test and extrapolation off, in <study>/tuning/; each main job gets its configuration's choice; the
    record, the commit and the report carry it."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.name", "t")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "start")
    trainer.start({"linear_rope": 1e-2, "linear": 2e-3})
    s = tmp_path / "b" / "steps4"  # an arm of a study run in arms (budget: steps<N>/)
    study = Study(s, [*TINY, "model=linear_rope,linear", "seed=1"], 1, True, cache=trainer.cache)
    assert study.tuning.spec == SPEC  # conf/study/budget.yaml's, found by the jobs' task_name
    assert study.run(jobs=2) == 0
    where = [parent for parent, _, _ in trainer.calls]
    assert where == ["tuning"] * 8 + ["steps4"] * 2  # every tuning run before the first main job
    for _, _, overrides in trainer.calls[:8]:
        assert {"seed=0", "test=false", "extrapolation.enabled=false", "trainer.max_steps=4"} <= set(overrides)
    assert sorted(name for _, name, _ in trainer.calls[:8]) == [
        "linear-lr0.001",
        "linear-lr0.002",
        "linear-lr0.004",
        "linear_rope-lr0.001",
        "linear_rope-lr0.002",
        "linear_rope-lr0.004",
        "linear_rope-lr0.008",
        "linear_rope-lr0.016",
    ]
    assert [n for _, n, _ in trainer.calls[:8]].index("linear_rope-lr0.016") == 7  # after the value it extends
    main_jobs = {name: overrides for _, name, overrides in trainer.calls[8:]}
    assert main_jobs["linear_rope"][-1] == "optim.lr=0.008" and main_jobs["linear"][-1] == "optim.lr=0.002"
    assert "test=false" not in main_jobs["linear"] and "seed=1" in main_jobs["linear"]
    assert OmegaConf.load(s / "linear_rope" / ".hydra" / "config.yaml").optim.lr == 0.008

    record = tuning_record.read(s)
    assert record["key"] == "optim.lr" and record["metric"] == "val/bpb" and record["mode"] == "min"
    assert record["protocol"] == {
        "grid": [0.001, 0.002, 0.004],
        "factor": 2.0,
        "max_extensions": 3,
        "seed": 0,
        "max_steps": 4,
        "test": False,
        "extrapolation": False,
    }
    by = {e["configuration"]: e for e in record["configurations"]}
    rope = by["linear_rope"]
    assert [t["value"] for t in rope["tried"]] == [0.001, 0.002, 0.004, 0.008, 0.016]
    assert [t["score"] for t in rope["tried"]] == pytest.approx(
        [val_bpb(v, 1e-2) for v in (1e-3, 2e-3, 4e-3, 8e-3, 16e-3)]
    )
    assert rope["chosen"] == 0.008 and rope["interior"] is True and rope["extensions"] == 2
    assert all(t["best_step"] == 3 and t["last_step"] == 3 and t["wall_s"] is not None for t in rope["tried"])
    assert rope["tried"][3]["run"] == "tuning/linear_rope-lr0.008" and rope["max_steps"] == 4
    assert by["linear"]["chosen"] == 0.002 and by["linear"]["interior"] is True and by["linear"]["extensions"] == 0
    out = capsys.readouterr().out
    assert (
        "linrope study: tuning linear_rope: optim.lr=0.008 (interior; tried 0.001, 0.002, 0.004, 0.008, 0.016)" in out
    )

    # the tuning runs are not among the study's runs; they are kept in compact form beside it, and committed
    assert [r["run"] for r in json.loads((s / "runs.json").read_text())["runs"]] == ["linear", "linear_rope"]
    assert len(json.loads((s / "tuning" / "runs.json").read_text())["runs"]) == 8
    committed = git(tmp_path, "show", "--name-only", "--format=%B", "HEAD")
    for path in ("tuning.json", "tuning/runs.json", "tuning/curves.csv", "runs.json", ".gitignore"):
        path = f"b/steps4/{path}"
        assert path in committed.split()
    assert "tuning linear_rope: optim.lr 0.008 (interior); tried 0.001, 0.002, 0.004, 0.008, 0.016" in committed
    assert git(tmp_path, "rev-list", "--count", "HEAD") == "2\n" and not git(tmp_path, "status", "--porcelain")

    from linrope.analysis.report import build_report

    text = build_report([s], s)
    assert "## Tuning (validation only)" in text and text == (s / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| linear_rope |"))
    assert row.split(" | ")[1:5] == ["0.001, 0.002, 0.004, 0.008, 0.016", row.split(" | ")[2], "0.008", "interior"]
    assert "**1.0498**" in row  # the chosen value's score
    assert row.split(" | ")[5] == "3"  # the last step each tuning run logged (4 steps: 0 … 3)
    assert "seed 0 with the main runs' steps and schedule (4 steps)" in text and "lowest val/bpb" in text
    from linrope.analysis import study_config
    from linrope.analysis.arms import arms_table

    table = arms_table(tmp_path / "b", study_config.named("budget"), reports=False, write=False)
    assert "## Tuning (validation only): 4 steps" in table and row in table  # the study's table, per arm

    again = Study(s, [*TINY, "model=linear_rope,linear", "seed=1"], 1, False, cache=trainer.cache)
    assert again.run(jobs=1) == 0
    assert len(trainer.calls) == 10  # all finished: nothing trains again
    listed = again.listing()  # --list
    assert listed[0].split()[:2] == ["done", "tuning/linear_rope-lr0.001"] and len(listed) == 8 + 2 + 2
    assert listed[-2].split()[:2] == ["done", "linear_rope"] and listed[-2].endswith("optim.lr=0.008")

    # a fresh checkout of the commit: no run folders, the compact results alone; nothing to train, same choice
    import shutil

    for folder in [*s.glob("tuning/*/"), *s.glob("linear*/")]:
        shutil.rmtree(folder)
    fresh = Study(s, [*TINY, "model=linear_rope,linear", "seed=1"], 1, False, cache=trainer.cache)
    assert fresh.listing() == listed and not list(s.glob("tuning/*/"))


@pytest.mark.slow  # over 7 s: the slow stage (the default suite stays under about 10 minutes)
def test_a_best_still_at_an_edge_after_every_extension_is_recorded_at_edge(tmp_path, trainer):
    """A best at the top edge is extended upwards (× 2), one at the bottom edge downwards (÷ 2), at most
    max_extensions times; then the edge value is chosen and marked at edge (not interior).  Here the highest
    val/acc (mode max) of a grid of two."""
    trainer.start({"linear_rope": 1.0, "linear": 1e-6})
    s = tmp_path / "s"
    spec = Tuning("optim.lr", (2e-3, 4e-3), 2.0, 2, 0, "val/acc", "max")
    study = Study(s, [*TINY, "model=linear_rope,linear", "seed=1"], 1, False, tune=spec, cache=trainer.cache)
    assert study.run(jobs=1) == 0
    record = tuning_record.read(s)
    by = {e["configuration"]: e for e in record["configurations"]}
    assert [t["value"] for t in by["linear_rope"]["tried"]] == [0.002, 0.004, 0.008, 0.016]
    assert [t["value"] for t in by["linear"]["tried"]] == [0.0005, 0.001, 0.002, 0.004]
    assert (by["linear_rope"]["chosen"], by["linear_rope"]["interior"]) == (0.016, False)
    assert (by["linear"]["chosen"], by["linear"]["interior"]) == (0.0005, False)
    assert by["linear"]["tried"][0]["score"] == pytest.approx(1 / val_bpb(0.0005, 1e-6))  # the highest val/acc
    assert tuning_record.where(by["linear"]) == "at edge"
    main_jobs = {name: overrides for parent, name, overrides in trainer.calls if parent == "s"}
    assert main_jobs["linear"][-1] == "optim.lr=0.0005" and main_jobs["linear_rope"][-1] == "optim.lr=0.016"
    table = "\n".join(tuning_record.section(record))
    assert "| linear | 0.0005, 0.001, 0.002, 0.004 |" in table and "| 0.0005 | at edge |" in table
    assert "highest val/acc" in table


def test_a_configuration_whose_every_tuning_run_diverged_says_so(tmp_path, trainer, capsys):
    """No value gave a finite val/bpb: the search still goes down to the last extension and keeps the smallest, but
    the record, the report's table and the study's line say it was kept as the smallest, not chosen as the best."""
    trainer.start({"linear_rope": 2e-3, "linear": None})
    s = tmp_path / "s"
    spec = Tuning("optim.lr", (2e-3, 4e-3), 2.0, 1, 0, "val/bpb", "min")
    study = Study(s, [*TINY, "model=linear_rope,linear", "seed=1"], 1, False, tune=spec, cache=trainer.cache)
    assert study.run(jobs=1) == 0
    by = {e["configuration"]: e for e in tuning_record.read(s)["configurations"]}
    assert (by["linear"]["chosen"], by["linear"]["interior"]) == (0.001, False)
    note = "no value tried gave a finite val/bpb (every tuning run diverged or logged none); 0.001 was kept as the "
    assert by["linear"]["note"] == note + "smallest, not as the best" and "note" not in by["linear_rope"]
    assert f"- **linear**: {note}" in "\n".join(tuning_record.section(tuning_record.read(s)))
    assert f"linrope study: tuning linear: optim.lr=0.001 (at edge; tried 0.001, 0.002, 0.004); {note}" in (
        capsys.readouterr().out
    )


def test_the_record_holds_each_tuning_runs_score_as_soon_as_it_finishes(tmp_path, trainer, monkeypatch):
    """tuning.json is committed with every finished tuning run (--commit), so a session that ends part-way through
    a configuration's grid leaves the scores so far in it, not only once the configuration is decided."""
    trainer.start({"linear": 2e-3})
    s, seen, launch = tmp_path / "s", [], study_module.launch

    def spy(cmd, env, out):  # what the record says as each run starts (one at a time)
        record = tuning_record.read(s)
        seen.append([t["score"] for e in (record or {}).get("configurations", []) for t in e["tried"]])
        return launch(cmd, env, out)

    monkeypatch.setattr(study_module, "launch", spy)
    study = Study(s, [*TINY, "model=linear", "seed=1"], 1, False, cache=trainer.cache)
    assert study.run(jobs=1) == 0
    assert [sum(x is not None for x in scores) for scores in seen[1:3]] == [1, 2]  # before the 2nd and the 3rd


def test_a_study_adding_configurations_keeps_the_earlier_ones_tuning_record(tmp_path, trainer):
    """A study run again with other configurations (a new arm, as issue 55's cosine arms joined the headline study)
    adds theirs to tuning.json and keeps what the earlier configurations tried and chose (it was rewritten with the
    new ones alone, losing the record the committed main runs rest on)."""
    trainer.start({"linear": 2e-3, "linear_rope": 2e-3, "linear_alibi": 2e-3, "softmax_rope": 2e-3})
    s = tmp_path / "s"

    def study(models, jobs):
        assert Study(s, [*TINY, f"model={models}", "seed=1"], 1, False, cache=trainer.cache).run(jobs=jobs) == 0
        return tuning_record.read(s)["configurations"]

    first = study("linear,linear_rope", 2)
    second = study("linear_alibi,softmax_rope", 2)
    assert [e["configuration"] for e in second] == ["linear", "linear_rope", "linear_alibi", "softmax_rope"]
    assert second[:2] == first and [e["chosen"] for e in second[2:]] == [0.002, 0.002]


def test_a_stopped_tuning_resumes_and_no_finished_run_trains_again(tmp_path, trainer, capsys):
    """A tuning run stopped part-way (a checkpoint, no score): its configuration's main jobs do not start, the
    other configuration goes on; the next call trains only that run (and what follows from it)."""
    trainer.start({"linear_rope": 2.5e-3, "linear": 2e-3}, fail={"linear_rope-lr0.004"})
    s = tmp_path / "s"
    asked = [*TINY, "model=linear_rope,linear", "seed=1"]
    assert Study(s, asked, 1, False, cache=trainer.cache).run(jobs=1) == 1
    out = capsys.readouterr().out
    assert "[linear_rope-lr0.004] FAILED" in out and "linrope study: tuning linear_rope: not finished" in out
    assert [name for parent, name, _ in trainer.calls if parent == "s"] == ["linear"]  # linear_rope's waits
    rope = next(e for e in tuning_record.read(s)["configurations"] if e["configuration"] == "linear_rope")
    assert rope["chosen"] is None and rope["tried"][2]["score"] is None
    assert tuning_record.where(rope) == "unfinished"
    listed = "\n".join(Study(s, asked, 1, False, cache=trainer.cache).listing())  # --list
    assert "partial  tuning/linear_rope-lr0.004" in listed and "waits    linear_rope" in listed

    before = len(trainer.calls)
    trainer.start({"linear_rope": 2.5e-3, "linear": 2e-3})
    assert Study(s, asked, 1, False, cache=trainer.cache).run(jobs=1) == 0
    assert [name for _, name, _ in trainer.calls[before:]] == ["linear_rope-lr0.004", "linear_rope"]
    rope = next(e for e in tuning_record.read(s)["configurations"] if e["configuration"] == "linear_rope")
    assert (rope["chosen"], rope["interior"]) == (0.002, True) and rope["tried"][2]["score"] is not None
    assert json.loads((s / "linear_rope" / DONE).read_text())["job"][-1] == f"optim.lr={rope['chosen']:g}"


def test_the_learning_rate_given_on_the_command_line_skips_the_tuning(tmp_path, trainer, capsys):
    trainer.start({"linear_rope": 2e-3})
    s = tmp_path / "s"
    study = Study(s, [*TINY, "model=linear_rope", "seed=1", "optim.lr=3e-3"], 1, False, cache=trainer.cache)
    out = capsys.readouterr().out
    assert out == (
        "linrope study: optim.lr=3e-3 is given: optim.lr is not tuned (the tuning stage of "
        "conf/study/budget.yaml is skipped)\n"
    )
    assert study.tuning is None and study.run(jobs=1) == 0
    assert [name for _, name, _ in trainer.calls] == ["job"] and not (s / "tuning").exists()
    assert not (s / tuning_record.RECORD).exists()


def test_a_study_without_tuning_runs_as_before(tmp_path, trainer):
    """No tuning declared (a sweep of train's own task): no tuning runs, no tuning.json, the jobs as given."""
    trainer.start({"linear_rope": 2e-3})
    study = Study(
        tmp_path / "s", ["size=tiny", "trainer.max_steps=4", "model=linear_rope"], 1, False, cache=trainer.cache
    )
    assert study.tuning is None and study.run(jobs=1) == 0
    assert [name for _, name, _ in trainer.calls] == ["job"] and not (tmp_path / "s" / "tuning").exists()
    assert (tmp_path / "s" / ".gitignore").read_text().split()[-1] == "/*/"


@pytest.mark.slow
def test_a_real_tuning_run(tmp_path):
    """linrope train itself: a tuning run logs the validation metric, never tests, and the main job trains at the
    value chosen (one value, no extension: the shortest tuning there is)."""
    study = Study(
        tmp_path / "s",
        [*TINY, *FAST, "model=linear_rope", "seed=1", "extrapolation.enabled=false"],
        1,
        False,
        tune=Tuning("optim.lr", (3e-3,), 2.0, 0, 0, "val/bpb", "min"),
    )
    assert study.run(jobs=1) == 0
    run = tmp_path / "s" / "tuning" / "job-lr0.003"
    metrics = (run / "csv" / "metrics.csv").read_text()
    assert "val/bpb" in metrics and "test/" not in metrics and not (run / "extrapolation.csv").exists()
    done = json.loads((tmp_path / "s" / "job" / DONE).read_text())
    assert done["job"][-1] == "optim.lr=0.003" and done["test"]["test/bpb"] > 0


def test_a_tuning_rule_edited_since_scores_the_finished_runs_again(tmp_path, trainer):
    """The study's tuning metric changed between two sessions (val/bpb, min; then val/acc, max): the finished
    tuning runs kept their val/bpb scores and those were maximised, so the main job trained at the worst rate
    and tuning.json named val/acc beside val/bpb numbers.  They are scored again from their logged values."""
    trainer.start({"linear": 2e-3})
    s = tmp_path / "s"
    jobs = [*TINY, "model=linear", "seed=1"]
    first = Study(s, jobs, 1, False, tune=Tuning("optim.lr", (1e-3, 2e-3, 4e-3), 2.0, 0, 0, "val/bpb", "min"),
                  cache=trainer.cache)  # fmt: skip
    first.tuning.run(1)
    trained = len(trainer.calls)
    edited = Tuning("optim.lr", (1e-3, 2e-3, 4e-3), 2.0, 0, 0, "val/acc", "max")
    assert Study(s, jobs, 1, False, tune=edited, cache=trainer.cache).run(jobs=1) == 0
    assert [parent for parent, _, _ in trainer.calls[trained:]] == ["s"]  # the main job only: nothing retrained
    (entry,) = tuning_record.read(s)["configurations"]
    assert entry["chosen"] == 0.002 and trainer.calls[-1][2][-1] == "optim.lr=0.002"
    assert [t["score"] for t in entry["tried"]] == pytest.approx([1 / val_bpb(v, 2e-3) for v in (1e-3, 2e-3, 4e-3)])
