"""Reliability, fast: atomic checkpoints (a crash mid-write keeps the previous one), weights-only
loading with plain hyperparameters, one-line errors for checkpoints that do not fit and for NaN
losses (the last good checkpoint is kept), bf16-mixed on CPU, validation never lost on resume, the
training loader's sharding and resume arithmetic, and config / command-line checks before anything
is built.  The multi-process and kill-and-resume tests are in test_slow_reliability.py."""

import math
import signal
import subprocess
import sys
import types
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.helpers import ROOT, run_main, target, tiny

TINY = tiny("test=false")


def exit_message(excinfo) -> str:
    msg = str(excinfo.value.code)
    assert msg.startswith("linrope: ") and "\n" not in msg and "Traceback" not in msg, msg
    return msg


@pytest.fixture
def trained(compose, tmp_path):
    """A tiny run of 4 steps; its last.ckpt."""
    cfg = compose(
        "model=linear_rope",
        *TINY,
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "callbacks.last_checkpoint.every_n_train_steps=2",
    )
    run_main(cfg)
    return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


# ---- atomic writes ----------------------------------------------------------------------------------------
def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from linrope.run import checkpoint as C

    io_ = C.AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io_.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    real_save = torch.save

    def half_then_crash(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04" + b"\0" * 100)  # the start of a zip, then the process "dies"
        raise OSError("disk full")

    monkeypatch.setattr(C.torch, "save", half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        io_.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    monkeypatch.setattr(C.torch, "save", real_save)
    loaded = io_.load_checkpoint(path)
    assert loaded["global_step"] == 1 and torch.equal(loaded["state_dict"]["w"], torch.ones(3))
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no temporary file left


@pytest.mark.slow  # over 7 s: the slow stage (the default suite stays under about 10 minutes)
def test_sigkill_while_writing_keeps_the_previous_checkpoint(tmp_path):
    """A real SIGKILL half-way through the bytes of a checkpoint."""
    from linrope.run.checkpoint import AtomicCheckpointIO

    path = tmp_path / "last.ckpt"
    script = f"""
import io, os, signal, torch
from linrope.run.checkpoint import AtomicCheckpointIO
ckpt_io, path = AtomicCheckpointIO(), {str(path)!r}
ckpt_io.save_checkpoint({{"state_dict": {{"w": torch.ones(10000)}}, "global_step": 1}}, path)
real = torch.save
def save(obj, f, *a, **k):
    buf = io.BytesIO(); real(obj, buf); f.write(buf.getvalue()[:20000]); f.flush(); os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
ckpt_io.save_checkpoint({{"state_dict": {{"w": torch.zeros(10000)}}, "global_step": 2}}, path)
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert len(list(tmp_path.glob(".last.ckpt.*.partial"))) == 1  # the killed writer's own temporary file
    c = torch.load(path, weights_only=True)
    assert c["global_step"] == 1 and torch.equal(c["state_dict"]["w"], torch.ones(10000))
    # the next save removes the temporary file of the writer that no longer runs
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 3}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_last_ckpt_replaces_a_dangling_link_with_a_whole_file(tmp_path):
    from linrope.run.checkpoint import AtomicCheckpointIO

    link = tmp_path / "last.ckpt"
    link.symlink_to(tmp_path / "gone.ckpt")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 3}, link)
    assert not link.is_symlink() and torch.load(link, weights_only=True)["global_step"] == 3


def test_non_finite_parameters_are_never_written(tmp_path):
    from linrope.run.checkpoint import AtomicCheckpointIO, NonFiniteCheckpoint

    io_, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io_.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 5}, path)
    with pytest.raises(NonFiniteCheckpoint, match=r"not finite at step 6 \(w\)"):
        io_.save_checkpoint({"state_dict": {"w": torch.tensor([1.0, math.nan])}, "global_step": 6}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 5


# ---- weights-only loading, hyperparameters, mismatches ------------------------------------------------------
def test_checkpoints_load_weights_only_with_plain_hyperparameters(trained):
    from linrope.training.lit import LanguageModel

    c = torch.load(trained, map_location="cpu", weights_only=True)
    assert c["global_step"] == 4
    hp = c["hyper_parameters"]
    assert type(hp) is dict and type(hp["model"]) is dict and type(hp["optim"]) is dict

    def plain(x):
        if isinstance(x, dict):
            return type(x) is dict and all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (str, int, float, bool))

    assert plain(hp)
    a = LanguageModel.load_from_checkpoint(str(trained), map_location="cpu", weights_only=True).eval()
    b = LanguageModel.from_checkpoint(trained)
    x = torch.randint(0, 256, (2, 16))
    assert not b.training and torch.equal(a(x), b(x))


def test_load_model_names_the_keys_that_do_not_fit(trained):
    from linrope.base.errors import CheckpointMismatch
    from linrope.training.lit import LanguageModel

    with pytest.raises(CheckpointMismatch) as e:
        LanguageModel.from_checkpoint(trained, {"d_model": 32, "d_ff": 64})
    msg = str(e.value)
    assert "\n" not in msg and "of another shape" in msg and "(64,) in the checkpoint, (32,) in the model" in msg
    assert "model.d_model: 64 in the checkpoint, 32 now" in msg
    with pytest.raises(
        CheckpointMismatch, match=r"missing key.*table.*position.name: rope in the checkpoint, learned now"
    ):
        LanguageModel.from_checkpoint(trained, {"position": {"name": "learned", "init_std": 0.02}})
    # what does not change parameters is fine: RoPE scaling for evaluation
    m = LanguageModel.from_checkpoint(trained, {"position": {"scaling": "pi", "factor": 2.0}})
    assert m.hparams["model"]["position"]["scaling"] == "pi"


def test_resuming_into_another_model_config_fails_in_one_line(compose, trained):
    cfg = compose("model=linear_rope", *TINY, "trainer.max_steps=6", f"ckpt_path={trained}", "model.d_model=32")
    with pytest.raises(SystemExit) as e:
        run_main(cfg)
    msg = exit_message(e)
    assert "does not fit the model config" in msg and "model.d_model: 64 in the checkpoint, 32 now" in msg


def test_a_broken_checkpoint_is_one_line(tmp_path, trained):
    from linrope.base.errors import CheckpointError
    from linrope.training.lit import LanguageModel

    half = tmp_path / "half.ckpt"
    half.write_bytes(trained.read_bytes()[: trained.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        LanguageModel.from_checkpoint(half)


# ---- NaN, bf16 --------------------------------------------------------------------------------------------
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(compose, monkeypatch):
    from linrope.training.lit import LanguageModel

    real_loss = LanguageModel.loss

    def loss(self, batch):
        value = real_loss(self, batch)
        return value * math.nan if self.training and self.global_step == 7 else value

    monkeypatch.setattr(LanguageModel, "loss", loss)
    cfg = compose(
        "model=linear_rope",
        *TINY,
        "trainer.max_steps=12",
        "trainer.val_check_interval=100",
        "callbacks.last_checkpoint.every_n_train_steps=5",
    )
    with pytest.raises(SystemExit) as e:
        run_main(cfg)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert exit_message(e) == (
        f"linrope: loss is nan at step 7: training stopped; the last good checkpoint is {last} (step 5)"
    )
    c = torch.load(last, weights_only=True)
    assert c["global_step"] == 5 and all(torch.isfinite(v).all() for v in c["state_dict"].values())


def test_bf16_mixed_trains_on_cpu(compose):
    cfg = compose(
        "model=linear_rope",
        *TINY,
        "trainer.precision=bf16-mixed",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    )
    metric = run_main(cfg)
    assert metric is not None and math.isfinite(metric) and metric < 9
    c = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in c["state_dict"].values() if v.is_floating_point())


# ---- validation is not lost on resume --------------------------------------------------------------------
class CrashInValidation(L.Callback):
    """Test-only: the process 'dies' while validating after step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_validation_start(self, trainer, pl_module):
        if trainer.global_step == self.step and not trainer.sanity_checking:
            raise RuntimeError("crash during validation")


def test_a_crash_during_validation_resumes_before_that_validation(compose):
    """last.ckpt of a step that validation follows is written after validation: resuming from a
    checkpoint written before it, Lightning would skip that validation."""
    common = [
        "model=linear_rope",
        *TINY,
        "logger=csv",
        "trainer.max_steps=12",
        "trainer.val_check_interval=10",
        "callbacks.last_checkpoint.every_n_train_steps=5",
        "trainer.log_every_n_steps=1",
    ]
    cfg = compose(*common, f"+callbacks.crash._target_={target(CrashInValidation)}", "+callbacks.crash.step=10")
    with pytest.raises(RuntimeError, match="crash during validation"):
        run_main(cfg)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5
    cfg = compose(*common, "ckpt_path=auto")  # last.ckpt exists: resume from it
    run_main(cfg)
    import csv

    rows = list(csv.DictReader(open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [9]  # the validation after step 10 ran
    assert torch.load(last, weights_only=True)["global_step"] == 12


# ---- the training loader ----------------------------------------------------------------------------------
def fake_trainer(world_size=1, rank=0, global_step=0, max_steps=10):
    return types.SimpleNamespace(world_size=world_size, global_rank=rank, global_step=global_step, max_steps=max_steps)


def test_train_loader_deals_sample_i_to_rank_i_mod_world_size():
    from linrope.data.resume import train_loader, train_span

    data = list(range(1000))
    one = train_loader(data, fake_trainer(), batch_size=8)
    ranks = [train_loader(data, fake_trainer(2, r), batch_size=4) for r in range(2)]
    for b1, b0, br in zip(one, *ranks):
        assert sorted(b1.tolist()) == sorted(b0.tolist() + br.tolist())
        assert all(i % 2 == 0 for i in b0.tolist()) and all(i % 2 == 1 for i in br.tolist())
    # resumed at step 3 of 10 with 8 samples per step: from sample 24, and as the whole run
    assert train_span(fake_trainer(global_step=3), 8) == (24, 80)


# ---- config checks before anything is built --------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.precision=16-mixed"], "does not run on CPU: use trainer.precision=bf16-mixed"),
        (["trainer.precision=fp8"], "trainer.precision=fp8: expected one of"),
        (["trainer.strategy=nope"], "trainer.strategy=nope: unknown; e.g. auto, ddp, ddp_spawn"),
        (["trainer.accelerator=abacus"], "trainer.accelerator=abacus: expected one of"),
        (["trainer=ddp", "trainer.devices=4096"], "trainer.devices=4096 but only"),
        (["ckpt_path=/nonexistent/x.ckpt"], "ckpt_path=/nonexistent/x.ckpt: does not exist"),
        (["ckpt_path=last"], "ckpt_path=last: no "),
        (
            ["callbacks.last_checkpoint.every_n_train_steps=0"],
            "every_n_train_steps=0: expected an integer >= 1 or null",
        ),
    ],
)
def test_config_errors_are_one_line_each(compose, overrides, message):
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose(*overrides))
    assert "\n" not in str(e.value) and message in str(e.value), str(e.value)


def test_checkpoint_and_corpus_checks(compose, tmp_path):
    from linrope.config.checks import ConfigError, checkpoint_path, validate

    assert checkpoint_path(compose("ckpt_path=auto")) is None  # no last.ckpt yet: start afresh
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 half a zip")
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        validate(compose("ckpt_path=auto"))
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 500)
    with pytest.raises(ConfigError, match=r"short.txt: too short — 500 bytes split into .*needs 257"):
        validate(compose(f"data.path={short}"))


