"""The byte corpus: deterministic split by file, deterministic windows, one-line refusals."""
import numpy as np
import pytest

from linrope.data.bytes import (ContiguousWindows, CorpusError, RandomWindows, list_files, load_corpus, split_of,
                                stdlib_dir)


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
