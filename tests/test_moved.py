"""Paths saved before linrope's folders became its layers keep loading (linrope.base.moved)."""

import importlib
import subprocess
from pathlib import Path

import hydra.utils
import pytest
import yaml

from linrope.base.moved import MOVED, current_name
from linrope.base.nested import flatten

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_imports_the_moved_module_itself(old):
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} exists again: drop its alias"
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def saved_targets():
    """Every ``_target_`` of a config a committed run saved: a run folder's ``.hydra/config.yaml``, or a study's
    compact ``runs.json`` (linrope.analysis.compact), which holds each run's saved config as written."""
    import json

    files = subprocess.run(
        ["git", "ls-files", "docs/results/*config.yaml", "docs/results/**/config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split()
    compact = subprocess.run(
        ["git", "ls-files", "docs/results/**/runs.json"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "_target_" and isinstance(v, str) and v.startswith("linrope."):
                    found.add(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for f in files:
        walk(yaml.safe_load((ROOT / f).read_text()))
    for f in compact:
        walk([run["config"] for run in json.loads((ROOT / f).read_text())["runs"]])
    return sorted(found)


def test_every_target_saved_in_a_committed_run_folder_resolves():
    targets = saved_targets()
    assert "linrope.movement.PositionMovement" in targets  # saved before the move: the alias is what is tested
    for t in targets:
        cls = hydra.utils.get_class(t)
        assert cls is hydra.utils.get_class(current_name(t)), t


def test_saved_configs_compare_equal_across_the_move():
    old = flatten({"callbacks": {"m": {"_target_": "linrope.movement.PositionMovement", "every": 1}}})
    new = flatten({"callbacks": {"m": {"_target_": "linrope.training.movement.PositionMovement", "every": 1}}})
    assert old == new
    assert current_name("linrope.training.build_module") == "linrope.training.builders.build_module"
    assert current_name("linrope.training.lit.LanguageModel") == "linrope.training.lit.LanguageModel"
    assert current_name("linrope.config.validate") == "linrope.config.checks.validate"
    assert current_name("linrope.config.command_line.CONF_DIR") == "linrope.config.command_line.CONF_DIR"
    assert current_name("lightning.pytorch.Trainer") == "lightning.pytorch.Trainer"
