"""Check commit messages: a subject of at most 72 characters, then a blank line and a body that says why.

    python tools/commit_msg.py .git/COMMIT_EDITMSG      # one message (pre-commit's commit-msg hook passes the file)
    python tools/commit_msg.py --range main..HEAD       # every commit of a range (CI: what a branch adds)

The message is read as git keeps it: comment lines (#) and everything from the scissors line of ``git commit -v`` on
are dropped, and so are leading blank lines.  Merge and revert commits follow the rule too; only messages git writes
itself pass as they are: a default merge message (``Merge branch 'x' into main``), a default revert (``Revert "…"``
with its ``This reverts commit …`` line) and fixup!/squash! commits (squashed away by ``rebase --autosquash``).
``--range`` leaves merge commits out: the history before the rule has merges with a subject only.  Exits 1 with one
line per problem, 0 when every message holds.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72
# git commit -v puts the diff below this line; git drops it, and everything after it, from the message
SCISSORS = "# ------------------------ >8 ------------------------"
# the subjects git's fmt-merge-msg writes: kinds of quoted names, joined by ", ", " and " and "; ", then "of URL",
# "into BRANCH"
_NAMES = r"'[^']*'(?:(?:, | and )'[^']*')*"
_KIND = r"(?:branch|branches|tag|tags|commit|commits|remote-tracking branch|remote-tracking branches)"
GIT_MERGE = re.compile(rf"Merge {_KIND} {_NAMES}(?:; {_KIND} {_NAMES})*(?: of \S+)?(?: into \S+)?")
GIT_REVERT = re.compile(r'(?:Revert|Reapply) ".*"')


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (nothing when it holds)."""
    lines = []
    for line in message.splitlines():
        if line.rstrip() == SCISSORS:
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        return ["the subject line is empty"]
    subject = lines[0]
    if written_by_git(subject, lines[1:]):
        return []
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject has {len(subject)} characters (at most {MAX_SUBJECT}): {subject[:MAX_SUBJECT]}…")
    if len(lines) > 1 and lines[1]:
        found.append("the subject is not followed by a blank line")
    elif not any(lines[2:]):
        found.append("no body: say why the change is made, after a blank line")
    return found


def written_by_git(subject: str, body: list[str]) -> bool:
    """Whether the message is one git writes itself: a default merge or revert message, a fixup!/squash! commit.
    A hand-written subject that merely starts with Merge or Revert is checked as any other."""
    if subject.startswith(("fixup! ", "squash! ")):
        return True
    if GIT_MERGE.fullmatch(subject):
        return True
    return bool(GIT_REVERT.fullmatch(subject)) and any(line.startswith("This reverts commit ") for line in body)


def commits(spec: str) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h%x00%B%x01", spec], capture_output=True, text=True, check=True
    ).stdout
    return [tuple(entry.strip("\n").split("\x00", 1)) for entry in out.split("\x01") if entry.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", help="a commit message file (the commit-msg hook's argument)")
    parser.add_argument("--range", help="check every commit of a git revision range, e.g. main..HEAD")
    args = parser.parse_args(argv)
    if bool(args.file) == bool(args.range):
        parser.error("give one message file or --range")
    if args.file:
        found = [f"{args.file}: {p}" for p in problems(Path(args.file).read_text())]
    else:
        found = [f"{sha}: {p}" for sha, message in commits(args.range) for p in problems(message)]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