def test_ddp_in_a_sweep_is_refused(compose, monkeypatch):
    from linrope.config import checks as C

    monkeypatch.setattr(C, "sweep_dir", lambda: "multirun/sweep")
    with pytest.raises(C.ConfigError, match="use trainer=ddp_spawn in sweeps"):
        C.validate(compose("trainer=ddp"))
    C.validate(compose("trainer=ddp_spawn"))
    # Lightning re-runs the script for these too (its _SubprocessScriptLauncher): the whole sweep ran twice
    cpus = ["trainer.accelerator=cpu", "trainer.devices=2"]
    for strategy in ("auto", "ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false"):
        with pytest.raises(C.ConfigError, match=f"trainer.strategy={strategy} in a sweep"):
            C.validate(compose(*cpus, f"trainer.strategy={strategy}"))
    C.validate(compose("trainer.accelerator=cpu", "trainer.devices=1"))  # auto on one device: no other process
    C.validate(compose(*cpus, "trainer.strategy=ddp_fork"))
    assert C.relaunches("ddp", -1, "gpu", 4) and C.relaunches("auto", -1, "gpu", 4)  # -1: every device
    assert not C.relaunches("auto", None, "gpu", None)  # a dry run that cannot count the GPUs: the job checks
    monkeypatch.setattr(C, "sweep_dir", lambda: None)  # the dry run (linrope sweeps) says it is a sweep's job
    with pytest.raises(C.ConfigError, match="use trainer=ddp_spawn in sweeps"):
        C.validate(compose("trainer=ddp"), hardware=False, sweep=True)
    C.validate(compose("trainer=ddp"), hardware=False)  # a single run: ddp is right
    monkeypatch.setenv("SLURM_NTASKS", "2")  # srun starts the processes: ddp is right there
    C.validate(compose("trainer=ddp"))


