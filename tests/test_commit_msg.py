"""tools/commit_msg.py, the commit-message check of pre-commit's commit-msg hook and of .ci/run: a subject of at most
72 characters, a blank line, a body.  (ruff's lint and format run in pre-commit and .ci/run, not in the suite.)"""

import importlib.util
import subprocess
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
commit_msg = importlib.import_module("commit_msg")


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
