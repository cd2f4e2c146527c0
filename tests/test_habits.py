"""The project's habits, checked: ruff's lint and format pass with the settings in pyproject.toml, and commit
messages have a subject of at most 72 characters and a body (tools/commit_msg.py, also pre-commit's commit-msg hook)."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
commit_msg = importlib.import_module("commit_msg")


def ruff():
    found = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    assert found, "ruff is not installed: pip install -e '.[dev]' (the dev extra carries it)"
    return found


@pytest.mark.parametrize("args", [["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]])
def test_ruff_passes(args):
    r = subprocess.run([ruff(), *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_ruff_would_catch_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    r = subprocess.run(
        [ruff(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "F401" in r.stdout


def test_commit_messages():
    ok = "Save the chosen pair's model.name\n\nHydra saved it before the task ran.\n"
    assert commit_msg.problems(ok) == []
    assert commit_msg.problems("x" * 72 + "\n\nwhy\n") == []
    assert commit_msg.problems("x" * 73 + "\n\nwhy\n") == [
        "the subject has 73 characters (at most 72): " + "x" * 72 + "…"
    ]
    assert commit_msg.problems("Subject\nbody at once\n") == ["the subject is not followed by a blank line"]
    assert commit_msg.problems("Subject only\n# a git comment\n") == [
        "no body: say why the change is made, after a blank line"
    ]
    assert commit_msg.problems("Merge branch 'x'\n") == []


def test_commit_msg_script_exits_1_on_a_bad_message(tmp_path):
    msg = tmp_path / "COMMIT_EDITMSG"
    msg.write_text("y" * 80 + "\n\nwhy\n")
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "commit_msg.py"), str(msg)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "80 characters" in r.stderr
