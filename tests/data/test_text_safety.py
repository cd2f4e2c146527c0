"""Issue 52: the text path fails safe.  Shards prove themselves when opened (sizes, counts and content against
the manifest, the tokenizer by hash); each test reproduces a case a hostile user found, and failed before its fix."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from linrope.base.errors import CorpusError
from linrope.data.shards import Shards, build_shards
from linrope.data.sources import resolve_source
from linrope.data.tokenizer import load_tokenizer
from tests.data.helpers import write_docs


@pytest.fixture
def built(tmp_path):
    """Shards of 120 small documents (bytes tokenizer) in a cache folder, as ``data=text`` builds them."""
    write_docs(tmp_path / "docs", files=2, per_file=60)
    source = resolve_source(str(tmp_path / "docs"))
    folder = build_shards(source, load_tokenizer("bytes"), cache_dir=tmp_path / "cache", progress=False)
    return source, folder


def test_a_truncated_shard_is_refused_naming_the_file(built):
    """Case 1: ``truncate -s`` of a shard trained on part of the corpus with exit 0 and no word."""
    source, folder = built
    train = folder / "00000.train.bin"
    os.truncate(train, train.stat().st_size // 4 * 2)  # whole tokens, so the memory map alone would not notice
    with pytest.raises(CorpusError, match=f"^{train}: .*bytes; the manifest says"):
        Shards(folder)
    # and so does the data module a data=text run builds: the same folder, reused by its key
    from linrope.data.text import TextDataModule

    with pytest.raises(CorpusError, match=str(train)):
        TextDataModule(path=str(source.root), shards_dir=str(folder.parent), context=16, progress=False)


def test_shards_whose_contents_differ_from_the_manifest_are_refused(built, tmp_path):
    """Case 1: a shard of the same size with other tokens, and an index (docs.npy) of another shard."""
    _, folder = built
    train = folder / "00000.train.bin"
    data = bytearray(train.read_bytes())
    data[10:14] = bytes(4) if data[10:14] != bytes(4) else b"\1\0\1\0"
    train.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=f"^{train}: its content differs from the manifest"):
        Shards(folder)

    write_docs(tmp_path / "two", files=2, per_file=60, seed=5)
    other = build_shards(resolve_source(str(tmp_path / "two")), load_tokenizer("bytes"), out=tmp_path / "o",
                         progress=False)  # fmt: skip
    shutil.copy(other / "00000.train.bin", train)  # another corpus's shard
    with pytest.raises(CorpusError, match=str(train)):
        Shards(folder)


def test_shards_of_another_tokenizer_under_this_ones_key_are_refused(tmp_path):
    """Case 1: a folder holding another tokenizer's shards under this tokenizer's key (manifest copied over, or
    edited to say this key) is refused in one line naming both tokenizers' hashes."""
    pytest.importorskip("tokenizers")
    from linrope.data.tokenizer import train_bpe

    texts = write_docs(tmp_path / "docs", files=2, per_file=60)
    source = resolve_source(str(tmp_path / "docs"))
    bpe = train_bpe((t for _, t in texts), 300, tmp_path / "tok.json")
    cache = tmp_path / "cache"
    ours = build_shards(source, bpe, cache_dir=cache, progress=False)
    theirs = build_shards(source, load_tokenizer("bytes"), cache_dir=tmp_path / "other", progress=False)
    key = json.loads((ours / "manifest.json").read_text())["key"]
    shutil.rmtree(ours)
    shutil.copytree(theirs, ours)  # the bytes tokenizer's shards, their manifest edited to say the BPE's key
    m = json.loads((ours / "manifest.json").read_text())
    m["key"] = key
    (ours / "manifest.json").write_text(json.dumps(m))
    from linrope.data.text import TextDataModule  # a data=text run on that folder

    with pytest.raises(CorpusError, match=f"^{ours}: .*tokenizer bytes \\(sha256 {load_tokenizer('bytes').digest}\\)"):
        TextDataModule(path=str(source.root), tokenizer=str(tmp_path / "tok.json"), shards_dir=str(cache), context=16,
                       progress=False)  # fmt: skip


def test_tokenize_train_checks_its_output_path_before_training(tmp_path, monkeypatch, capsys):
    """Case 9: ``tokenize train --out <bad path>`` failed only after training the tokenizer."""
    import linrope.data.tokenize_command as T

    write_docs(tmp_path / "docs", files=1, per_file=20)
    (tmp_path / "afile").write_text("not a folder\n")
    trained = []
    monkeypatch.setattr(T, "train_bpe", lambda *a, **k: trained.append(a))
    bad = tmp_path / "afile" / "tok.json"
    argv = ["train", "--input", str(tmp_path / "docs"), "--vocab-size", "300", "--out", str(bad)]
    assert T.main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"linrope: --out {bad}: cannot write into {bad.parent} (not a folder)"
    ]
    assert trained == []  # refused before any training


def test_a_glob_does_not_follow_symlink_loops(tmp_path):
    """Case 6: ``--input 'dir/**/*.txt'`` with a symlink loop read 10 files as 410 documents; with two loops it hung.
    A glob's ``**`` does not descend into linked folders, and each file is read once."""
    docs = tmp_path / "dir"
    for i in range(10):
        (docs / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (docs / f"d{i % 3}" / f"{i}.txt").write_text(f"document {i}\n")
    (docs / "d0" / "loop").symlink_to(docs)
    source = resolve_source(f"{docs}/**/*.txt")
    assert len(source.files) == 10 and len(list(source.documents())) == 10
    (docs / "d1" / "again").symlink_to(docs / "d0")  # two loops: was exponential
    assert len(resolve_source(f"{docs}/**/*.txt").files) == 10
    assert len(resolve_source(f"{docs}/d*/[0-4].txt").files) == 5  # the other wildcards as before
