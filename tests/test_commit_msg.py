"""tools/commit_msg.py, the commit-message check of pre-commit's commit-msg hook and of .ci/run: a subject of at most
72 characters, a blank line, a body.  (ruff's lint and format run in pre-commit and .ci/run, not in the suite.)"""

import importlib.util
import os
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


# what `git commit -v` leaves in COMMIT_EDITMSG for the commit-msg hook: git drops the leading blank lines, the
# comments and everything from the scissors line on, so the diff below it is no body
VERBOSE = """

Only a subject
# Please enter the commit message for your changes. Lines starting
#
# ------------------------ >8 ------------------------
# Do not modify or remove the line above.
# Everything below it will be ignored.
diff --git a/f b/f
--- a/f
+++ b/f
@@ -1 +1,2 @@
 a
+b
"""


def test_the_message_is_read_as_git_keeps_it():
    no_body = ["no body: say why the change is made, after a blank line"]
    subject_blank = VERBOSE.lstrip("\n").replace("Only a subject\n", "Only a subject\n\n")
    assert commit_msg.problems(subject_blank) == no_body  # the diff below the scissors is no body
    assert commit_msg.problems(VERBOSE) == no_body  # and the blank lines before the subject are dropped
    assert commit_msg.problems(VERBOSE.replace("Only a subject\n", "Subject\n\nwhy\n")) == []
    assert commit_msg.problems("\n\nSubject\n\nwhy\n") == []  # leading blank lines are no empty subject
    assert commit_msg.problems("\n\n# a comment\n") == ["the subject line is empty"]


def test_git_commit_v_with_the_hook(tmp_path):
    """The hook as git runs it: `git commit -v` with a subject only is refused, the diff below the scissors is no
    body; a default merge (`git merge --no-ff`, which runs the hook too) passes."""

    def git(*args, **kw):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, **kw)

    git("init", "-q", "-b", "main", check=True)
    for key, value in (("user.email", "a@b"), ("user.name", "a"), ("commit.verbose", "false")):
        git("config", key, value, check=True)
    (tmp_path / "f").write_text("a\n")
    git("add", "f", check=True)
    git("commit", "-q", "-m", "First\n\nwhy", check=True)
    hook = tmp_path / ".git" / "hooks" / "commit-msg"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tools" / "commit_msg.py"}" "$1"\n')
    hook.chmod(0o755)
    editor = tmp_path / "editor.py"  # what a user types in: two blank lines, then a subject
    editor.write_text(
        "import sys\np = sys.argv[1]\ntext = open(p).read()\nopen(p, 'w').write('\\n\\nOnly a subject' + text)\n"
    )
    (tmp_path / "f").write_text("a\nb\n")
    git("add", "f", check=True)
    r = git("commit", "-v", env={**os.environ, "GIT_EDITOR": f'"{sys.executable}" "{editor}"'})
    assert r.returncode != 0 and "no body: say why" in r.stderr, r.stderr
    git("commit", "-q", "-m", "Second\n\nwhy", check=True)
    git("switch", "-q", "-c", "side", "HEAD~1", check=True)
    (tmp_path / "g").write_text("c\n")
    git("add", "g", check=True)
    git("commit", "-q", "-m", "Side\n\nwhy", check=True)
    git("switch", "-q", "main", check=True)
    r = git("merge", "--no-ff", "--no-edit", "side")
    assert r.returncode == 0, r.stderr
    assert git("log", "-1", "--format=%s").stdout.strip() == "Merge branch 'side'"


def test_only_what_git_writes_itself_is_exempt():
    """A hand-written subject starting with Merge or Revert keeps to the rule; git's own messages pass."""
    body = "\n\nThe cap hid short runs.\n"
    assert commit_msg.problems("Revert the cap\n") == ["no body: say why the change is made, after a blank line"]
    assert commit_msg.problems("Revert the cap" + body) == []
    assert commit_msg.problems("Merge s35: audit fixes\n") == [
        "no body: say why the change is made, after a blank line"
    ]
    long = "Merge branch 'kernel-plan': heads as tasks by the shape, cache-sized blocks, and more"
    assert commit_msg.problems(long + body) == [f"the subject has {len(long)} characters (at most 72): {long[:72]}…"]
    for own in (
        "Merge branch 'x'",
        "Merge branch 'a-rather-long-branch-name-for-this' of https://example.org/some/repository into main",
        "Merge branches 'a', 'b' and 'c'",
        "Merge remote-tracking branch 'origin/main' into x",
        "Merge tag 'v1.0'; commit 'abc123'",
        "fixup! Subject",
        "squash! Subject",
    ):
        assert commit_msg.problems(own + "\n") == [], own
    revert = 'Revert "' + "x" * 72 + '"\n\nThis reverts commit 0123456789abcdef0123456789abcdef01234567.\n'
    assert commit_msg.problems(revert) == []
    assert commit_msg.problems('Revert "x"\n') == ["no body: say why the change is made, after a blank line"]