def test_unknown_group_options_on_the_command_line():
    from linrope.config.command_line import command_line_errors

    assert (
        command_line_errors(
            [
                "model=linear_rope",
                "data=bytes",
                "trainer=ddp",
                "seed=3",
                "model.d_model=64",
                "experiment=null",
                "-m",
                "model=linear,softmax",
                "hydra/launcher=basic",
                "+model=glob(*)",
                "-c",
                "job",
            ]
        )
        == []
    )
    errors = command_line_errors(["model=nope", "trainer=gpu,tpu", "+data=missing", "position@x=rope"])
    assert [e.split(":")[0] for e in errors] == ["model=nope", "trainer=tpu", "data=missing"]
    assert "choose from" in errors[0] and "linear_rope" in errors[0] and "softmax_rope" in errors[0]


def test_unknown_model_is_one_line_at_the_cli(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=nope", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = [l for l in r.stderr.strip().splitlines()]
    assert len(lines) == 1 and lines[0].startswith("linrope: model=nope: no such option"), r.stderr
    assert "linear_rope" in lines[0]


# ---- issue 12: every bad value is one line, before any data is read ---------------------------------------
@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.max_steps=abc"], "trainer.max_steps=abc: expected an integer >= -1"),
        (["optim.lr=abc"], "optim.lr=abc: expected a number > 0"),
        (["optim.lr=-1"], "optim.lr=-1: expected a number > 0"),
        (["model.d_model=-64"], "model.d_model=-64: expected an integer >= 1"),
        (["model.n_layers=-1"], "model.n_layers=-1: expected an integer >= 1"),
        (["model.n_layers=0"], "model.n_layers=0: expected an integer >= 1"),
        (["data.batch_size=0"], "data.batch_size=0: expected an integer >= 1"),
        (["context=0"], "context=0: expected an integer >= 1"),
        (["context=-8"], "context=-8: expected an integer >= 1"),
        (
            ["model.attention.impl=chunky"],
            "model.attention.impl=chunky: expected one of auto, chunk, fla, naive, recurrent",
        ),
        (["model.attention.chunk_size=abc"], "model.attention.chunk_size=abc: expected an integer >= 1"),
        (["model.attention.feature_map=relu"], "model.attention.feature_map=relu: expected one of elu, cosine"),
        (["model.dropout=1.5"], "model.dropout=1.5: expected a number >= 0 and < 1"),
        (
            ["model=softmax_learned", "size=tiny", "+data.eval_context=128"],
            "data.eval_context=128 is longer than the learned position table (model.max_len=64)",
        ),
        (
            ["model=softmax_multiplicative", "model.position.table=learned", "model.max_len=32"],
            "data.context=256 is longer than the multiplicative position table (model.max_len=32)",
        ),
        (
            ["model=softmax_multiplicative", "model.position.table=lookup"],
            "model.position.table=lookup: expected one of sinusoidal, learned",
        ),
        # checked before training, not after it when the table is made
        (
            ["extrapolation.enabled=true", "extrapolation.scored_bytes=0"],
            "extrapolation.scored_bytes=0: expected an integer >= 1",
        ),
        (["extrapolation.split=train"], "extrapolation.split=train: expected one of val, test"),
        (["extrapolation.factors=[1,-2]"], "extrapolation.factors=[1, -2]: expected a list of numbers > 0"),
        # Lightning's loop divided by it after the corpus was read; a fraction of an epoch above 1 likewise
        (["trainer.val_check_interval=0"], "trainer.val_check_interval=0: expected an integer >= 1 or a number > 0"),
        (["trainer.val_check_interval=1.5"], "trainer.val_check_interval=1.5: expected an integer >= 1 or a"),
        # the synthetic tasks: a value changed silently (num_queries=0 became 8), a numpy traceback (value_vocab=0),
        # Hydra's four lines (a task's own check, raised while the data module was made)
        (["data=mqar", "data.num_queries=0"], "data.num_queries=0: expected an integer >= 1 or null"),
        (["data=mqar", "data.value_vocab=0"], "data.value_vocab=0: expected an integer >= 1"),
        (["data=listops", "data.leaf_prob=1.5"], "data.leaf_prob=1.5: expected a number >= 0 and <= 1"),
        (["data=mqar", "context=16"], "mqar: context 16 is too short for 8 pairs and 8 queries (needs >= 31)"),
        (["data=mqar", "data.num_queries=20"], "mqar: need 1 <= num_queries (20) <= num_kv_pairs (8)"),
        (["data=offset_copy", "data.test_factor=1", "context=16"], "offset_copy: context 16 must exceed the offset"),
        # each fraction alone is fine: the train split would be empty (said as "too short" after reading)
        (
            ["data.val_fraction=0.6", "data.test_fraction=0.5"],
            "data.val_fraction + data.test_fraction = 1.1: must be below 1 (the train split is the rest)",
        ),
    ],
)
def test_bad_values_are_one_line_each(compose, overrides, message):
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose(*overrides))
    assert str(e.value) == message or (message in str(e.value) and "\n" not in str(e.value)), str(e.value)


