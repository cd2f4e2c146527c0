"""Check commit messages: a subject of at most 72 characters, then a blank line and a body that says why.

    python tools/commit_msg.py .git/COMMIT_EDITMSG      # one message (pre-commit's commit-msg hook passes the file)
    python tools/commit_msg.py --range main..HEAD       # every commit of a range (CI: what a branch adds)

Merge commits, fixup!/squash! commits and git's own comment lines (#) are handled as git handles them.  Exits 1 with
one line per problem, 0 when every message holds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (nothing when it holds)."""
    lines = [line.rstrip() for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1]:
        lines.pop()
    if not lines or not lines[0]:
        return ["the subject line is empty"]
    subject = lines[0]
    if subject.startswith(("Merge ", "fixup! ", "squash! ", "Revert ")):
        return []
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject has {len(subject)} characters (at most {MAX_SUBJECT}): {subject[:MAX_SUBJECT]}…")
    if len(lines) > 1 and lines[1]:
        found.append("the subject is not followed by a blank line")
    elif not any(lines[2:]):
        found.append("no body: say why the change is made, after a blank line")
    return found


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
