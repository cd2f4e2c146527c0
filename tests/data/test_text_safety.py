"""Issue 52: the text path fails safe.  Shards prove themselves when opened (sizes, counts and content against
the manifest, the tokenizer by hash); each test reproduces a case a hostile user found, and failed before its fix."""

from __future__ import annotations

import json
import os
import shutil
import warnings

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


@pytest.mark.parametrize("record", ["manifest.json", "building.json"])
@pytest.mark.parametrize("damage", ["cut short", "a list", "no shards"])
def test_a_damaged_record_is_one_line_naming_the_file(built, record, damage):
    """A manifest (or a stopped build's record) cut short or edited: one line naming it and what to delete, from the
    reader, the builder that would reuse it, and a data=text module; never a JSON traceback."""
    source, folder = built
    path = folder / record
    if record == "building.json":  # a build stopped before its manifest
        path.write_text(json.dumps({"key": "x"}))
        (folder / "manifest.json").unlink()
    text = path.read_text()
    path.write_text({"cut short": text[: len(text) // 2], "a list": "[1, 2]"}.get(damage, json.dumps({"key": "x"})))
    reason = {"cut short": "not readable as JSON", "a list": "not a JSON object", "no shards": "no dtype, shards"}
    line = f"^{path}: {reason[damage]}.*; delete {folder} so that its shards are rebuilt$"
    if record == "manifest.json":
        with pytest.raises(CorpusError, match=line):
            Shards(folder)
    if damage == "no shards":  # a readable record of another key: refused as before, by what it says
        return
    with pytest.raises(CorpusError, match=line):
        build_shards(source, load_tokenizer("bytes"), cache_dir=folder.parent, progress=False)
    from linrope.data.text import TextDataModule

    with pytest.raises(CorpusError, match=line):
        TextDataModule(path=str(source.root), shards_dir=str(folder.parent), context=16, progress=False)


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


def test_tokenize_train_refuses_an_empty_train_split_and_expands_its_out(tmp_path, monkeypatch, capsys):
    """A corpus whose one file hashes to the validation split (or fractions leaving no train split) wrote a
    tokenizer of the 256 bytes alone and exited 0; ``--out=~/tok.json`` wrote ./~/tok.json."""
    import linrope.data.tokenize_command as T
    from linrope.data.bytes import split_of

    one = next(f"doc{i}.txt" for i in range(1000) if split_of(f"doc{i}.txt", 0.05, 0.05) == "val")
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / one).write_text("a document of the validation split\n" * 20)
    argv = ["train", "--input", str(tmp_path / "val"), "--vocab-size", "300"]
    assert T.main([*argv, "--out", str(tmp_path / "a.json")]) == 1
    assert "no document of the train split to train on" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()
    write_docs(tmp_path / "docs", files=2, per_file=30)
    argv = ["train", "--input", str(tmp_path / "docs"), "--vocab-size", "300"]
    with pytest.raises(SystemExit) as e:
        T.main([*argv, "--out", str(tmp_path / "b.json"), "--val-fraction", "0.6", "--test-fraction", "0.6"])
    assert e.value.code == 2 and "their sum below 1" in capsys.readouterr().err
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    assert T.main([*argv, "--out=~/tok.json"]) == 0
    assert (tmp_path / "home" / "tok.json").is_file() and not (tmp_path / "~").exists()


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


def _mixed_corpus(folder):
    """120 UTF-8 documents in .jsonl, a Latin-1 .txt and a binary .txt (NUL bytes): what case 5 trained on."""
    write_docs(folder, files=2, per_file=60)
    (folder / "latin1.txt").write_bytes("Café crème, déjà vu: naïve façade.\n".encode("latin-1") * 20)
    (folder / "blob.txt").write_bytes(bytes(range(256)) * 8)
    return folder / "latin1.txt", folder / "blob.txt"


def test_binary_and_non_utf8_files_are_named_and_skipped_under_data_text(tmp_path):
    """Case 5: binary files and non-UTF-8 text trained under ``data=text`` with no warning (data=bytes names and
    skips binary ones); a Latin-1 file became U+FFFD characters, so its bytes were counted as UTF-8's replacement
    characters.  They are named and skipped, whatever the tokenizer."""
    latin, blob = _mixed_corpus(tmp_path / "docs")
    source = resolve_source(str(tmp_path / "docs"))
    with pytest.warns(UserWarning, match="skipped 2 files") as caught:
        docs = list(source.documents())
    said = " ".join(str(w.message) for w in caught)
    assert "latin1.txt (not UTF-8: byte 0xe9 at offset 3)" in said and "blob.txt (it holds NUL bytes" in said
    assert len(docs) == 120 and not any(ident.endswith(".txt") for ident, _ in docs)
    assert all("\ufffd" not in raw.decode("utf-8") for _, raw in docs)
    # the shards' manifest names them too (and they change the key: old shards with U+FFFD are not reused)
    folder = build_shards(source, load_tokenizer("bytes"), cache_dir=tmp_path / "cache", progress=False)
    skipped = json.loads((folder / "manifest.json").read_text())["source"]["skipped"]
    assert [s["path"] for s in skipped] == ["blob.txt", "latin1.txt"]


def test_a_latin1_corpus_is_refused_in_one_line(tmp_path):
    """Case 5: a Latin-1 corpus (one file, or a folder of them) trained on U+FFFD replacement characters."""
    latin, blob = _mixed_corpus(tmp_path / "docs")
    with pytest.raises(CorpusError, match=f"^data.path {latin}: not UTF-8 text \\(byte 0xe9 at offset 3\\); "):
        list(resolve_source(str(latin)).documents())
    with pytest.raises(CorpusError, match=f"^data.path {blob}: does not look like text: it holds NUL bytes"):
        list(resolve_source(str(blob)).documents())
    only = tmp_path / "latin"
    only.mkdir()
    for i in range(3):
        (only / f"{i}.txt").write_bytes(f"Ol\xe9 {i}\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=f"^data.path {only}: no file is UTF-8 text: 0.txt \\(not UTF-8"):
        list(resolve_source(str(only)).documents())


def test_bits_per_byte_count_the_same_original_bytes_under_every_tokenizer(tmp_path):
    """Case 5: bpb of a Latin-1 corpus was computed on 426,951 bytes under a BPE against 345,827 under bytes (each
    undecodable byte counted as the 3 bytes of U+FFFD), and ``bytes_mismatch_documents`` stayed 0.  The shards of
    both tokenizers count the documents' own bytes, the same under both."""
    pytest.importorskip("tokenizers")
    from linrope.data.tokenizer import train_bpe

    _mixed_corpus(tmp_path / "docs")
    source = resolve_source(str(tmp_path / "docs"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped files: named by the test above
        texts = [raw.decode("utf-8", errors="replace") for _, raw in source.documents()]
        bpe = train_bpe(iter(texts), 300, tmp_path / "tok.json")
        made = {}
        for name, tok in (("bytes", load_tokenizer("bytes")), ("bpe", bpe)):
            folder = build_shards(resolve_source(str(tmp_path / "docs")), tok, cache_dir=tmp_path / name,
                                  progress=False)  # fmt: skip
            made[name] = json.loads((folder / "manifest.json").read_text())
    assert made["bytes"]["bytes"] == made["bpe"]["bytes"] == sum(len(t.encode()) for t in texts)
    assert made["bpe"]["bytes_mismatch_documents"] == 0


def test_fifos_and_broken_links_in_a_text_folder_are_named(tmp_path):
    """POOR: data=text skipped FIFOs and links to nothing without naming them (data=bytes names them)."""
    write_docs(tmp_path / "docs", files=2, per_file=10)
    os.mkfifo(tmp_path / "docs" / "pipe.txt")
    (tmp_path / "docs" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.warns(
        UserWarning,
        match="skipped 2 entries that are not regular files or repeat one \\(a link\\): .*gone.txt, .*pipe.txt",
    ):
        source = resolve_source(str(tmp_path / "docs"))
    assert len(list(source.documents())) == 20


def test_a_one_file_corpus_is_refused_before_it_is_tokenised(tmp_path, monkeypatch):
    """POOR: a 22 MB one-line document took 70 s and 4.4 GB before "the split has no documents": one text file is
    one document, so two splits are always empty.  Refused before any token is made."""
    big = tmp_path / "one.txt"
    big.write_text("word " * 1000)
    tok = load_tokenizer("bytes")
    monkeypatch.setattr(type(tok), "encode_bytes", lambda *a: pytest.fail("tokenised"))
    with pytest.raises(CorpusError, match=f"^data.path {big}: one file is one document"):
        build_shards(resolve_source(str(big)), tok, out=tmp_path / "s", progress=False)


def test_a_shard_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """POOR: an unwritable shard folder, or a file size limit (``ulimit -f``: EFBIG), ended in a traceback."""
    import errno

    import linrope.data.shards as S

    write_docs(tmp_path / "docs", files=2, per_file=10)
    (tmp_path / "afile").write_text("not a folder\n")
    out = tmp_path / "afile" / "s"
    with pytest.raises(CorpusError, match=f"^{out}: cannot write the shards \\("):
        build_shards(resolve_source(str(tmp_path / "docs")), load_tokenizer("bytes"), out=out, progress=False)

    def too_large(data, path, *a, **k):
        if str(path).endswith(".bin"):
            raise OSError(errno.EFBIG, "File too large", str(path))
        return write(data, path, *a, **k)

    write = S.atomic_write_bytes
    monkeypatch.setattr(S, "atomic_write_bytes", too_large)
    out = tmp_path / "s"
    with pytest.raises(CorpusError, match=f"^{out}: cannot write the shards \\(File too large: .*00000.train.bin\\)"):
        build_shards(resolve_source(str(tmp_path / "docs")), load_tokenizer("bytes"), out=out, progress=False)


def test_a_document_that_spells_the_end_of_document_token_is_text(tmp_path):
    """A text about tokenizers holds "<|endoftext|>": it was encoded as the EOD token (a document end mid-text,
    and 13 bytes fewer in bits per byte's count); it is text, its bytes counted exactly."""
    from linrope.data.tokenizer import EOD, train_bpe

    texts = [f"document {i}: a model emits {EOD} at the end of each sample, then stops." for i in range(40)]
    tok = train_bpe(texts, 300, tmp_path / "tok.json")
    ids = tok.encode_batch([texts[0]])[0]
    assert tok.eod not in ids
    assert int(tok.token_bytes()[ids].sum()) == len(texts[0].encode())
    assert tok.decode(ids) == texts[0]