def test_a_bad_value_stops_the_run_before_the_corpus_is_read(compose, monkeypatch):
    import linrope.data.modules as M

    def no_reading(*args, **kwargs):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(M, "load_corpus", no_reading)
    with pytest.raises(SystemExit) as e:
        run_main(compose(*TINY, "model.n_layers=-1"))
    assert exit_message(e) == "linrope: model.n_layers=-1: expected an integer >= 1"


def test_an_interpolated_value_is_reported_once_where_it_is_set(compose):
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose("context=abc"))  # data.context and model.max_len are ${context}
    assert str(e.value) == "context=abc: expected an integer >= 1"


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_bad_value_is_one_line_at_the_cli(tmp_path):
    run = tmp_path / "runs" / "refused"
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model.n_layers=-1", f"hydra.run.dir={run}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines == ["linrope: model.n_layers=-1: expected an integer >= 1"], r.stderr
    assert not (run / ".linrope.lock").exists()  # refused before the run folder was claimed


# ---- ckpt_path that is no checkpoint, or another model's ---------------------------------------------------
def test_ckpt_path_that_is_not_a_lightning_checkpoint(compose, tmp_path):
    import zipfile

    from linrope.config.checks import ConfigError, validate

    other_zip = tmp_path / "notes.zip"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    tensor = tmp_path / "tensor.ckpt"
    torch.save(torch.ones(3), tensor)
    for path, message in [
        (other_zip, "is not a torch checkpoint that loads with weights_only=True"),
        (tensor, "is not a Lightning checkpoint (it holds Tensor, not a dict with a state_dict)"),
    ]:
        with pytest.raises(ConfigError) as e:
            validate(compose(f"ckpt_path={path}"))
        assert str(e.value).startswith(f"ckpt_path={path}: {message}") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "overrides,difference",
    [
        (["model=softmax_rope"], "model.attention.kind: linear in the checkpoint, softmax now"),
        (["model.attention.feature_map=cosine"], "model.attention.feature_map: elu in the checkpoint, cosine now"),
        (["model.attention.placement=both"], "model.attention.placement: numerator in the checkpoint, both now"),
        (["model.position.base=500"], "model.position.base: 10000.0 in the checkpoint, 500 now"),
    ],
)
def test_resuming_another_model_is_refused_naming_the_difference(compose, trained, overrides, difference):
    """Softmax and linear attention, the feature maps and the placements share every parameter name and
    shape: only the identity stored in the checkpoint tells them apart."""
    cfg = compose("model=linear_rope", *TINY, "trainer.max_steps=6", f"ckpt_path={trained}", *overrides)
    with pytest.raises(SystemExit) as e:
        run_main(cfg)
    assert exit_message(e) == f"linrope: ckpt_path={trained}: is a checkpoint of another model: {difference}"
    assert torch.load(trained, weights_only=True)["global_step"] == 4


