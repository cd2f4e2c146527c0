"""Dashboards as code (``python -m linrope dashboard``): the workspace and report specs build offline, and
every metric a panel names is one the training loop logs — checked against two real tiny runs (bytes
with length extrapolation, and mqar) whose wandb calls are recorded (those two tests are slow: about 15 s
of CPU for the two runs)."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

import linrope.run.loggers
from tests.helpers import CONF, ROOT

TINY = [
    "size=tiny",
    "trainer.enable_progress_bar=false",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "data.batch_size=2",
    "data.eval_batch_size=2",
    f"logger.wandb._target_={__name__}.WandbLogger",
]  # the class below
BYTES = [
    "data.max_bytes=200000",
    "data.val_windows=2",
    "data.test_windows=2",
    "extrapolation.enabled=true",
    "extrapolation.factors=[1,2]",
    "extrapolation.scalings=[pi]",
    "extrapolation.scored_bytes=512",
]
MQAR = ["data=mqar", "data.val_examples=8", "data.test_examples=8", "extrapolation.enabled=true",
        "extrapolation.factors=[1,2]", "extrapolation.scalings=[pi]"]  # fmt: skip


class WandbLogger(linrope.run.loggers.WandbLogger):
    """Test-only: the keys of everything logged to wandb, as wandb receives them (with Lightning's step key).
    (Named like the real one: train.py and linrope evaluate find the wandb logger by its class name.)"""

    logged: set = set()

    def log_metrics(self, metrics, step=None):
        exp = self.experiment
        # asked of the hook itself: wandb < 0.18's disabled run answers every attribute with a truthy stand-in
        if getattr(exp.log, "recorder", None) is not WandbLogger:
            real_log = exp.log

            def log(data, *args, **kwargs):
                WandbLogger.logged.update(data)
                return real_log(data, *args, **kwargs)

            log.recorder = WandbLogger
            exp.log = log
        super().log_metrics(metrics, step)


def _compose(out, overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="train", overrides=[f"paths.output_dir={out}", *overrides])
    finally:
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep folder of two real tiny runs (bytes: with extrapolation, mqar), and the keys they logged:
    (folder, keys sent to wandb, columns of their metrics.csv)."""
    import train

    folder = tmp_path_factory.mktemp("sweep")
    old = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = "disabled"
    WandbLogger.logged = set()
    columns = set()
    try:
        for job, extra in (("bytes", BYTES), ("mqar", MQAR)):  # named by what differs, as a sweep names them
            cfg = _compose(folder / job, [*TINY, *extra])
            (folder / job / ".hydra").mkdir(parents=True)
            OmegaConf.save(cfg, folder / job / ".hydra" / "config.yaml")
            train.main(cfg)
            columns |= set((folder / job / "csv" / "metrics.csv").read_text().splitlines()[0].split(","))
    finally:
        if old is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = old
    return folder, set(WandbLogger.logged), columns


@pytest.mark.slow
def test_every_panel_metric_is_logged_by_the_training_loop(sweep):
    from linrope.analysis.dashboard import STEP, panel_metrics, sections, target_from_sweep

    folder, logged, columns = sweep
    target = target_from_sweep(folder)
    assert target.tasks == ["bytes", "mqar"] and target.lengths == [64, 128] and target.scalings == ["pi"]
    names = panel_metrics(sections(target))
    assert {
        "val/bpb",
        "test/bpb",
        "val/acc",
        "test/acc",
        "train/tokens_per_sec",
        "extrapolation/table",
        "extrapolation/none/bpb@128",
        "extrapolation/pi/bpb@64",
        "extrapolation/none/acc@128",  # the tasks' table logs accuracy (it named loss@N, which no run logs)
        "extrapolation/pi/acc@64",
    } <= set(names)
    missing = [m for m in names if m not in logged]
    assert not missing, f"panels name metrics the training loop never logged: {missing}"
    # what is logged step by step is in metrics.csv too (the extrapolation table and plot go to wandb only)
    assert {m for m in names if not m.startswith("extrapolation/")} <= columns
    assert STEP in logged  # the x axis of the line plots


def test_the_group_and_the_sections_read_from_any_folder_of_a_sweep(tmp_path, monkeypatch):
    """The group is the sweep's from its folder given as "." (it was "train-": "." has no name) or from one job's
    folder (it was "train", a group the job never logged to); text runs get the bits-per-byte panels (they got the
    tasks' accuracy panels, which they never log)."""
    from pathlib import Path

    from linrope.analysis.dashboard import GROUP_BY, panel_metrics, sections, target_from_sweep

    sweep = tmp_path / "2026-12-01_06-00-00"
    for job, seed, lr in (("a", 1, 1e-3), ("b", 2, 3e-3)):
        config = {"task_name": "train", "seed": seed, "data": {"task": "text", "context": 32}, "optim": {"lr": lr}}
        config["extrapolation"] = {"enabled": True, "factors": [1, 2]}
        (sweep / job / ".hydra").mkdir(parents=True)
        OmegaConf.save(config, sweep / job / ".hydra" / "config.yaml")
    (sweep / "multirun.yaml").write_text("{}\n")
    monkeypatch.chdir(sweep)
    assert target_from_sweep(Path(".")).group == target_from_sweep(sweep).group == "train-2026-12-01_06-00-00"
    assert target_from_sweep(sweep / "a").group == "train-2026-12-01_06-00-00"
    (sweep / "multirun.yaml").unlink()
    assert target_from_sweep(sweep / "a").group == "train"  # a single run's folder: its task's group
    names = set(panel_metrics(sections(target_from_sweep(sweep))))
    assert {"val/bpb", "test/bpb", "extrapolation/none/bpb@32", "extrapolation/none/bpb@64"} <= names
    assert not {m for m in names if "acc" in m or "loss@" in m}
    # grouped by what the runs differ in beyond their seed: two learning rates are two lines, not one mean over seeds
    assert target_from_sweep(sweep).group_by == [*GROUP_BY, "optim.lr"]

    # one line, not a traceback: --out names a file; a job with an extrapolation table and no context
    from linrope.analysis.dashboard import main

    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as e:
        main([str(sweep), "--dry-run", "--out", str(tmp_path / "afile")])
    assert e.value.code == f"linrope: --out {tmp_path / 'afile'}: cannot write into {tmp_path / 'afile'} (not a folder)"
    OmegaConf.save(
        {"data": {"task": "bytes"}, "extrapolation": {"enabled": True}}, sweep / "b" / ".hydra" / "config.yaml"
    )
    with pytest.raises(SystemExit, match="extrapolation.enabled, but no data.context or context"):
        target_from_sweep(sweep)


@pytest.mark.slow
def test_dry_run_writes_the_workspace_and_the_report(sweep, tmp_path):
    pytest.importorskip("wandb_workspaces", reason="pip install -e '.[dashboards]'")
    from linrope.analysis.dashboard import panel_metrics, sections, target_from_sweep

    folder, _, _ = sweep
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["HOME"] = str(tmp_path)  # no ~/.netrc: nothing may need a login
    r = subprocess.run(
        [sys.executable, "-m", "linrope", "dashboard", str(folder), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["dashboard.json", "report.json", "workspace.json"]
    target = target_from_sweep(folder)
    group = json.loads((tmp_path / "dashboard.json").read_text())["target"]["group"]
    assert group == target.group == f"train-{folder.name}"  # <task_name>-<sweep folder>, as the runs were grouped
    workspace = json.loads((tmp_path / "workspace.json").read_text())
    report = json.loads((tmp_path / "report.json").read_text())
    run_set = workspace["spec"]["section"]["runSets"][0]
    assert run_set["filters"]["filters"][0] == {
        "key": {"section": "run", "name": "group"},
        "op": "=",
        "value": group,
        "disabled": False,
    }
    assert [g["name"] for g in run_set["grouping"]] == [
        "model.value.attention.kind",
        "model.value.position.name",
        "model.value.name",
        "data.value._target_",  # the two runs' tasks: their data modules differ
    ]
    sections_made = workspace["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections_made] == [s.name for s in sections(target)]
    shown = {json.dumps(p["config"]) for s in sections_made for p in s["panels"]}
    for spec in (" ".join(shown), json.dumps(report)):
        assert all(json.dumps(m) in spec for m in panel_metrics(sections(target)))
    grids = [b for b in report["spec"]["blocks"] if b["type"] == "panel-grid"]
    assert len(grids) == len(sections_made)
    assert all(g["metadata"]["runSets"][0]["filters"]["filters"][0]["value"] == group for g in grids)


def test_plain_spec_without_wandb_workspaces(tmp_path, monkeypatch, capsys):
    from linrope.analysis.dashboard import main

    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # import fails
    assert (
        main(
            [
                "--group",
                "pe_compare-2026-01-01_00-00-00",
                "--dry-run",
                "--out",
                str(tmp_path),
                "--lengths",
                "256",
                "512",
            ]
        )
        == 0
    )
    assert [p.name for p in tmp_path.iterdir()] == ["dashboard.json"]
    assert "wandb-workspaces is not installed" in capsys.readouterr().out
    spec = json.loads((tmp_path / "dashboard.json").read_text())
    panels = [p for s in spec["sections"] for p in s["panels"]]
    assert {
        "kind": "bar",
        "title": "as trained: by evaluation length",
        "metrics": ["extrapolation/none/bpb@256", "extrapolation/none/bpb@512"],
    } in panels
    assert spec["runset"]["filter"] == {"group": "pe_compare-2026-01-01_00-00-00"}


@pytest.mark.slow  # over 7 s: the slow stage (the default suite stays under about 10 minutes)
def test_cli_help_and_errors(tmp_path, capsys):
    from linrope.analysis.dashboard import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--dry-run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--dry-run"])  # neither a folder nor --group
    assert e.value.code == 2 and "give a sweep folder or --group" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--dry-run"])
    assert str(e.value.code).startswith("linrope:") and "no run configs" in str(e.value.code)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "linrope", "dashboard", "--group", "g"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "linrope: saving a dashboard needs a wandb login (`wandb login`); --dry-run writes the specs without one"
    ]
