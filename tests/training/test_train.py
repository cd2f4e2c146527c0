"""The real Hydra configs compose, every model config trains (fast_dev_run), the LM learns,
and bad configs stop early with one line."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import CONF, ROOT, run_main, target, tiny

MODEL_CONFIGS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
TINY = tiny()


def test_model_configs_exist():
    assert {"linear_rope", "linear", "linear_cosine_rope", "softmax", "softmax_rope"} <= set(MODEL_CONFIGS)


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_every_model_config_trains_fast_dev_run(compose, name):
    cfg = compose(f"model={name}", *TINY, "+trainer.fast_dev_run=2")
    assert cfg.model.name == name
    metric = run_main(cfg)
    # fast_dev_run runs one validation batch: val/bpb exists and is a sane number of bits
    assert metric is not None and 0.0 < metric < 12.0


def test_default_config_is_linear_rope(compose):
    cfg = compose()
    assert cfg.model.name == "linear_rope"
    assert cfg.model.attention.kind == "linear" and cfg.model.attention.placement == "numerator"
    assert cfg.model.position.name == "rope" and cfg.model.max_len == cfg.context == cfg.data.context


def test_the_optimizer_settings_come_only_from_conf_optim(compose):
    """conf/optim/adamw.yaml is the one place the optimizer's settings are written: the module builds AdamW
    and its schedule from ``cfg.optim`` and, given none, refuses in one line instead of using defaults."""
    from types import SimpleNamespace

    from linrope.config.checks import ConfigError
    from linrope.training.builders import build_module
    from linrope.training.lit import LanguageModel

    cfg = compose(
        "size=tiny", "optim.lr=0.00123", "optim.weight_decay=0.05", "optim.warmup_steps=4", "trainer.max_steps=20"
    )
    module = build_module(cfg)
    module.trainer = SimpleNamespace(max_steps=20)  # what configure_optimizers reads of the Trainer
    built = module.configure_optimizers()
    opt, sched = built["optimizer"], built["lr_scheduler"]["scheduler"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert opt.param_groups[0]["betas"] == tuple(cfg.optim.betas)
    assert math.isclose(opt.param_groups[0]["lr"], 0.00123 / 4)  # warm-up step 1 of 4
    for _ in range(3):
        opt.step()
        sched.step()
    assert math.isclose(opt.param_groups[0]["lr"], 0.00123)  # the peak, at the end of warm-up
    bare = LanguageModel(model=module.hparams["model"])
    bare.trainer = SimpleNamespace(max_steps=20)
    with pytest.raises(ConfigError, match=r"^optim: no lr, betas, weight_decay, warmup_steps, min_lr_ratio "):
        bare.configure_optimizers()
    # no Trainer and no optim.schedule_steps: the schedule has no length, said in one line
    unattached = LanguageModel(model=module.hparams["model"], optim=module.optim)
    with pytest.raises(ConfigError, match=r"^optim.schedule_steps: the cosine schedule needs a length"):
        unattached.configure_optimizers()
    given = LanguageModel(model=module.hparams["model"], optim={**module.optim, "schedule_steps": 20})
    assert given.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0](20) == cfg.optim.min_lr_ratio


def test_lm_loss_falls(small_corpus):
    """A few dozen steps on a small corpus: the next-byte loss falls well below its start."""
    from linrope.data.bytes import RandomWindows, load_corpus
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    data = load_corpus(str(small_corpus), context=64)["train"]
    ds = RandomWindows(data, 64, seed=0, length=16 * 40)
    for attention, position in [
        ({"kind": "linear", "impl": "naive"}, {"name": "rope"}),
        ({"kind": "softmax"}, {"name": "rope"}),
    ]:
        model = TransformerLM(
            dict(d_model=64, n_heads=4, n_layers=2, d_ff=128, max_len=64, attention=attention, position=position)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step in range(40):
            batch = [ds[step * 16 + i] for i in range(16)]
            x, y = torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] > math.log(256) - 0.5  # starts near a uniform guess
        assert sum(losses[-5:]) / 5 < 0.7 * losses[0], (attention, losses)


def test_short_training_run_improves_val_bpb_and_train_false_tests_its_checkpoint(compose, small_corpus, tmp_path):
    tiny_csv = tiny("logger=csv")
    cfg = compose(
        "model=linear_rope",
        *tiny_csv,
        f"data.path={small_corpus}",
        "trainer.max_steps=30",
        "trainer.val_check_interval=30",
        "optim.warmup_steps=5",
        "trainer.log_every_n_steps=5",
        "callbacks.throughput.peak_flops=1e9",
    )
    best = run_main(cfg)
    assert best < 6.0  # well below 8 bits of a uniform guess after 30 steps
    ckpts = list(Path(cfg.paths.output_dir, "checkpoints").glob("*.ckpt"))
    assert any(p.name == "last.ckpt" for p in ckpts) and any(p.name.startswith("best") for p in ckpts)
    # the CSV log has the metrics a comparison needs, and the learning rate under one key
    import csv

    rows = list(csv.DictReader(open(Path(cfg.paths.output_dir, "csv", "metrics.csv"))))
    logged = {k for r in rows for k, v in r.items() if v not in ("", None)}
    assert {
        "train/loss",
        "val/loss",
        "val/bpb",
        "test/bpb",
        "train/tokens_per_sec",
        "train/mfu",
        "train/peak_mem_mb",
    } <= logged
    # MFU = tokens/s × the model's training FLOPs per token at the context / the peak given (1 GFLOP/s)
    from linrope.models.flops import flops_per_token

    per_token = flops_per_token(dict(cfg.model), cfg.context)["total"]
    timed = [r for r in rows if r.get("train/mfu")]
    assert timed and all(
        math.isclose(float(r["train/mfu"]), float(r["train/tokens_per_sec"]) * per_token / 1e9, rel_tol=1e-5)
        for r in timed
    )
    assert [k for k in rows[0] if "lr" in k.split("/")[-1]] == ["train/lr"]
    assert all(float(r["train/peak_mem_mb"]) > 10 for r in rows if r.get("train/peak_mem_mb"))
    test_bpb = float(next(r["test/bpb"] for r in rows if r.get("test/bpb")))

    # train=false ckpt_path=<best>: tests that checkpoint (not the random weights of a new model)
    best_ckpt = next(p for p in ckpts if p.name.startswith("best"))
    again = tmp_path / "test_only"
    cfg = compose(
        *tiny_csv, f"data.path={small_corpus}", "train=false", f"ckpt_path='{best_ckpt}'", f"paths.output_dir={again}"
    )
    assert run_main(cfg) is None
    rows = list(csv.DictReader(open(again / "csv" / "metrics.csv")))
    assert float(next(r["test/bpb"] for r in rows if r.get("test/bpb"))) == pytest.approx(test_bpb, rel=1e-5)


def test_whole_split_test_score_is_the_extrapolation_score_at_the_training_length(compose, small_corpus):
    """data.test_windows=null (the default: every test byte once, in non-overlapping windows) and the extrapolation
    table's `windows` row at factor 1 score the same bytes in the same windows with the same weights: one number.
    (The test batches once carried each target's offset third, which the model read as document ids: every byte
    then saw only itself, a context-free score about 1 bpb worse on the headline study's models.)"""
    import csv

    cfg = compose(
        "model=linear_rope",
        *tiny("logger=csv", "data.test_windows=null"),
        f"data.path={small_corpus}",
        "trainer.max_steps=20",
        "trainer.val_check_interval=20",
        "optim.warmup_steps=5",
        "extrapolation.enabled=true",
        "extrapolation.factors=[1]",
        "extrapolation.scalings=[]",
        "extrapolation.protocols=[windows]",
        "extrapolation.window_control=false",
    )
    run_main(cfg)
    out = Path(cfg.paths.output_dir)
    rows = list(csv.DictReader(open(out / "csv" / "metrics.csv")))
    test = {k: float(v) for r in rows for k, v in r.items() if k.startswith("test/") and v not in ("", None)}
    (table,) = [r for r in csv.DictReader(open(out / "extrapolation.csv")) if r["protocol"] == "windows"]
    assert test["test/bytes"] == float(table["scored"]) == float(table["bytes"])  # the same bytes
    assert test["test/bpb"] == pytest.approx(float(table["bpb"]), rel=1e-5)
    assert test["test/bpb"] < 6.0  # a trained model's score, not a uniform guess


class CountingCSVLogger:
    """Test-only wrapper target: records every log_hyperparams call of a real CSV logger."""

    calls: list = []

    def __new__(cls, **kwargs):
        from linrope.run.loggers import CSVLogger

        logger = CSVLogger(**kwargs)
        real = logger.log_hyperparams

        def log_hyperparams(params, *args, **kw):
            CountingCSVLogger.calls.append(dict(params))
            return real(params, *args, **kw)

        logger.log_hyperparams = log_hyperparams
        return logger


def test_hyperparameters_are_logged_once_as_the_config(compose, small_corpus):
    """Once (not again at fit and at test), and the data settings only under data.* (not as top-level keys)."""
    tiny_csv = tiny("logger=csv")
    cfg = compose(
        *tiny_csv,
        f"data.path={small_corpus}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"logger.csv._target_={target(CountingCSVLogger)}",
    )
    CountingCSVLogger.calls = []
    run_main(cfg)
    assert len(CountingCSVLogger.calls) == 1
    (params,) = CountingCSVLogger.calls
    assert set(params) == set(cfg) | {"n_params", "run_tags", "provenance"}
    assert params["data"]["val_windows"] == 4 and "val_windows" not in params and "context" in params


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_model_name_follows_the_chosen_attention_and_position_into_the_logs_and_the_report(tmp_path):
    """attention=... position=... replace the preset's pair: the label (report, plots, wandb) follows
    (tests/models/test_names.py pins it for every preset); train.py names the model in what it logs and in the
    checkpoint, and in the .hydra/config.yaml Hydra saved before the run started (issue 32: it said linear_rope)."""
    import yaml

    from linrope.analysis.runs import base_label, find_runs

    run = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "attention=softmax",
        "position=none",
        *TINY,
        "logger=csv",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "test=false",
        f"hydra.run.dir={run}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert saved["model"]["name"] == "softmax_none" and saved["model"]["attention"]["kind"] == "softmax"
    assert yaml.safe_load((run / "csv" / "hparams.yaml").read_text())["model"]["name"] == "softmax_none"
    assert (
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["model"]["name"]
        == "softmax_none"
    )
    (found,) = find_runs(run)
    assert base_label(found) == "softmax_none"


def test_wandb_mode_follows_wandb_and_a_sweep_has_its_own_group(compose, monkeypatch):
    from linrope.run.loggers import wandb_mode, wandb_settings

    yes, no = (lambda: True), (lambda: False)
    assert wandb_mode(None, {}, no) == "offline" and wandb_mode(None, {}, yes) == "online"
    assert wandb_mode(None, {"WANDB_MODE": "disabled"}, yes) == "disabled"
    assert wandb_mode(None, {"WANDB_MODE": "dryrun"}, yes) == "offline"
    assert wandb_mode("offline", {"WANDB_MODE": "online"}, yes) == "offline"
    with pytest.warns(UserWarning, match="not logged in"):
        assert wandb_mode(None, {"WANDB_MODE": "online"}, no) == "offline"
    from linrope.training.builders import UserError, build_loggers

    with pytest.raises(UserError, match="WANDB_MODE=nope: expected one of online, offline, disabled"):
        wandb_mode(None, {"WANDB_MODE": "nope"}, yes)
    lg = {"save_dir": "/tmp", "group": None}
    a = wandb_settings(lg, "pe_compare", "logs/pe_compare/multiruns/2026-01-01_10-00-00")["group"]
    b = wandb_settings(lg, "pe_compare", "logs/pe_compare/multiruns/2026-01-02_10-00-00")["group"]
    assert a == "pe_compare-2026-01-01_10-00-00" and b != a
    assert wandb_settings(lg, "train", None)["group"] == "train"
    assert wandb_settings({**lg, "group": "mine"}, "train", "x/y")["group"] == "mine"

    # WANDB_MODE reaches wandb.init (the config used to force offline), without the deprecated anonymous setting
    monkeypatch.setenv("WANDB_MODE", "disabled")
    (wandb,) = [lg for lg in build_loggers(compose("logger=default")) if type(lg).__name__ == "WandbLogger"]
    assert wandb._wandb_init["mode"] == "disabled" and "anonymous" not in wandb._wandb_init
    assert os.environ["WANDB_MODE"] == "disabled"


def test_a_resumed_run_goes_on_logging_to_its_wandb_run(tmp_path):
    """With ckpt_path (a resume) the wandb logger gets the id of the last wandb run in the run folder (and resume=
    allow), so that it continues that run: a new run each time counted a resumed job twice in the dashboard."""
    from linrope.run.loggers import earlier_wandb_id, wandb_settings

    lg = {"save_dir": str(tmp_path), "group": None, "mode": "disabled"}
    assert earlier_wandb_id(tmp_path) is None and "id" not in wandb_settings(lg, "train", None, resume=True)
    for name in ("offline-run-20261201_061307-ed18bvjn", "run-20261201_061344-hquyfhhu", "latest-run"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
    got = wandb_settings(lg, "train", None, resume=True)
    assert (got["id"], got["resume"]) == ("hquyfhhu", "allow")  # the last by time, offline or online
    assert "id" not in wandb_settings(lg, "train", None)  # a new run: a new wandb run
    assert wandb_settings({**lg, "id": "mine"}, "train", None, resume=True)["id"] == "mine"  # given: kept


def test_build_loggers_resumes_the_wandb_run_only_when_a_checkpoint_is_resumed(compose, tmp_path, monkeypatch):
    """ckpt_path=auto that finds no checkpoint starts afresh: a new wandb run, not the aborted one's."""
    from linrope.training.builders import build_loggers

    monkeypatch.setenv("WANDB_MODE", "disabled")
    (tmp_path / "wandb" / "offline-run-20261201_061307-oldrun1").mkdir(parents=True)

    def wandb_init(*overrides):
        (lg,) = [
            lg for lg in build_loggers(compose("logger=default", *overrides)) if type(lg).__name__ == "WandbLogger"
        ]
        return lg._wandb_init

    assert wandb_init("ckpt_path=auto").get("id") is None  # no checkpoint: afresh
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}}, tmp_path / "checkpoints" / "last.ckpt")
    assert wandb_init("ckpt_path=auto")["id"] == "oldrun1"  # a resume: the earlier run goes on