def test_loading_another_model_is_refused_in_every_path(trained):
    from linrope.base.errors import CheckpointMismatch
    from linrope.models.spec import IDENTITY_KEY
    from linrope.training.lit import LanguageModel

    c = torch.load(trained, map_location="cpu", weights_only=True)
    assert c[IDENTITY_KEY] == {
        "attention.kind": "linear",
        "attention.feature_map": "elu",
        "attention.placement": "numerator",
        "position.base": 10000.0,
        "position.name": "rope",
    }
    with pytest.raises(CheckpointMismatch, match="feature_map: elu in the checkpoint, cosine now"):
        LanguageModel.from_checkpoint(trained, {"attention": {"feature_map": "cosine"}})
    cfg = {**c["hyper_parameters"]["model"], "attention": {"kind": "softmax"}}
    with pytest.raises(CheckpointMismatch, match="attention.kind: linear in the checkpoint, softmax now"):
        LanguageModel(model=cfg).on_load_checkpoint(c)
    # a checkpoint written before the identity was stored: the identity of its saved model config
    del c[IDENTITY_KEY]
    with pytest.raises(CheckpointMismatch, match="attention.kind: linear in the checkpoint, softmax now"):
        LanguageModel(model=cfg).on_load_checkpoint(c)
    assert (
        LanguageModel.from_checkpoint(trained, {"position": {"scaling": "ntk", "factor": 2.0}}) is not None
    )  # evaluation options


