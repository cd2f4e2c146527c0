"""The byte corpus: deterministic split by file, deterministic windows, one-line refusals."""

import numpy as np
import pytest

from linrope.data.bytes import (
    ContiguousWindows,
    CorpusError,
    RandomWindows,
    list_files,
    load_corpus,
    split_of,
    stdlib_dir,
)


def test_default_corpus_is_the_stdlib_without_tests():
    files = list_files(stdlib_dir(), (".py",))
    assert len(files) > 300
    parts = {p for f in files for p in f.relative_to(stdlib_dir()).parts[:-1]}
    assert not parts & {"test", "tests", "site-packages"}
    assert any(f.name == "json" or f.parent.name == "json" for f in files)


def test_split_is_deterministic_by_file(tmp_path):
    for i in range(200):
        (tmp_path / f"f{i:03d}.txt").write_text(f"file {i} " * 20)
    a = load_corpus(str(tmp_path), context=8, val_fraction=0.1, test_fraction=0.1)
    b = load_corpus(str(tmp_path), context=8, val_fraction=0.1, test_fraction=0.1)
    for s in ("train", "val", "test"):
        assert np.array_equal(a[s], b[s])
    # each file lands whole in the split its name hashes to
    for i in (0, 17, 123):
        text = (f"file {i} " * 20).encode()
        split = split_of(f"f{i:03d}.txt", 0.1, 0.1)
        assert text in a[split].tobytes()
        assert all(text not in a[s].tobytes() for s in ("train", "val", "test") if s != split)
    sizes = {s: len(a[s]) for s in a}
    assert sizes["train"] > sizes["val"] > 0 and sizes["test"] > 0


def test_windows_are_a_function_of_seed_and_index(small_corpus):
    data = load_corpus(str(small_corpus), context=32)["train"]
    w1 = RandomWindows(data, 32, seed=5, length=100)
    w2 = RandomWindows(data, 32, seed=5, length=40, start=60)  # a resumed loader
    w3 = RandomWindows(data, 32, seed=6, length=100)
    x, y = w1[61]
    assert x.shape == (32,) and y.shape == (32,)
    assert np.array_equal(x[1:].numpy(), y[:-1].numpy())  # targets are inputs shifted by one
    assert np.array_equal(w2[1][0].numpy(), x.numpy())
    assert not all(np.array_equal(w1[i][0].numpy(), w3[i][0].numpy()) for i in range(10))
    offsets = [w1.offset(i) for i in range(100)]
    assert min(offsets) >= 0 and max(offsets) <= len(data) - 33 and len(set(offsets)) > 90


def test_contiguous_windows_tile_the_split(small_corpus):
    data = load_corpus(str(small_corpus), context=16)["val"]
    ds = ContiguousWindows(data, 16)
    assert len(ds) == (len(data) - 1) // 16
    joined = np.concatenate([ds[i][0].numpy() for i in range(len(ds))])
    assert np.array_equal(joined, data[: len(joined)])
    assert len(ContiguousWindows(data, 16, max_windows=3)) == 3


def test_refuses_missing_path(tmp_path):
    with pytest.raises(CorpusError, match=r"does not exist") as e:
        load_corpus(str(tmp_path / "nope"), context=8)
    assert str(tmp_path / "nope") in str(e.value) and "\n" not in str(e.value)


def test_refuses_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"), context=8)
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(tmp_path), context=8)
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    with pytest.raises(CorpusError, match="no files"):
        load_corpus(str(empty_dir), context=8)


def test_refuses_too_short_corpus(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("x" * 100)
    with pytest.raises(CorpusError, match=r"too short .* needs 65") as e:
        load_corpus(str(f), context=64)
    assert str(f) in str(e.value)


def test_only_regular_files_are_read_and_the_rest_is_named(tmp_path):
    """A link to nothing is left out and named.  (A FIFO, which would block a read forever, is tested in a
    process of its own: test_slow_reliability.py.)"""
    import warnings

    for i in range(60):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} " * 40)
    (tmp_path / "gone.txt").symlink_to(tmp_path / "nowhere")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = load_corpus(str(tmp_path), context=8, val_fraction=0.2, test_fraction=0.2)
    assert sum(len(p) for p in parts.values()) > 60 * 300
    messages = [str(w.message) for w in caught]
    assert any(
        "skipped 1 entries that are not regular files or repeat one (a link): " + str(tmp_path / "gone.txt") in m
        for m in messages
    ), messages


def test_a_link_to_a_file_of_the_corpus_is_read_once(tmp_path):
    """``f99.txt -> f00.txt``: the text stood in the corpus twice under two names, so it could sit in the train
    split and the test split at once.  The link is left out (named), whatever split its name falls in."""
    import warnings

    from linrope.data.bytes import list_files

    for i in range(60):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} " * 40)
    (tmp_path / "f99.txt").symlink_to(tmp_path / "f00.txt")
    skipped = []
    assert tmp_path / "f99.txt" not in list_files(tmp_path, (".txt",), skipped) and skipped == [tmp_path / "f99.txt"]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        parts = load_corpus(str(tmp_path), context=8, val_fraction=0.2, test_fraction=0.2)
    names = [d[0] for split in ("train", "val", "test") for d in parts.documents[split]]
    assert "f99.txt" not in names and names.count("f00.txt") == 1
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "g.txt").write_text("text outside the corpus " * 40)
    (tmp_path / "sub").symlink_to(elsewhere, target_is_directory=True)  # a folder link: not walked
    skipped = []
    list_files(tmp_path, (".txt",), skipped)
    assert skipped == [tmp_path / "sub", tmp_path / "f99.txt"]  # named, no longer dropped without a word


