"""Every run records what produced it (linrope/run/provenance.py): in its folder, its checkpoints, the wandb config
and the CSV hparams.yaml; a resume prints and records what it changes (linrope/run/resume_diff.py); evaluate and
generate name their checkpoint's provenance."""

import contextlib
import io
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from linrope.base.nested import flatten
from linrope.run import provenance as P
from linrope.run.resume_diff import changes, describe_checkpoint, resume_record
from tests.helpers import CONF, ROOT, run_main, target, tiny

TINY = tiny("logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=4", "extrapolation.enabled=false")
KEYS = {"linrope", "versions", "machine", "precision", "seed", "command", "overrides", "started"}


class KeptWandbLogger:
    """Test-only target for logger.wandb: linrope's WandbLogger, kept to read its config afterwards."""

    made: list = []

    def __new__(cls, **kwargs):
        from linrope.run.loggers import WandbLogger

        lg = WandbLogger(**kwargs)
        KeptWandbLogger.made.append(lg)
        return lg


# ---- collecting --------------------------------------------------------------------------------------------------
def git(folder, *args):
    subprocess.run(
        ["git", *args],
        cwd=folder,
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
        },
    )


def test_git_state_names_the_commit_the_local_changes_and_a_wheel(tmp_path):
    repo = tmp_path / "repo"
    (repo / "linrope").mkdir(parents=True)
    (repo / "linrope" / "a.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    clean = P.git_state(repo / "linrope")
    assert clean == {"commit": head, "dirty": False, "diff_hash": None, "code": clean["code"]}
    assert len(clean["code"]) == 12
    (repo / "linrope" / "a.py").write_text("x = 2\n")
    P.git_state.cache_clear()
    dirty = P.git_state(repo / "linrope")
    assert dirty["commit"] == head and dirty["dirty"] is True and len(dirty["diff_hash"]) == 12
    assert dirty["code"] != clean["code"]  # uncommitted changes to the code are part of it
    (repo / "linrope" / "a.py").write_text("x = 3\n")
    P.git_state.cache_clear()
    assert P.git_state(repo / "linrope")["diff_hash"] != dirty["diff_hash"]  # the hash is of the diff itself
    # the code is what the files hold, whichever commit they sit on: these changes, committed, give the same hash
    git(repo, "commit", "-qam", "two")
    P.git_state.cache_clear()
    assert P.git_state(repo / "linrope")["code"] not in (clean["code"], dirty["code"])  # x = 3
    (repo / "linrope" / "a.py").write_text("x = 2\n")
    P.git_state.cache_clear()
    assert P.git_state(repo / "linrope")["code"] == dirty["code"]  # x = 2 on top of "two", as on top of "one"
    git(repo, "checkout", "-q", head, "--", "linrope")  # x = 1 again, uncommitted: the first commit's code
    P.git_state.cache_clear()
    back = P.git_state(repo / "linrope")
    assert back["dirty"] is True and back["code"] == clean["code"]
    git(repo, "reset", "-q", "--hard", head)
    (repo / "docs").mkdir()
    (repo / "docs" / "results.md").write_text("a result\n")  # a commit of results only: same code
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a result")
    P.git_state.cache_clear()
    later = P.git_state(repo / "linrope")
    assert later["commit"] != head and later["code"] == clean["code"]
    (repo / "docs" / "results.md").write_text("edited\n")  # uncommitted changes outside the code: same code
    P.git_state.cache_clear()
    assert P.git_state(repo / "linrope")["dirty"] is True and P.git_state(repo / "linrope")["code"] == clean["code"]
    wheel = tmp_path / "site-packages" / "linrope"
    wheel.mkdir(parents=True)
    assert P.git_state(wheel) == {"commit": P.NOT_GIT, "dirty": None, "diff_hash": None, "code": None}
    assert P.commit_text({"linrope": {"commit": P.NOT_GIT, "version": "0.1.0"}}) == "not a git checkout (linrope 0.1.0)"


def test_collect_holds_versions_machine_and_the_run_settings():
    p = P.collect(precision="32-true", seed=7, argv=["train.py", "size=tiny"], overrides=["size=tiny"])
    assert KEYS <= set(p)
    assert p["versions"]["torch"] == torch.__version__ and p["versions"]["python"] == sys.version.split()[0]
    assert {"lightning", "hydra-core", "wandb", "einops", "fla"} <= set(p["versions"])
    assert p["machine"]["threads"] == torch.get_num_threads() and p["machine"]["cpu"]
    assert ("gpu" in p["machine"]) and (p["machine"]["gpu"] is None) == (not torch.cuda.is_available())
    assert p["precision"] == "32-true" and p["seed"] == 7 and p["command"] == "python train.py size=tiny"
    assert len(p["linrope"]["commit"]) == 40  # this checkout
    assert p["started"].endswith("+00:00")
    json.dumps(p)  # plain values only


# ---- a run ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_run(compose, small_corpus, tmp_path):
    KeptWandbLogger.made = []
    cfg = compose(
        "model=linear_rope",
        *TINY,
        f"data.path={small_corpus}",
        "logger=default",
        "logger.wandb.mode=disabled",
        f"logger.wandb._target_={target(KeptWandbLogger)}",
    )
    run_main(cfg)
    return Path(cfg.paths.output_dir)


def test_a_tiny_runs_folder_checkpoint_wandb_config_and_csv_metadata_hold_its_provenance(tiny_run):
    recorded = json.loads((tiny_run / "provenance.json").read_text())
    assert KEYS <= set(recorded) and recorded["seed"] == 1234 and recorded["precision"] == "32-true"
    assert recorded["linrope"]["commit"] == P.git_state()["commit"]
    for ckpt in (tiny_run / "checkpoints").glob("*.ckpt"):
        saved = torch.load(ckpt, weights_only=True)
        assert saved[P.PROVENANCE_KEY] == recorded, ckpt.name
        assert saved[P.CONFIG_KEY]["context"] == 64 and saved[P.CONFIG_KEY]["optim"]["lr"] == 0.002
    hparams = yaml.safe_load((tiny_run / "csv" / "hparams.yaml").read_text())
    assert hparams["provenance"] == recorded
    (wandb_logger,) = KeptWandbLogger.made
    assert dict(wandb_logger.experiment.config)["provenance"]["linrope"] == recorded["linrope"]


def write_corpus(path: Path) -> Path:
    from linrope.data.bytes import stdlib_dir

    path.write_bytes(b"\n".join(f.read_bytes() for f in sorted((stdlib_dir() / "logging").glob("*.py"))) * 2)
    return path


def test_a_resume_prints_and_records_each_change_and_the_chain_it_continues(
    tiny_run, compose, small_corpus, tmp_path, capsys
):
    """End to end from a real tiny checkpoint: context, data.path, optim.lr and seed changed at once."""
    last = tiny_run / "checkpoints" / "last.ckpt"
    other = write_corpus(tmp_path / "other.txt")
    new = tmp_path / "resumed"
    capsys.readouterr()
    cfg = compose(
        "model=linear_rope",
        *TINY,
        f"data.path={other}",
        f"paths.output_dir={new}",
        f"ckpt_path='{last}'",
        "trainer.max_steps=6",
        "context=128",
        "optim.lr=0.05",
        "seed=7",
        "test=false",
    )
    run_main(cfg)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("resume: ")]
    order = "the data order no longer reproduces the uninterrupted run"
    assert f"resume: context 64 → 128 (also data.context, model.max_len) — {order}" in lines
    assert f"resume: data.path {small_corpus} → {other} — {order}" in lines
    assert f"resume: seed 1234 → 7 (also data.seed) — {order}" in lines
    assert (
        "resume: optim.lr 0.002 → 0.05 — no effect: the optimizer state restored from the checkpoint keeps 0.002"
    ) in lines
    assert "resume: trainer.max_steps 4 → 6" in lines and len(lines) == 5
    (record,) = json.loads((new / "resume.json").read_text())
    assert record["lines"] == lines and record["step"] == 4
    first = json.loads((tiny_run / "provenance.json").read_text())
    chain = [
        {
            "run": str(tiny_run.resolve()),
            "checkpoint": str(last),
            "step": 4,
            "commit": first["linrope"]["commit"],
            "dirty": first["linrope"]["dirty"],
            "started": first["started"],
        }
    ]
    assert record["continues"] == chain
    assert json.loads((new / "provenance.json").read_text())["resumed_from"] == chain
    # the resumed run's checkpoint carries the chain on
    assert torch.load(new / "checkpoints" / "last.ckpt", weights_only=True)[P.PROVENANCE_KEY]["resumed_from"] == chain