# ---- process groups ---------------------------------------------------------------------------------------
@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_the_process_group_is_destroyed_before_the_interpreter_exits(tmp_path):
    """A gloo group left alive at exit can abort a finished rank (SIGABRT); the module's setup registers its
    destruction for the process's exit, once, where the group exists and nowhere else."""
    script = f"""
import atexit, torch.distributed as dist
from linrope.training.lit import LanguageModel
module = LanguageModel(model=dict(vocab_size=16, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8))
module.setup("fit")  # no process group yet: nothing to destroy, nothing registered
dist.init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
atexit.register(lambda: print("at exit, still initialized:", dist.is_initialized()))  # runs after ours
module.setup("fit"); module.setup("test")
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["at exit, still initialized: False"]


# ---- run folders: one run each, never overwritten ---------------------------------------------------------
def test_rerunning_into_a_run_folder_without_ckpt_path_is_refused(compose, trained):
    before = trained.read_bytes()
    csv_file = Path(compose().paths.output_dir) / "checkpoints"
    with pytest.raises(SystemExit) as e:
        run_main(compose("model=linear_rope", *TINY, "trainer.max_steps=2"))
    assert exit_message(e).startswith(
        f"linrope: run folder {trained.parent.parent} already holds a run (checkpoints/best"
    )
    assert exit_message(e).endswith(
        "checkpoints/last.ckpt); resume it with ckpt_path=last, or choose a new hydra.run.dir — it is not overwritten"
    )
    assert trained.read_bytes() == before and csv_file.is_dir()


def test_ckpt_path_auto_never_trains_afresh_over_a_runs_checkpoints(compose, trained):
    """ckpt_path=auto starts afresh where there is nothing to resume; a folder whose run kept checkpoints but not
    last.ckpt (deleted, or callbacks.last_checkpoint=null) would be trained again over them (its provenance and
    parameters replaced): refused in one line, every file kept.  With last.ckpt there, auto resumes (tested above)."""
    folder = trained.parent.parent
    trained.unlink()
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".linrope.lock"}
    with pytest.raises(SystemExit) as e:
        run_main(compose("model=linear_rope", *TINY, "trainer.max_steps=4", "ckpt_path=auto"))
    assert exit_message(e).startswith(f"linrope: run folder {folder} holds a run's checkpoints (checkpoints/best")
    assert exit_message(e).endswith(
        "but not last.ckpt, so ckpt_path=auto would train afresh over them; resume from one with "
        "ckpt_path=<its file>, or choose a new hydra.run.dir — it is not overwritten"
    )
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".linrope.lock"}
    assert after == before


def saved_config(folder: Path, text: str) -> Path:
    """A folder as Hydra leaves it: ``.hydra/config.yaml`` holding ``text``."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(text)
    return folder


def test_the_saved_config_of_an_earlier_run_is_never_replaced(tmp_path):
    """Hydra writes .hydra/ into the run folder before train.py's checks run: the callback that runs first
    refuses a folder holding a run (without ckpt_path) and, on resuming, copies the earlier .hydra/ aside."""
    from omegaconf import OmegaConf

    from linrope.run.folder import KeepEarlierRun

    run = saved_config(tmp_path / "run", "seed: 1\n")
    hook = KeepEarlierRun()
    config = OmegaConf.create({"hydra": {"run": {"dir": str(run)}}, "ckpt_path": None})
    hook.on_run_start(config=config)  # a folder with only Hydra's files (a refused run): nothing to keep
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK")
    with pytest.raises(SystemExit) as e:
        hook.on_run_start(config=config)
    assert exit_message(e) == (
        f"linrope: run folder {run} already holds a run (checkpoints/last.ckpt); resume it "
        f"with ckpt_path=last, or choose a new hydra.run.dir — it is not overwritten"
    )
    config.ckpt_path = "last"
    hook.on_run_start(config=config)
    hook.on_run_start(config=config)
    assert (run / ".hydra.before-resume-0" / "config.yaml").read_text() == "seed: 1\n"
    assert (run / ".hydra.before-resume-1" / "config.yaml").read_text() == "seed: 1\n"


def test_copies_kept_aside_never_replace_one_another_after_one_is_deleted(tmp_path):
    """The copies kept on a resume were numbered by their count: with copy 0 deleted, the next resume named copy 1
    again (its metrics renamed over it, the .hydra copy failing with a traceback).  Numbered one past the largest,
    every earlier copy stays and their order is their history's."""
    from omegaconf import OmegaConf

    from linrope.run.folder import KeepEarlierRun
    from linrope.run.loggers import keep_csv_history

    run = saved_config(tmp_path / "run", "seed: 1\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK")
    (run / ".hydra.before-resume-1").mkdir()
    (run / ".hydra.before-resume-1" / "config.yaml").write_text("seed: 0\n")
    KeepEarlierRun().on_run_start(config=OmegaConf.create({"hydra": {"run": {"dir": str(run)}}, "ckpt_path": "last"}))
    assert (run / ".hydra.before-resume-1" / "config.yaml").read_text() == "seed: 0\n"
    assert (run / ".hydra.before-resume-2" / "config.yaml").read_text() == "seed: 1\n"
    (run / "metrics.before-resume-1.csv").write_text("step\n1\n")
    (run / "metrics.csv").write_text("step\n2\n")
    keep_csv_history(run)
    assert (run / "metrics.before-resume-1.csv").read_text() == "step\n1\n"
    assert (run / "metrics.before-resume-2.csv").read_text() == "step\n2\n" and not (run / "metrics.csv").exists()