@pytest.mark.slow
def test_default_run_prints_every_line_once(tmp_path):
    """A tiny run with the default loggers: no console line twice (Lightning's handler and Hydra's), none of
    Lightning's tips or notices, no deprecation warning raised from linrope's code.  The model summary is
    Lightning's own (its FLOPs column reads 0: a language model declares no example input)."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_SILENT", None)
    cmd = [
        sys.executable,
        "-W",
        "default::DeprecationWarning",
        str(ROOT / "train.py"),
        "size=tiny",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.log_every_n_steps=1",
        "data.max_bytes=200000",
        "data.val_windows=2",
        "data.test_windows=2",
        "data.batch_size=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    messages = [re.sub(r"^(\[[^]]*\]){3} - |^(INFO|WARNING): ", "", line).strip() for line in out.splitlines()]
    messages = [m for m in messages if m and not set(m) <= set("-─━┃│┏┓┗┛┡┩└┘┳╇┴ ")]
    twice = sorted({m for m in messages if messages.count(m) > 1})
    assert not twice, f"printed twice: {twice}\n{out[-3000:]}"
    for noise in ("Tip:", "litlogger", "LeafSpec", "anonymous setting", "limit_val_batches", "ModelSummary"):
        assert noise not in out, f"{noise!r} in\n{out[-3000:]}"
    assert "Seed set to 1234" in out and "Trainer.fit` stopped" in out  # Lightning's lines still come, once
    ours = [
        l for l in out.splitlines() if "DeprecationWarning" in l and (str(ROOT / "linrope") in l or "train.py" in l)
    ]
    assert not ours, ours
    assert "train/lr" in (tmp_path / "run" / "csv" / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model=linear", "position=alibi_nonexistent"], "position=alibi_nonexistent: no such option"),
        (["model=linear", "position=t5"], "attention=linear with position=t5 cannot work"),
        (["trainer.devices=4096"], "trainer.devices=4096 but only"),
        (["data.path=/nonexistent/corpus"], "data.path /nonexistent/corpus: does not exist"),
        (["model.n_heads=8", "model.d_model=40"], "even head dimension"),
        (["model.attention.chunk_size=0"], "model.attention.chunk_size=0: expected an integer >= 1"),
        (["model=softmax_learned", "context=128", "model.max_len=64"], "longer than the learned position table"),
        (["train=false"], "train=false test=true tests a checkpoint: pass ckpt_path="),
        (["train=false", "ckpt_path=auto"], "ckpt_path=auto found none"),
    ],
)
@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_bad_config_fails_early_in_one_line(tmp_path, overrides, message):
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode != 0
    if message is not None:
        lines = [l for l in r.stderr.strip().splitlines() if l.startswith("linrope:")]
        assert len(lines) == 1 and message in lines[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "run").exists()  # stopped before building anything, and no empty run folder left