# ---- the comparison itself -----------------------------------------------------------------------------------------
def test_changes_fold_interpolated_keys_and_compare_an_older_checkpoint_by_what_it_holds():
    old = {"context": 64, "model": {"max_len": 64, "d_model": 32}, "data": {"batch_size": 8}, "paths": {"x": 1}}
    new = {"context": 64, "model": {"max_len": 64, "d_model": 32}, "data": {"batch_size": 16}, "paths": {"x": 2}}
    found = changes(flatten(old), flatten(new))
    assert [c["line"] for c in found] == [
        "resume: data.batch_size 8 → 16 — the data order no longer reproduces the uninterrupted run"
    ]
    raw = {"model": {"max_len": "${context}"}}
    found = changes(
        flatten(old),
        flatten({**new, "context": 128, "model": {"max_len": 128, "d_model": 32}, "data": {"batch_size": 8}}),
        new_unresolved=flatten(raw),
    )
    assert [c["key"] for c in found] == ["context"] and found[0]["also"] == ["model.max_len"]
    # a checkpoint without the whole config: only its model, optim and data settings are compared
    ckpt = {"hyper_parameters": {"model": {"d_model": 32}, "optim": {"lr": 0.002}}, "global_step": 3}
    rec = resume_record(
        ckpt, "/x/run/checkpoints/last.ckpt", {"seed": 1, "model": {"d_model": 32}, "optim": {"lr": 0.002}}
    )
    assert rec["changes"] == [] and rec["compared"].startswith("model, optim")
    assert rec["continues"] == [
        {
            "run": "/x/run",
            "checkpoint": "/x/run/checkpoints/last.ckpt",
            "step": 3,
            "commit": None,
            "dirty": None,
            "started": None,
        }
    ]