def test_a_sweep_relaunched_into_its_folder_keeps_every_earlier_job(tmp_path):
    """hydra.sweep.dir given twice: the second sweep is refused before its first job, so no job's .hydra/ (nor
    multirun.yaml) is replaced; resuming the whole sweep keeps them beside the new ones."""
    from omegaconf import OmegaConf

    from linrope.run.folder import KeepEarlierRun

    sweep = tmp_path / "sweep"
    for job in ("seed0", "seed1", "seed2"):
        saved_config(sweep / job, f"seed: {job[4:]}\n")
    (sweep / "multirun.yaml").write_text("first sweep\n")
    hook = KeepEarlierRun()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "ckpt_path": None})
    hook.on_multirun_start(config=config)  # only Hydra's files (jobs refused or never started): nothing to keep
    for job in ("seed0", "seed2"):
        (sweep / job / "csv").mkdir()
        (sweep / job / "csv" / "metrics.csv").write_text("step,val/bpb\n")
    with pytest.raises(SystemExit) as e:
        hook.on_multirun_start(config=config)
    assert exit_message(e) == (
        f"linrope: sweep folder {sweep} already holds 2 earlier runs (seed0, seed2); resume them with "
        f"ckpt_path=auto, or choose a new hydra.sweep.dir — they are not overwritten"
    )
    config.ckpt_path = "auto"
    hook.on_multirun_start(config=config)
    assert (sweep / "seed0" / ".hydra.before-resume-0" / "config.yaml").read_text() == "seed: 0\n"
    assert (sweep / "seed2" / ".hydra.before-resume-0" / "config.yaml").read_text() == "seed: 2\n"
    assert not (sweep / "seed1" / ".hydra.before-resume-0").exists()  # job seed1 never ran: nothing of it to keep
    assert (sweep / "multirun.before-resume-0.yaml").read_text() == "first sweep\n"


