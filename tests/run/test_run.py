"""The run-time services (linrope/run/): Lightning's private parts used in one module only, within the
Lightning versions it was written against; last.ckpt's state key unchanged for the checkpoints of earlier
versions; the CSV history kept when another process wrote metrics.csv; the signal stop asks Lightning to stop.
The signals, locks and DDP themselves are tested in test_reliability.py and test_slow_reliability.py."""

import ast
import csv
import importlib
import inspect
import re
import signal
import types
from importlib.metadata import version
from pathlib import Path

import lightning as L
import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.helpers import ROOT, tiny

TINY = tiny("test=false")
INTERNALS = ROOT / "linrope" / "run" / "lightning_internals.py"


def test_lightning_is_a_version_the_internals_were_written_against():
    """linrope.run.lightning_internals names the Lightning versions it was read against; pyproject.toml
    requires the same ones, and the installed Lightning is one of them."""
    from linrope.run.lightning_internals import LIGHTNING

    assert version("lightning") in SpecifierSet(LIGHTNING), (version("lightning"), LIGHTNING)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "lightning"]
    assert req.specifier == SpecifierSet(LIGHTNING), str(req)


def lightning_privates(klass: type) -> set:
    """The private names Lightning's classes among ``klass``'s bases define or set on ``self``."""
    names = set()
    for base in klass.__mro__[1:]:
        if base.__module__.startswith("lightning"):
            names |= {n for n in vars(base) if n.startswith("_") and not n.startswith("__")}
            names |= set(re.findall(r"self\.(_[a-z]\w*)\s*[:=]", inspect.getsource(base)))
    return names


def private_uses(path: Path) -> list:
    """In a linrope module: ``x._name`` where ``_name`` is not the file's own (a def, a class, a name, an
    attribute set on self), ``self._name`` where it is a Lightning base class's, and imports from a private
    Lightning module (``lightning.x._y``)."""
    tree = ast.parse(path.read_text())
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    found = []
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        inherited = lightning_privates(getattr(module, cls.name)) if hasattr(module, cls.name) else set()
        found += [
            f"{path.name}:{n.lineno} .{n.attr}"
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
            and n.attr in inherited
        ]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in own
        ):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("lightning")
            and any(part.startswith("_") for part in node.module.split("."))
        ):
            found.append(f"{path.name}:{node.lineno} from {node.module}")
    return sorted(set(found))


def test_only_lightning_internals_touches_lightnings_private_parts():
    """Every module that imports Lightning reaches only its public parts, except linrope.run.lightning_internals,
    whose uses are at most two and each say why."""
    offenders = []
    for path in sorted((ROOT / "linrope").rglob("*.py")):
        if path != INTERNALS and "lightning" in path.read_text():
            offenders += private_uses(path)
    assert offenders == []
    uses = private_uses(INTERNALS)
    assert len(uses) == 2 and {u.split(" .")[1] for u in uses} == {"_signal_connector", "_wandb_init"}, uses
    tree = ast.parse(INTERNALS.read_text())
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        assert "Private:" in (ast.get_docstring(fn) or ""), fn.name  # the reason, and the attribute


def test_the_private_uses_still_do_what_they_are_used_for(tmp_path):
    """Against the installed Lightning: the stop request is what Trainer.received_sigterm reports, and the
    wandb arguments hold no anonymous setting."""
    from linrope.run.lightning_internals import stop_after_this_step
    from linrope.run.loggers import WandbLogger

    trainer = L.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=str(tmp_path)
    )
    assert not trainer.received_sigterm
    stop_after_this_step(trainer)
    assert trainer.received_sigterm
    logger = WandbLogger(project="p", save_dir=str(tmp_path), mode="disabled")
    assert "anonymous" not in logger._wandb_init and logger._wandb_init["mode"] == "disabled"