def test_describe_checkpoint_names_commit_step_and_the_defaults_it_was_not_written_with(tmp_path):
    prov = P.collect(precision="32-true", seed=1)
    ckpt = {
        "global_step": 12,
        P.PROVENANCE_KEY: {**prov, "linrope": {**prov["linrope"], "commit": "0" * 40, "dirty": False}},
        "hyper_parameters": {
            "model": {
                "attention": {"kind": "linear", "feature_map": "elu"},
                "position": {"name": "rope", "base": 10000.0},
            }
        },
    }
    line = describe_checkpoint(ckpt, "a.ckpt", CONF, prov)
    assert line.startswith(f"checkpoint a.ckpt: step 12, commit 0000000000, torch {torch.__version__}")
    assert f", run started {prov['started']} (this code" in line  # no file a.ckpt: no time it was written
    assert f"(this code: {P.commit_text(prov)})" in line
    assert "model.attention.placement is not in the checkpoint: built with today's default numerator" in line
    assert "model.position.scaling is not in the checkpoint: built with today's default None" in line
    assert "model.position.base" not in line  # held by the checkpoint
    # the time the file was written, not the run's start (a checkpoint of step 3000 said the run's first minute)
    saved = tmp_path / "c.ckpt"
    saved.write_bytes(b"")
    os.utime(saved, (1_800_000_000, 1_800_000_000))
    line = describe_checkpoint(ckpt, saved, CONF, prov)
    assert f", run started {prov['started']}, written 2027-01-15T08:00:00+00:00 (this code" in line
    old = describe_checkpoint({"global_step": 3, "hyper_parameters": {}}, "b.ckpt", CONF, prov)
    assert old == "checkpoint b.ckpt: step 3, no provenance recorded (written before linrope recorded it)"


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_evaluate_and_generate_name_their_checkpoints_provenance(tiny_run):
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    commit = P.commit_text(json.loads((tiny_run / "provenance.json").read_text()))
    r = subprocess.run(
        [sys.executable, "-m", "linrope", "generate", f"ckpt={ckpt}", "max_new_tokens=3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert f"checkpoint {ckpt}: step 4, commit {commit}" in r.stderr
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from linrope.evaluation.evaluate import evaluate

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="evaluate",
            overrides=[
                f"ckpt={ckpt}",
                "lengths=[64]",
                "scalings=[]",
                "scored_bytes=4096",
                f"out={tiny_run / 'evaluate'}",
            ],
        )
    GlobalHydra.instance().clear()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        evaluate(cfg)
    assert f"checkpoint {ckpt}: step 4, commit {commit}" in out.getvalue()


def test_a_benchmarks_header_names_the_commit_torch_cpu_and_threads():
    line = P.machine_line()
    assert line.startswith("commit ") and f"torch {torch.__version__}, {P.cpu_model()}, " in line
    assert line.endswith(f", {torch.get_num_threads()} threads")


def test_a_cpu_named_without_a_model_number_gets_its_family_and_model(tmp_path):
    """A virtual machine's "AMD EPYC" says neither Zen 4 (family 25) nor Zen 5 (26), whose AVX-512 products run at
    different rates: the benchmarks' header and a run's provenance add the numbers; a full name stays as it is."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n\nprocessor\t: 1\n")
    assert P.cpu_model(str(info)) == "AMD EPYC (family 25, model 17)"
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\ncpu family\t: 6\nmodel\t\t: 143\n")
    assert P.cpu_model(str(info)) == "Intel(R) Xeon(R) Platinum 8480C"
    assert P.cpu_model(str(tmp_path / "none")) == (platform.processor() or platform.machine() or "unknown")


def test_an_unreadable_resume_record_is_kept_beside_not_written_over(tmp_path, capsys):
    """resume.json holds every earlier resume: one that cannot be read (cut short) was replaced by the new entry
    alone; it is now renamed beside (said in one line) and the new record starts afresh."""
    from linrope.run.resume_diff import announce

    (tmp_path / "resume.json").write_text('[{"checkpoint": "a.ckpt", "lines": [')
    announce({"lines": ["resuming"], "checkpoint": "b.ckpt"}, tmp_path)
    assert (tmp_path / "resume.unreadable-0.json").read_text() == '[{"checkpoint": "a.ckpt", "lines": ['
    assert [r["checkpoint"] for r in json.loads((tmp_path / "resume.json").read_text())] == ["b.ckpt"]
    out = capsys.readouterr().out
    assert (
        f"linrope: {tmp_path / 'resume.json'} could not be read (JSONDecodeError); kept as resume.unreadable-0.json"
        in out
    )
    announce({"lines": [], "checkpoint": "c.ckpt"}, tmp_path)  # readable now: appended to
    assert [r["checkpoint"] for r in json.loads((tmp_path / "resume.json").read_text())] == ["b.ckpt", "c.ckpt"]