@pytest.mark.slow  # two tiny runs in subprocesses
def test_a_sweep_of_another_seed_does_not_resume_the_earlier_seeds_runs(tmp_path):
    """Job folders are named by what differs between a sweep's jobs, so a sweep of seed 2 into the folder of a sweep
    of seed 1 names the same folders; resumed with ckpt_path=auto, as the refusal says for a sweep to resume, each job
    went on from the other seed's run (its report then listed seed 2 with seed 1's values). Refused in one line."""
    sweep = tmp_path / "sweep"
    common = [sys.executable, str(ROOT / "train.py"), "-m", "model=linear,linear_rope", "size=tiny",
              "trainer.max_steps=2", "trainer.val_check_interval=2", "test=false", "logger=csv",
              "extrapolation.enabled=false", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    run = lambda *more: subprocess.run([*common, *more], capture_output=True, text=True, cwd=tmp_path, timeout=300)  # noqa: E731
    first = run("seed=1")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run("seed=2", "ckpt_path=auto")
    assert again.returncode == 1
    lines = [ln for ln in again.stderr.splitlines() if ln.startswith("linrope:")]
    assert len(lines) == 1 and "is the run of seed 1, and this job of the sweep is seed 2" in lines[0], again.stderr
    assert "seed: 1" in (sweep / "linear" / ".hydra" / "config.yaml").read_text()  # the earlier run as it was
    resumed = run("seed=1", "ckpt_path=auto", "trainer.max_steps=4")  # its own seed: resumed
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # a checkpoint outside the job's folder is no resume of the job: testing it (or fine-tuning from it) at other
    # seeds is a sweep like any other
    ckpt = sweep / "linear" / "checkpoints" / "last.ckpt"
    other = [sys.executable, str(ROOT / "train.py"), "-m", "seed=5,6", "train=false", f"ckpt_path={ckpt}",
             "model=linear", "size=tiny", "logger=csv", "extrapolation.enabled=false",
             f"hydra.sweep.dir={tmp_path / 'tests'}"]  # fmt: skip
    tested = subprocess.run(other, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert tested.returncode == 0, tested.stderr[-2000:]


def test_train_py_refuses_a_sweep_into_a_folder_of_earlier_runs(tmp_path):
    """The same through Hydra: ``train.py -m hydra.sweep.dir=<earlier sweep>`` stops in one line and leaves the
    earlier job's saved config and the sweep's multirun.yaml as they were."""
    sweep = tmp_path / "sweep"
    saved_config(sweep / "linear_rope", "seed: 7\n")  # the folder the sweep below names its first job
    (sweep / "linear_rope" / "checkpoints").mkdir()
    (sweep / "linear_rope" / "checkpoints" / "last.ckpt").write_bytes(b"PK")
    (sweep / "multirun.yaml").write_text("first sweep\n")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "model=linear_rope,linear",
            "size=tiny",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode != 0
    assert (
        f"linrope: sweep folder {sweep} already holds 1 earlier run (linear_rope); resume it with ckpt_path=auto"
        in r.stderr + r.stdout
    )
    assert (sweep / "linear_rope" / ".hydra" / "config.yaml").read_text() == "seed: 7\n"
    assert (sweep / "multirun.yaml").read_text() == "first sweep\n"
    assert sorted(p.name for p in sweep.iterdir()) == ["linear_rope", "multirun.yaml"]


def test_a_run_folder_in_use_is_refused(compose, tmp_path):
    import fcntl

    from linrope.run.folder import LOCK_NAME

    with open(tmp_path / LOCK_NAME, "w") as held:
        held.write("pid 4242 on elsewhere\n")
        held.flush()
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(SystemExit) as e:
            run_main(compose("model=linear_rope", *TINY, "trainer.max_steps=2"))
    assert exit_message(e) == (
        f"linrope: run folder {tmp_path} is in use by another run (pid 4242 on elsewhere); "
        f"wait for it to end, or choose another hydra.run.dir"
    )
    assert not (tmp_path / "checkpoints").exists()


# ---- writers of the same checkpoint, full disks -----------------------------------------------------------
def test_two_writers_of_one_checkpoint_do_not_collide(tmp_path, monkeypatch):
    """Writer A is half-way through its file when writer B saves the same path: both succeed and the
    file is whole (with one temporary name for both, A's rename failed and B's file took A's bytes)."""
    import threading

    from linrope.run import checkpoint as C

    path, real_save = tmp_path / "last.ckpt", torch.save
    a_started, b_done = threading.Event(), threading.Event()

    def save(obj, f, *args, **kwargs):
        if obj["global_step"] == 1:  # writer A pauses in the middle of its write
            f.write(b"PK")
            a_started.set()
            b_done.wait(30)
            f.seek(0)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(C.torch, "save", save)
    errors = []

    def write(step):
        try:
            C.atomic_torch_save({"state_dict": {"w": torch.full((1000,), float(step))}, "global_step": step}, path)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    a = threading.Thread(target=write, args=(1,))
    a.start()
    assert a_started.wait(30)
    write(2)
    b_done.set()
    a.join(30)
    assert errors == []
    c = torch.load(path, weights_only=True)
    assert c["global_step"] == 1 and torch.equal(c["state_dict"]["w"], torch.full((1000,), 1.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


class FullDisk:
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(28, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(compose, monkeypatch):
    from linrope.run import checkpoint as C

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("global_step") == 4:
            return real_save(obj, FullDisk(f, 5000), *args, **kwargs)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(C.torch, "save", save)
    cfg = compose(
        "model=linear_rope",
        *TINY,
        "trainer.max_steps=6",
        "trainer.val_check_interval=100",
        "callbacks.last_checkpoint.every_n_train_steps=2",
    )
    with pytest.raises(SystemExit) as e:
        run_main(cfg)
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert exit_message(e) == (
        f"linrope: cannot write checkpoint {last}: no space left on device ({last.parent}); "
        f"the previous last.ckpt is kept"
    )
    assert torch.load(last, weights_only=True)["global_step"] == 2
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]


def test_run_folders_started_in_the_same_second_differ():
    """Run and sweep folders are named to the microsecond (conf/hydra/default.yaml): two runs started in
    the same second get folders of their own (a run folder is also locked: test_a_run_folder_in_use_is_refused)."""
    import datetime

    import yaml

    hydra_cfg = yaml.safe_load((ROOT / "conf" / "hydra" / "default.yaml").read_text())
    for pattern in (hydra_cfg["run"]["dir"], hydra_cfg["sweep"]["dir"]):
        fmt = pattern.split("${now:")[1].split("}")[0]
        t = datetime.datetime(2026, 1, 2, 3, 4, 5, 100)
        assert t.strftime(fmt) != (t + datetime.timedelta(microseconds=1)).strftime(fmt), pattern
