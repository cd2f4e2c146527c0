"""Sweeps: every experiment composes into valid jobs, pe_compare covers every distinct model preset,
the launcher / optuna configs compose, and a two-model sweep runs end to end (train, extrapolation,
report, standalone evaluation) on CPU."""

import csv
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.helpers import CONF, ROOT, tiny

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
SWEEP_TINY = tiny("logger=csv", "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.log_every_n_steps=1")


def job_models(experiment):
    from linrope.studies.sweeps import sweep_jobs

    jobs = sweep_jobs([f"experiment={experiment}"])
    return jobs, list(dict.fromkeys(o.split("=", 1)[1] for job in jobs for o in job if o.startswith("model=")))


def model_signature(cfg):
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("name", None)
    return repr(sorted(model.items()))


def test_the_experiments_exist():
    assert {"pe_compare", "extrapolation", "linear_rope_ablation"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", ["pe_compare", "extrapolation", "linear_rope_ablation"])
def test_experiment_sets_its_group_name_and_tag(compose, experiment):
    cfg = compose(f"experiment={experiment}", "logger=default")
    assert cfg.task_name == experiment and experiment in cfg.tags
    from linrope.base.naming import wandb_group

    # runs of one sweep share a wandb group, <experiment>-<sweep folder> (null in the config: set per sweep)
    assert cfg.logger.wandb.group is None
    assert (
        wandb_group(cfg.task_name, f"logs/{experiment}/multiruns/2026-01-01_00-00-00")
        == f"{experiment}-2026-01-01_00-00-00"
    )
    from linrope.training.builders import run_tags

    assert "task:bytes" in run_tags(cfg)


@pytest.mark.slow  # over 7 s: the slow stage (the default suite stays under about 10 minutes)
def test_pe_compare_runs_every_distinct_valid_pairing_with_two_seeds(compose):
    from linrope.config.checks import validate

    jobs, models = job_models("pe_compare")
    assert len(jobs) == 2 * len(models)
    assert {o for j in jobs for o in j if o.startswith("seed=")} == {"seed=1", "seed=2"}
    assert set(models) <= set(PRESETS), set(models) - set(PRESETS)
    signatures = {}
    for name in PRESETS:
        cfg = compose(f"model={name}", "experiment=pe_compare")
        if name in models:
            validate(cfg)  # a refused pairing would fail here
        signatures[name] = model_signature(cfg)
    listed = {signatures[m] for m in models}
    assert len(listed) == len(models), "pe_compare lists two presets that are the same model"
    missing = [n for n in PRESETS if signatures[n] not in listed]
    assert not missing, f"model presets missing from conf/experiment/pe_compare.yaml: {missing}"


@pytest.mark.slow  # over 7 s: the slow stage (the default suite stays under about 10 minutes)
def test_every_job_of_the_other_experiments_is_a_valid_config():
    from linrope.studies.sweeps import check_jobs

    results = check_jobs(["experiment=linear_rope_ablation"])
    assert len(results) == 18 and all(err is None for _, err in results), [r for r in results if r[1]]
    jobs, models = job_models("extrapolation")
    _, compared = job_models("pe_compare")
    assert len(jobs) == 3 * len(models) and set(models) <= set(compared)  # 3 seeds
    results = check_jobs(["experiment=extrapolation", "seed=1", "model=softmax_rope,linear_rope,softmax_learned"])
    assert len(results) == 3 and all(err is None for _, err in results), results


def test_the_published_studies_have_the_budget_their_claims_need(compose):
    """README's results come from these sweeps: the bytes study (5 seeds, 800 steps, every declared pair,
    extrapolation on the same bytes up to 16×) and the probes (3 seeds, two tasks, eight models)."""
    from linrope.analysis.study_config import named

    jobs, models = job_models("rope_study")
    assert len(models) == 12 and len(jobs) == 5 * len(models)
    assert {m for pair in named("rope_study").compared for m in pair} <= set(models)
    cfg = compose("experiment=rope_study")
    assert cfg.trainer.max_steps >= 800 and cfg.extrapolation.enabled
    assert max(cfg.extrapolation.factors) == 16 and cfg.extrapolation.scored_bytes >= 2**17
    jobs, models = job_models("probes")
    assert len(models) == 8 and len(jobs) == 2 * 3 * len(models)
    assert {
        "linear",
        "linear_rope",
        "linear_rope_both",
        "linear_cosine_rope",
        "linear_alibi",
        "softmax_none",
        "softmax_rope",
        "softmax_alibi",
    } == set(models)
    assert {o for job in jobs for o in job if o.startswith("data=")} == {"data=offset_copy", "data=mqar"}


def test_the_extrapolation_experiment_trains_short_and_evaluates_up_to_16x(compose):
    cfg = compose("experiment=extrapolation")
    assert cfg.extrapolation.enabled and max(cfg.extrapolation.factors) == 16
    assert cfg.data.context == cfg.model.max_len == 128


def test_sweeps_dry_run_reports_a_refused_job():
    from linrope.studies.sweeps import check_jobs

    results = check_jobs(["model=linear_rope", "position=t5,rope"])
    assert [err is None for _, err in results] == [False, True]
    assert "attention=linear with position=t5" in results[0][1]


def test_optuna_search_composes(compose):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from linrope.studies.sweeps import compose_train

    cfg = compose_train(["hparams_search=optuna"], hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "minimize"
    assert sweeper.storage is None and set(sweeper.params) == {"optim.lr", "optim.warmup_steps"}
    assert cfg.optimized_metric == "val/bpb"


@pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema")  # our file extends the plugin's
@pytest.mark.parametrize("launcher,target", [("submitit_local", "LocalLauncher"), ("submitit_slurm", "SlurmLauncher")])
def test_submitit_launchers_compose(launcher, target):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from linrope.studies.sweeps import compose_train

    cfg = compose_train([f"hydra/launcher={launcher}", "experiment=pe_compare"], hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    assert cfg.hydra.sweeper.params.seed == "1,2"


# ---- a real two-model sweep on CPU -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """python train.py -m model=softmax_rope,linear_rope (tiny, 3 steps, extrapolation at 1× and 2×)."""
    tmp = tmp_path_factory.mktemp("sweep")
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "model=softmax_rope,linear_rope",
        "experiment=pe_compare",
        "seed=1",
        *SWEEP_TINY,
        "extrapolation.enabled=true",
        "extrapolation.factors=[1,2]",
        "extrapolation.scalings=[pi,ntk]",  # two RoPE rows suffice here (the default's four: tests/evaluation)
        f"hydra.sweep.dir={tmp / 'multirun'}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "multirun"


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_sweep_runs_both_models_with_logs_and_extrapolation(sweep):
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [r.name for r in runs] == ["linear_rope", "softmax_rope"]  # each job's folder named by what varies
    names = [OmegaConf.load(r / ".hydra" / "config.yaml").model.name for r in runs]
    assert names == ["linear_rope", "softmax_rope"]
    for r in runs:
        header = (r / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
        assert {"val/bpb", "test/bpb", "train/loss"} <= set(header)
        rows = list(csv.DictReader(open(r / "extrapolation.csv")))
        plain = [(p, s, "") for p in ("sliding", "windows") for s in ("none", "pi", "ntk")]
        assert [(row["length"], row["protocol"], row["scaling"], row["window"]) for row in rows] == [
            *[("64", *x) for x in plain],
            *[("128", *x) for x in plain],
            ("128", "windows", "none", "64"),  # the context-limited control beyond the training context
        ]
        assert all(row["status"] == "ok" and 0 < float(row["bpb"]) < 12 for row in rows)
        assert len({(row["scored"], row["scored_hash"]) for row in rows}) == 1  # the same bytes at both lengths
        assert (r / "extrapolation.png").stat().st_size > 0


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_report_on_the_sweep(sweep, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "linrope", "report", str(sweep), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert "| softmax_rope | softmax | rope | 1 (1) |" in report and "| linear_rope | linear | rope | 1 (1) |" in report
    assert "## Length extrapolation" in report and "softmax_rope" in r.stdout
    for png in ("val_curves.png", "extrapolation.png"):
        assert (tmp_path / png).stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert {row["configuration"] for row in rows} == {"softmax_rope", "linear_rope"}


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_evaluate_a_checkpoint_standalone(sweep, tmp_path):
    ckpt = sweep / "softmax_rope" / "checkpoints" / "last.ckpt"
    cmd = [
        sys.executable,
        "-m",
        "linrope",
        "evaluate",
        f"ckpt={ckpt}",
        "lengths=[64,128,256]",
        "scalings=[pi]",
        f"out={tmp_path}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "evaluate.csv")))
    plain = [(p, s, "") for p in ("sliding", "windows") for s in ("none", "pi")]
    assert [(row["length"], row["protocol"], row["scaling"], row["window"]) for row in rows] == [
        *[("64", *x) for x in plain],
        *[("128", *x) for x in plain],
        ("128", "windows", "none", "64"),
        *[("256", *x) for x in plain],
        ("256", "windows", "none", "64"),
    ]
    assert all(row["status"] == "ok" for row in rows)
    # the test split of data.max_bytes=400000 holds 20 000 bytes: all but the first scored at every length
    assert {row["scored"] for row in rows} == {"19999"} and len({row["scored_hash"] for row in rows}) == 1
    assert "length" in r.stdout and "bpb" in r.stdout and (tmp_path / "evaluate.png").exists()
    assert r.stdout.splitlines()[-1].startswith(f"next: python -m linrope passkey ckpt={ckpt}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # no Hydra folders
        "evaluate.csv",
        "evaluate.png",
        "evaluate_documents.csv",
        "evaluate_positions.csv",
    ]

    # the same numbers as the run's own evaluation after testing (same weights, same scored bytes)
    def key(row):
        return row["length"], row["protocol"], row["scaling"], row["window"]

    own = {key(row): row for row in csv.DictReader(open(sweep / "softmax_rope" / "extrapolation.csv"))}
    for row in rows[:5]:  # 64 and 128, both protocols, and the control at 128
        assert float(row["loss"]) == pytest.approx(float(own[key(row)]["loss"]), rel=1e-5)
        assert row["scored_hash"] == own[key(row)]["scored_hash"]