@pytest.mark.parametrize("every_n_epoch, interval, batches", [(None, 3, 4), (1, 2, 5), (2, 1.0, 3), (1, 0.5, 4)])
def test_validation_follows_is_lightnings_own_decision_at_every_step(tmp_path, every_n_epoch, interval, batches):
    """linrope.run.last_checkpoint.validation_follows reads Lightning's rule from public attributes; at every
    training step of a fit (steps counted across epochs, or epoch by epoch, fractions of an epoch, the last
    batch) it agrees with Lightning's private decision, and validation ran exactly after the steps it named."""
    import torch

    from linrope.run.last_checkpoint import validation_follows

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)
            self.said, self.validated = [], []

        def training_step(self, batch, i):
            return self.w(batch[0]).sum()

        def validation_step(self, batch, i):
            if i == 0:
                self.validated.append(self.trainer.global_step)

        def on_train_batch_end(self, outputs, batch, i):
            ours = validation_follows(self.trainer)
            theirs = self.trainer.fit_loop.epoch_loop._should_check_val_fx(None)
            assert ours == theirs, (self.trainer.global_step, ours, theirs)
            if ours:
                self.said.append(self.trainer.global_step)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(batches, 2)), batch_size=1)
    net = Net()
    trainer = L.Trainer(
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        check_val_every_n_epoch=every_n_epoch,
        val_check_interval=interval,
    )
    trainer.fit(net, data, data)
    assert net.said and net.said == net.validated


def test_last_ckpt_state_key_is_the_one_earlier_checkpoints_hold(compose):
    """Lightning stores each callback's state under its state key; LastCheckpoint writes out the key Lightning
    2.x derived for it (``Callback._generate_state_key``: class name and a dict's repr), so the checkpoints of
    earlier versions, whose LastCheckpoint lived in linrope.run.checkpoint, resume with their state found."""
    from linrope.run.last_checkpoint import LastCheckpoint

    assert (
        LastCheckpoint("/r/checkpoints").state_key
        == "LastCheckpoint{'dirpath': '/r/checkpoints', 'filename': 'last.ckpt'}"
    )
    import train

    cfg = compose("model=linear_rope", *TINY, "trainer.max_steps=2", "trainer.val_check_interval=2")
    train.main(cfg)
    folder = Path(cfg.paths.output_dir) / "checkpoints"
    c = torch.load(folder / "last.ckpt", weights_only=True)
    key = f"LastCheckpoint{{'dirpath': '{folder}', 'filename': 'last.ckpt'}}"
    assert c["callbacks"][key]["dirpath"] == str(folder)
    # resumed: Lightning hands that state back to the callback whose key it is
    seen = []
    LastCheckpoint.load_state_dict = lambda self, state: seen.append(state)
    try:
        train.main(
            compose("model=linear_rope", *TINY, "trainer.max_steps=3", "trainer.val_check_interval=3", "ckpt_path=last")
        )
    finally:
        del LastCheckpoint.load_state_dict
    assert seen == [c["callbacks"][key]]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 3


def test_csv_history_keeps_the_columns_another_process_wrote(tmp_path):
    """As with trainer=ddp_spawn: one logger object writes fit's rows, a copy made before fit (the test
    process's) then writes test's rows into the same metrics.csv — every row and column is kept."""
    import copy

    from linrope.run.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(tmp_path), name="csv", version="")
    logger.log_hyperparams({"seed": 1})  # in the first process, before fit (training.log_config)
    test_side = copy.deepcopy(logger)
    logger.log_metrics({"train/loss": 2.0}, step=0)
    logger.log_metrics({"train/loss": 1.5, "val/bpb": 3.0}, step=1)
    logger.save()
    test_side.log_metrics({"test/bpb": 2.5}, step=2)
    test_side.save()
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    assert [r["step"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["train/loss"] == "2.0" and rows[1]["val/bpb"] == "3.0" and rows[2]["test/bpb"] == "2.5"
    assert set(rows[0]) == {"step", "train/loss", "val/bpb", "test/bpb"}


def test_signal_stop_asks_every_process_to_stop_after_the_step(monkeypatch):
    """A noted signal: after the step, the stop is requested and the signal named (one process); at the end the
    handler it found is back (compared with what this test found, not with Python's default: a suite started with
    SIGINT ignored, ``nohup pytest &``, found SIG_IGN)."""
    from linrope.run import signals as S

    before = signal.getsignal(signal.SIGINT)
    asked = []
    monkeypatch.setattr(S, "stop_after_this_step", asked.append)
    stop = S.SignalStop()
    trainer = types.SimpleNamespace(world_size=1)
    stop.on_train_start(trainer, None)
    try:
        stop.on_train_batch_end(trainer, None, None, None, 0)
        assert asked == [] and stop.stopped_by is None
        signal.raise_signal(signal.SIGINT)  # noted, not raised
        stop.on_train_batch_end(trainer, None, None, None, 1)
        assert asked == [trainer] and stop.stopped_by == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # twice: at once
    finally:
        stop.on_train_end(trainer, None)
    assert signal.getsignal(signal.SIGINT) is before