def test_unreadable_files_are_named(tmp_path, monkeypatch):
    import warnings
    from pathlib import Path

    for i in range(60):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} " * 40)
    real = Path.read_bytes

    def read_bytes(self):
        if self.name in ("f03.txt", "f07.txt"):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_corpus(str(tmp_path), context=8, val_fraction=0.2, test_fraction=0.2)
    assert any(
        f"skipped 2 unreadable files: {tmp_path / 'f03.txt'}, {tmp_path / 'f07.txt'}" in str(w.message) for w in caught
    ), [str(w.message) for w in caught]
    monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(CorpusError, match=r"no file could be read \(.*f00.txt, .*f01.txt, .*f02.txt and 57 more\)"):
        load_corpus(str(tmp_path), context=8)


def test_a_folder_of_a_few_binaries_says_why_a_split_is_empty(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("a.bin", "b.bin", "c.bin"):
        (tmp_path / name).write_bytes(rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes() + b"\0")
    with pytest.raises(CorpusError) as e:  # binary files are skipped: here that leaves none
        load_corpus(str(tmp_path), context=64)
    assert str(e.value) == (
        f"data.path {tmp_path}: every file looks binary ({tmp_path / 'a.bin'}, {tmp_path / 'b.bin'}, "
        f"{tmp_path / 'c.bin'}); linrope trains byte-level models on text — pass "
        f"data.allow_binary=true to train on them anyway"
    )
    with pytest.raises(CorpusError) as e:
        load_corpus(str(tmp_path), context=64, allow_binary=True)
    msg = str(e.value)
    assert "\n" not in msg and "files are split whole by a hash of their path — train 3, val 0, test 0 files" in msg
    assert "point data.path at one file" in msg


# ---- binary and huge corpora (issue 33) ------------------------------------------------------------------------------
def test_an_executable_is_refused_in_one_line_unless_binary_is_allowed():
    """data.path=/usr/bin/python3 trained on an executable without a word."""
    import sys
    from pathlib import Path

    exe = Path(sys.executable).resolve()
    with pytest.raises(CorpusError) as e:
        load_corpus(str(exe), context=64)
    assert str(e.value).startswith(f"data.path {exe}: does not look like text: it holds NUL bytes (")
    assert str(e.value).endswith(
        "linrope trains byte-level models on text — pass data.allow_binary=true to train on it anyway"
    ) and "\n" not in str(e.value)
    parts = load_corpus(str(exe), context=64, allow_binary=True)
    assert sum(len(p) for p in parts.values()) == exe.stat().st_size


def test_a_huge_sparse_file_is_memory_mapped_and_its_zeros_refused(tmp_path):
    """A 2 GB sparse file was read whole into memory (RSS 2.6 GB) and trained on zeros: now the file is
    memory-mapped, sampled, and refused in one line — also with allow_binary — while memory stays flat."""
    import resource
    import time

    path = tmp_path / "sparse.txt"
    with open(path, "wb") as f:
        f.truncate(2 * 2**30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    t0 = time.perf_counter()
    for allow in (False, True):
        with pytest.raises(CorpusError) as e:
            load_corpus(str(path), context=64, allow_binary=allow)
        assert str(e.value) == (
            f"data.path {path}: does not look like text: every sampled byte is 0 (a sparse or "
            f"zeroed file); there is nothing to learn"
        )
    assert time.perf_counter() - t0 < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # under 100 MB more


def test_a_text_file_is_memory_mapped_not_read(tmp_path):
    """The splits of a single file are views of a memory map of it: nothing is read before it is used."""
    path = tmp_path / "text.txt"
    path.write_bytes(b"def f(x):\n    return x + 1\n" * 2000)
    parts = load_corpus(str(path), context=64)
    assert all(isinstance(p, np.memmap) for p in parts.values())
    assert b"".join(bytes(parts[s]) for s in ("train", "val", "test")) == path.read_bytes()


def test_a_folders_binary_files_are_skipped_and_named(tmp_path):
    import warnings

    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"text {i} " * 60)
    (tmp_path / "tool.bin").write_bytes(b"\x7fELF\x02\x01\x01\0\0\0" + bytes(5000))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = load_corpus(str(tmp_path), context=8, val_fraction=0.2, test_fraction=0.2)
    assert [str(w.message) for w in caught] == [
        f"data.path {tmp_path}: skipped 1 binary files (NUL or control bytes in their first 8192 bytes; "
        f"data.allow_binary=true keeps them): {tmp_path / 'tool.bin'}"
    ]
    assert all(0 not in bytes(p) for p in parts.values())
    kept = load_corpus(str(tmp_path), context=8, val_fraction=0.2, test_fraction=0.2, allow_binary=True)
    assert sum(bytes(p).count(0) for p in kept.values()) > 0
