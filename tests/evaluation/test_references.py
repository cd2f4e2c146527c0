"""The reference rows (linrope.evaluation.references): the unigram against hand-computed values, the Kneser–Ney
n-gram against a slow pure-Python form of the same smoothing, both normalised at every context, per-document sums,
the command.  Tiny corpora; the stdlib corpus only in the slow test."""

import math
import time
import zlib
from collections import Counter, defaultdict

import numpy as np
import pytest

from linrope.base.errors import ConfigError
from linrope.evaluation.references import (
    WHOLE,
    KneserNey,
    Unigram,
    main,
    per_document,
    reference_scores,
    summary_rows,
)


def rng(*key) -> np.random.Generator:
    """Each case draws its own text, the same on every run."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def markov_text(r: np.random.Generator, n: int, alphabet: bytes = b"abcdef ", words=(b"def ", b"self.", b"return ")):
    """Text with structure an n-gram can use: a sparse random order-2 chain over ``alphabet`` with words spliced in."""
    k = len(alphabet)
    table = r.dirichlet(np.full(k, 0.3), size=(k, k))
    out = bytearray(alphabet[:2])
    while len(out) < n:
        if r.random() < 0.05:
            out += words[r.integers(len(words))]
            continue
        i, j = (
            alphabet.index(out[-2]) if out[-2] in alphabet else 0,
            alphabet.index(out[-1]) if out[-1] in alphabet else 0,
        )
        out.append(alphabet[r.choice(k, p=table[i, j])])
    return np.frombuffer(bytes(out[:n]), dtype=np.uint8)


# ---- a slow, obviously correct interpolated modified Kneser–Ney (Chen & Goodman 1999), dicts and loops --------
def slow_discounts(counts) -> list:
    cc = Counter(min(c, 5) for c in counts)
    n1, n2, n3, n4 = cc[1], cc[2], cc[3], cc[4]
    y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 else None
    raw = [
        1 - 2 * y * n2 / n1 if y is not None and n1 else None,
        2 - 3 * y * n3 / n2 if y is not None and n2 else None,
        3 - 4 * y * n4 / n3 if y is not None and n3 else None,
    ]
    return [0.0] + [min(max(0.75 if d is None else d, 0.1), j) for j, d in enumerate(raw, start=1)]


class SlowKN:
    def __init__(self, train: bytes, n: int):
        self.n = n
        top = Counter(train[i : i + n] for i in range(len(train) - n + 1))
        self.a = {n: dict(top)}  # level n: counts of the n-grams
        grams = set(top)
        for k in range(n - 1, 0, -1):  # level k: how many distinct bytes precede each k-gram among the (k+1)-grams
            cont = Counter(g[1:] for g in grams)
            self.a[k] = dict(cont)
            grams = set(cont)
        self.d = {k: slow_discounts(t.values()) for k, t in self.a.items()}
        self.total = {k: defaultdict(int) for k in self.a}
        self.nj = {k: defaultdict(lambda: [0, 0, 0]) for k in self.a}
        for k, table in self.a.items():
            for g, c in table.items():
                self.total[k][g[:-1]] += c
                self.nj[k][g[:-1]][min(c, 3) - 1] += 1

    def p(self, context: bytes, w: int) -> float:
        prob = 1 / 256
        for k in range(1, self.n + 1):
            if len(context) < k - 1:
                break
            h = context[len(context) - (k - 1) :] if k > 1 else b""
            t = self.total[k].get(h, 0)
            if t == 0:
                continue
            c = self.a[k].get(h + bytes([w]), 0)
            gamma = sum(self.d[k][j + 1] * self.nj[k][h][j] for j in range(3)) / t
            prob = max(c - (self.d[k][min(c, 3)] if c else 0.0), 0.0) / t + gamma * prob
        return prob


# ---- the unigram ------------------------------------------------------------------------------------------------
def test_unigram_against_hand_computed_add_one_values():
    m = Unigram().fit(b"aabac")  # a 3, b 1, c 1; N = 5; p(w) = (c(w) + 1) / (5 + 256)
    assert m.probs[ord("a")] == 4 / 261 and m.probs[ord("b")] == 2 / 261 and m.probs[ord("z")] == 1 / 261
    nats = m.nll(b"zabz")  # targets at offsets 1..3: a, b, z (the first byte is context only)
    assert nats.dtype == np.float64 and nats.shape == (3,)
    assert np.array_equal(nats, [-math.log(4 / 261), -math.log(2 / 261), -math.log(1 / 261)])
    assert math.isclose(m.distribution().sum(), 1.0, rel_tol=1e-15)


# ---- the n-gram -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [2, 3, 5])
def test_ngram_probabilities_sum_to_one_at_seen_unseen_and_short_contexts(order):
    r = rng("normalised", order)
    train = markov_text(r, 3000)
    m = KneserNey(order).fit(train)
    starts = r.integers(0, len(train) - order, 20)
    contexts = [bytes(train[s : s + order - 1]) for s in starts]  # seen
    contexts += [bytes(r.integers(0, 256, order - 1, dtype=np.uint8)) for _ in range(10)]  # mostly unseen
    contexts += [b"", b"a", b"zz\x00", bytes(train[:1]), b"\xff" * 12, b"self.re"]  # short, unseen, long
    for c in contexts:
        p = m.distribution(c)
        assert p.shape == (256,) and (p > 0).all() and abs(p.sum() - 1) < 1e-12, (c, p.sum())
    tiny = KneserNey(order).fit(b"abcabd")  # counts of counts 0: the discounts that cannot be estimated
    for c in (b"", b"ab", b"ca", b"xy", b"b"):
        assert abs(tiny.distribution(c).sum() - 1) < 1e-12


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_ngram_matches_a_slow_pure_python_kneser_ney(order):
    r = rng("slow", order)
    # runs of NUL bytes in both: the first bytes of the test text have short contexts, which must not read as
    # contexts padded with zero bytes (seen in training here)
    nul = np.frombuffer(b"\0\0\0\0\0a\0\0\0\0b", np.uint8)
    train = np.concatenate([markov_text(r, 1500), nul])
    test = np.concatenate([nul[4:], markov_text(r, 300, alphabet=b"abcdefg "), np.array([0, 255, 97], np.uint8)])
    m = KneserNey(order).fit(train)
    slow = SlowKN(bytes(train), order)
    assert all(np.allclose(m.levels[k - 1].discount, slow.d[k], rtol=0, atol=1e-15) for k in slow.a)
    want = [-math.log(slow.p(bytes(test[max(0, t - order + 1) : t]), int(test[t]))) for t in range(1, len(test))]
    got = m.nll(test)
    assert got.shape == (len(test) - 1,) and got.dtype == np.float64
    assert np.allclose(got, want, rtol=1e-12, atol=0), np.abs(got - want).max()
    estimated = m.levels[-1].discount[1:]
    assert order == 1 or not np.allclose(estimated, 0.75)  # the Chen-Goodman estimates were used, not the fallback


def test_ngram_beats_the_unigram_on_structured_text_and_is_deterministic():
    r = rng("structured")
    text = markov_text(r, 20_000)
    splits = {"train": text[:18_000].copy(), "test": text[18_000:].copy()}  # writable, as the loader's are
    before = {k: v.copy() for k, v in splits.items()}
    scores = reference_scores(splits, "test", orders=(1, 3, 5))
    assert all(np.array_equal(splits[k], before[k]) for k in splits)  # the splits are left as they were
    assert list(scores) == ["unigram", "3-gram", "5-gram"]
    bpb = {k: v.mean() / math.log(2) for k, v in scores.items()}
    assert max(bpb["3-gram"], bpb["5-gram"]) < 0.6 * bpb["unigram"], bpb  # the text is an order-2 chain
    again = reference_scores(before, "test", orders=(1, 3, 5))
    assert all(np.array_equal(scores[k], again[k]) for k in scores)


def test_ngram_refuses_bad_orders_and_short_training_text():
    for bad in (0, 9, 2.5):
        with pytest.raises(ConfigError, match="order"):
            KneserNey(bad)
    with pytest.raises(ConfigError, match="fewer than one 5-gram"):
        KneserNey(5).fit(b"abc")
    with pytest.raises(ConfigError, match="split 'validation'"):
        reference_scores({"train": np.zeros(10, np.uint8), "test": np.zeros(10, np.uint8)}, "validation")


# ---- per document -----------------------------------------------------------------------------------------------
def test_per_document_sums_add_up_to_the_split():
    r = rng("documents")
    text = markov_text(r, 2000)
    nats = KneserNey(3).fit(markov_text(r, 3000)).nll(text)  # targets at offsets 1 .. 1999
    total = float(nats.sum())
    tiling = [("a.py", 0, 700), ("b.py", 700, 701), ("c.py", 701, 2000)]
    rows = per_document(nats, tiling)
    assert [d["bytes"] for d in rows] == [699, 1, 1299]  # offset 0 has no target
    assert math.isclose(sum(d["nats"] for d in rows), total, rel_tol=1e-12)
    assert rows[1]["nats"] == nats[699]  # the target at offset 700
    gaps = [("a.py", 0, 700), ("b.py", 701, 1500), ("c.py", 1501, 2000)]  # the b"\n" between files: no document
    rows = per_document(nats, gaps)
    between = nats[699] + nats[1499]
    assert math.isclose(sum(d["nats"] for d in rows) + between, total, rel_tol=1e-12)
    summary = summary_rows({"3-gram": nats}, "test", tiling)
    assert [s["document"] for s in summary] == ["", "a.py", "b.py", "c.py"]
    assert summary[0]["bytes"] == 1999 and math.isclose(summary[0]["bpb"], total / 1999 / math.log(2))
    with pytest.raises(ConfigError, match="'b.py': starts at 600, before the previous one ends"):
        per_document(nats, [("a.py", 0, 700), ("b.py", 600, 800)])
    with pytest.raises(ConfigError, match=r"'z': \[10, 2001\) is not within the split's 2000 bytes"):
        per_document(nats, [("z", 10, 2001)])


# ---- the command ------------------------------------------------------------------------------------------------
def test_command_prints_and_writes_the_rows(small_corpus, tmp_path, capsys):
    out = tmp_path / "refs.csv"
    assert main(["--path", str(small_corpus), "--orders", "1,4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4-gram: fitted on" in printed and f"wrote {out}" in printed
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [r["model"] for r in rows] == ["unigram", "4-gram"]
    from linrope.data.bytes import load_corpus

    n = len(load_corpus(str(small_corpus), context=1)["test"]) - 1
    assert all(int(r["bytes"]) == n and r["split"] == "test" and r["document"] == "" for r in rows)
    bpb = [float(r["bpb"]) for r in rows]
    assert bpb[1] < bpb[0] and all(f"{b:.4f}" in printed for b in bpb)
    assert math.isclose(float(rows[0]["nats"]) / n / math.log(2), bpb[0], rel_tol=1e-12)
    with pytest.raises(SystemExit) as e:
        main(["--orders", "1,x"])
    assert e.value.code == 2 and "orders are integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--orders" in capsys.readouterr().out
    # an existing table is never written over, and options that would be ignored are refused, before any work
    for args, why in (
        (["--out", str(out)], f"--out {out} exists (an earlier table)"),
        (["--length", "0"], "--length 0: expected a window of at least 1 byte"),
        (["--stride", "5"], "--stride moves the windows of --length: give --length too"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["--path", str(small_corpus), *args])
        assert e.value.code == 2 and why in capsys.readouterr().err
    assert [r["model"] for r in csv.DictReader(out.open())] == ["unigram", "4-gram"]


@pytest.mark.slow
def test_stdlib_corpus_five_gram_beats_the_unigram_on_test():
    from linrope.data.bytes import load_corpus

    splits = load_corpus(None, context=128)
    t0 = time.perf_counter()
    scores = reference_scores(splits, "test", orders=(1, 5), log=print)
    seconds = time.perf_counter() - t0
    bpb = {k: v.mean() / math.log(2) for k, v in scores.items()}
    print(f"test bpb {bpb} over {len(splits['test']) - 1} bytes; fit + score {seconds:.1f} s")
    assert all(len(v) == len(splits["test"]) - 1 and np.isfinite(v).all() for v in scores.values())
    assert bpb["5-gram"] < bpb["unigram"] and seconds < 60


def test_the_ngram_scored_through_a_rows_windows_sees_no_more_than_the_model():
    """A reference row scored like a model row: at the first byte of each non-overlapping window the 5-gram has one
    byte of context (the window's first), as the model has; sliding windows with at least 4 bytes before each scored
    byte (after the first window) give the whole-split scores there; the unigram is the same on every row."""
    from linrope.data.windows import window_context
    from linrope.evaluation.references import fitted, window_rows

    r = rng("windows")
    train, test = markov_text(r, 20000), markov_text(r, 4001)
    models = fitted(train, (1, 5))
    gram = models[1]
    whole = gram.nll(test)
    cut = gram.nll(test, window_context(16, 16, 4000))
    for t in (17, 33, 49):  # the first byte of a window: one byte of context
        one = gram.nll_next(np.array([test[t - 1]], np.uint64), np.array([1]), np.array([test[t]]))
        assert cut[t - 1] == pytest.approx(one[0]) and cut[t - 1] != pytest.approx(whole[t - 1])
    assert np.allclose(cut[np.r_[3:16, 20:32]], whole[np.r_[3:16, 20:32]])  # 4 bytes or more: the same
    rows = window_rows(models, test, "test", [("windows", 16, 16, None), ("sliding", 16, 8, None), WHOLE])
    bpb = {(row["model"], row["protocol"]): row["bpb"] for row in rows}
    assert bpb[("5-gram", "sliding")] == pytest.approx(bpb[("5-gram", "split")], abs=1e-3)  # all but 3 bytes alike
    assert bpb[("5-gram", "windows")] != pytest.approx(bpb[("5-gram", "split")], abs=1e-3)
    assert bpb[("unigram", "windows")] == bpb[("unigram", "sliding")] == bpb[("unigram", "split")]
    assert {row["bytes"] for row in rows} == {4000}
