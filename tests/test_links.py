"""Every relative link in README.md, CONTRIBUTING.md, tests/README.md and docs/**/*.md points at a file git tracks, so
a fresh clone shows what the text links to (results, figures, other docs); every repository file those docs name in
backticks (``tests/data/test_data.py``, ``conf/size/small.yaml``) is one git tracks; and every section named by its
anchor, in a link or cited as ``docs/<file>.md#<anchor>`` anywhere in the repository, is a heading of that file."""

import posixpath
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+[\"'(].*)?$", re.M)
HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.I)
EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//|#)", re.I)


def relative_links(text: str):
    """The link targets of a markdown text that name files in the repository (no URL, no bare #anchor),
    without their #fragment or ?query; links inside code are not links."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = [m.group(1) for pattern in (INLINE, REFERENCE, HTML) for m in pattern.finditer(text)]
    return [re.split(r"[#?]", t, maxsplit=1)[0] for t in targets if not EXTERNAL.match(t)]


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None  # not a git checkout (an sdist, an unpacked archive)
    return set(filter(None, out.stdout.split("\0")))


TRACKED = tracked_files()
TOP_DOCS = ("README.md", "CONTRIBUTING.md", "tests/README.md")
DOCS = sorted(p for p in (TRACKED or ()) if p in TOP_DOCS or (p.startswith("docs/") and p.endswith(".md")))


def test_link_extraction():
    text = (
        'See [the schemes](docs/schemes.md#rope) and ![plot](results/a.png "title").\n'
        '[site](https://example.org) [top](#install) [mail](mailto:a@b.c) <img src="docs/x.png" width=3>\n'
        '`[not](a/link.md)` and\n```python\nx = cfg["a"](docs/no.md)\n[neither](b.md)\n```\n'
        "[ref]: ./docs/ref.md?plain=1\n[up](../outside.md)\n"
    )
    assert relative_links(text) == ["docs/schemes.md", "results/a.png", "../outside.md", "./docs/ref.md", "docs/x.png"]


@pytest.mark.skipif(TRACKED is None, reason="not a git checkout: no list of tracked files")
@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_point_at_tracked_files(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    tracked_dirs = {posixpath.dirname(p) for p in TRACKED}
    tracked_dirs |= {d for p in tracked_dirs for d in _parents(p)}
    broken = []
    for target in relative_links(text):
        path = posixpath.normpath(posixpath.join(posixpath.dirname(doc), target))
        if path not in TRACKED and path.rstrip("/") not in tracked_dirs:
            broken.append(path if path == target else f"{target} (= {path})")
    assert not broken, f"{doc} links to files git does not track: " + "; ".join(broken)


def _parents(path: str):
    while path:
        path = posixpath.dirname(path)
        yield path


# A code span (any run of backticks, closed by a run of the same length, within one paragraph); in it, a word that is
# a path from the repository's root to a file: a top-level folder of the code, no glob or placeholder (<name>, *, {a,b},
# …), and a file extension.  What follows the path (::test_name, :line, #anchor) and quotes or brackets around it are
# not part of it.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
SEPARATORS = re.compile(r"[\s()\[\]'\",;=|`]+")
REPO_PATH = re.compile(r"(?:linrope|tests|conf|docs|benchmarks|tools)(?:/[\w.-]+)+\.[A-Za-z0-9]+")
RECORDS = ("docs/results/", "docs/device_checks/")  # run records keep the paths they were written with
# files a doc names on purpose that a clone does not hold: each with why
NOT_IN_THE_TREE = {
    # the worked example's files: tests/positions/test_new_scheme.py writes them in a temporary folder
    "CONTRIBUTING.md": {
        "linrope/positions/log_distance.py",
        "conf/position/log_distance.yaml",
        "tests/positions/test_log_distance.py",
    },
    "docs/benchmarks.md": {"benchmarks/linear_attention.py"},  # the script before the split (3e34310), as history
    "docs/results-old-protocol.md": {"docs/results/reproduce.sh"},  # removed with the old sweeps: "in the history"
}


def repository_paths(text: str):
    """The repository files a markdown text names in code spans (not in fenced blocks): ``tests/data/test_data.py``,
    the path of ``tests/data/test_data.py::test_x`` or ``linrope/ops/rope.py:12``; not ``conf/model/<name>.yaml``,
    ``docs/results/*/runs.json`` nor a folder."""
    found = []
    for span in CODE_SPAN.finditer(FENCE.sub("", text)):
        for word in SEPARATORS.split(span.group(2)):
            word = re.split(r"::|#|:\d", word, maxsplit=1)[0].rstrip(".:")
            if REPO_PATH.fullmatch(word) and ".." not in word.split("/"):
                found.append(word)
    return found


def test_repository_path_extraction():
    text = (
        "Tests (`tests/data/test_data.py`): `tests/fixtures/test_data.py::test_unreadable_files_are_named`,\n"
        "`python benchmarks/kernel_time.py --device cuda`, `linrope/ops/rope.py:12`, ``a `conf/size/small.yaml` b``\n"
        "and `docs/schemes.md#rope`, `(tools/compat.sh)`. Not: `conf/model/softmax_<scheme>.yaml`,\n"
        "`docs/results/*/runs.json`, `linrope/positions/`, `tests/test_*.py`, `x/linrope/a.py`, `results/a.csv`,\n"
        "`linrope.ops.rope`, `tests/README`, `docs/{a,b}.md`, `tests/../x.py`.\n"
        "```\n`tools/fenced.sh`\n```\nA span may break a line: `python -m linrope report\ndocs/x/y.md`.\n"
    )
    assert repository_paths(text) == [
        "tests/data/test_data.py",
        "tests/fixtures/test_data.py",
        "benchmarks/kernel_time.py",
        "linrope/ops/rope.py",
        "conf/size/small.yaml",
        "docs/schemes.md",
        "tools/compat.sh",
        "docs/x/y.md",
    ]


@pytest.mark.skipif(TRACKED is None, reason="not a git checkout: no list of tracked files")
@pytest.mark.parametrize("doc", [d for d in DOCS if not d.startswith(RECORDS)])
def test_repository_paths_in_code_name_tracked_files(doc):
    """A file a doc names by its path (``tests/data/test_data.py``, a test to read, a script to run, a config) is in
    a fresh clone: a path left behind by a move or a rename fails here."""
    named = set(repository_paths((ROOT / doc).read_text(encoding="utf-8")))
    missing = sorted(named - TRACKED - NOT_IN_THE_TREE.get(doc, set()))
    assert not missing, f"{doc} names files git does not track: " + "; ".join(missing)
    stale = sorted(NOT_IN_THE_TREE.get(doc, set()) - (named - TRACKED))
    assert not stale, f"NOT_IN_THE_TREE lists files {doc} no longer names or git now tracks: " + "; ".join(stale)


@pytest.mark.skipif(TRACKED is None, reason="not a git checkout")
def test_published_results_are_not_ignored_but_local_sweeps_are():
    def ignored(path):
        r = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, timeout=60)
        assert r.returncode in (0, 1), f"git check-ignore failed on {path}"
        return r.returncode == 0

    for path in ("docs/results/pe_compare/report.md", "docs/results/extrapolation/extrapolation.png"):
        assert not ignored(path), f"{path} is ignored by .gitignore: published results could not be committed"
    assert ignored("results/pe_compare/linear_rope-seed1/csv/metrics.csv")  # README's sweep recipe writes there


HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
LINK_WITH_FRAGMENT = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>#]*)#([^)\s>]+)>?[^)]*\)")
CITED = re.compile(r"\b(docs/[\w./-]+\.md|README\.md)#([\w-]+)")
TEXT_FILES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg")


def anchors(text: str) -> set:
    """The anchors GitHub gives a markdown text's headings: lowercased, every character but a letter, digit,
    ``_``, ``-`` or space dropped, spaces made ``-``; a repeated one gets ``-1``, ``-2``, …"""
    seen, out = {}, set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchors():
    text = "# A: b (`c=d`)\n## A: b (`c=d`)\n```\n# not a heading\n```\n### [x](y.md) and `z`\n"
    assert anchors(text) == {"a-b-cd", "a-b-cd-1", "x-and-z"}


