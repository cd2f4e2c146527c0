"""``--help`` of the Hydra commands (linrope/config/command_line.py): answered before torch or Lightning is imported, what
the command does, its main options and an example, never Hydra's banner or a dump of the config."""

import subprocess
import sys

import pytest

from linrope.config.command_line import check_command_line, command_help
from tests.helpers import ROOT

COMMANDS = ("train", "evaluate", "generate", "passkey")

SHOW = """
import sys
from linrope import __main__ as commands
for name in sys.argv[1:]:
    print("=== " + name)
    sys.argv = ["linrope-" + name, "--help"]
    try:
        getattr(commands, name)()  # the console script linrope-<name>
    except SystemExit as e:
        assert e.code in (0, None), e.code
print("=== loaded", sorted(m for m in ("torch", "lightning") if m in sys.modules))
"""


def test_help_is_answered_without_torch_and_says_what_each_command_does():
    r = subprocess.run(
        [sys.executable, "-c", SHOW, *COMMANDS], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    assert r.stdout.strip().splitlines()[-1] == "=== loaded []"  # neither torch nor Lightning: a fraction of a second
    shown = dict(part.split("\n", 1) for part in r.stdout.split("=== ")[1:-1])
    for name, text in shown.items():
        assert text.strip() == command_help(name).strip()
        assert text.startswith(f"linrope-{name} ") and "Example" in text and "--cfg job" in text
        assert "$" not in text and "Powered by Hydra" not in text and "task_name:" not in text  # no config dump
        assert len(text.splitlines()) < 60, name
    assert list(shown) == list(COMMANDS)
    train = shown["train"]
    assert "model: linear, linear_alibi," in train and "experiment: budget, extrapolation, headline," in train
    assert "study:" not in train  # conf/study is no option of a run


@pytest.mark.parametrize("given", ["study=headline", "+study=headline"])
def test_a_study_given_to_train_is_one_line_naming_what_runs_it(given):
    with pytest.raises(SystemExit) as e:
        check_command_line([given, "size=tiny"])
    assert str(e.value) == (
        f"linrope: {given}: conf/study/ says what a study claims, read by linrope report, not an option of a run; "
        f"run the study's jobs with: python train.py -m experiment=headline"
    )