@pytest.mark.skipif(TRACKED is None, reason="not a git checkout: no list of tracked files")
def test_every_anchor_cited_is_a_heading_of_its_file():
    """A section named by its anchor exists: links with a ``#fragment`` in the docs (``DOCS``: to another .md file,
    or ``#x`` within the same one), and ``docs/<file>.md#<anchor>`` cited in any tracked text file (docstrings,
    comments, conf/, tests)."""
    cache = {}

    def heads(path):
        if path not in cache:
            cache[path] = anchors((ROOT / path).read_text(encoding="utf-8")) if path in TRACKED else None
        return cache[path]

    broken = []
    for doc in DOCS:
        text = INLINE_CODE.sub("", FENCE.sub("", (ROOT / doc).read_text(encoding="utf-8")))
        for target, fragment in LINK_WITH_FRAGMENT.findall(text):
            if EXTERNAL.match(target) or (target and not target.endswith(".md")):
                continue
            path = posixpath.normpath(posixpath.join(posixpath.dirname(doc), target)) if target else doc
            if heads(path) is not None and fragment not in heads(path):
                broken.append(f"{doc}: {target}#{fragment}")
    for f in sorted(TRACKED):
        if not f.endswith(TEXT_FILES) or f.startswith("docs/results/"):  # run records keep what they were saved with
            continue
        for path, fragment in CITED.findall((ROOT / f).read_text(encoding="utf-8", errors="ignore")):
            if heads(path) is None or fragment not in heads(path):
                broken.append(f"{f}: {path}#{fragment}")
    assert not broken, "anchors that name no heading: " + "; ".join(broken)
