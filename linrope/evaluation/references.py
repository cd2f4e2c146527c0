"""Reference rows: byte models fitted on the train split, scored per byte on another split.

A trained model's bpb means little alone: a collapsed model still gets a number.  These models say where the floor
is (docs/methods.md, "Reference rows").  Each is fitted on the **train** split and scores the targets at offsets
1 … n of another split: entry t − 1 of the returned float64 array is −ln p(byte t | the bytes before it), in nats,
the loss the trained models pay there.  A split is the corpus loader's (``linrope.data.bytes.load_corpus``): its
files joined with ``b"\\n"``, so a context reaches across a file boundary as a model's window does.  **Scored as a
model row** (``window_rows``): ``nll``'s ``context`` cuts each target's context to what the row's window holds
before it (``linrope.data.windows``, the definition the models' rows read), so the first byte of a
non-overlapping window has one byte of context, as the model has.

* **unigram** — add-one smoothed byte frequencies of the train split: p(w) = (c(w) + 1) / (N + 256).
  A row worse than this has collapsed.
* **n-gram** (``"5-gram"``: order 5, four bytes of context) — interpolated modified Kneser–Ney (Chen &
  Goodman 1999), down to the uniform distribution over the 256 bytes.  At level k = n … 1, with h the last
  k − 1 bytes of the context and h′ = h without its first byte::

      p_k(w | h) = max(a_k(hw) − D_k(a_k(hw)), 0) / T_k(h) + γ_k(h) · p_{k−1}(w | h′),      p_0(w) = 1/256
      T_k(h) = Σ_w a_k(hw),     γ_k(h) = (D_k1·N1(h) + D_k2·N2(h) + D_k3·N3+(h)) / T_k(h)

  where N_j(h) counts the bytes w with a_k(hw) = j (3+: at least 3), D_k(0) = 0 and D_k(a) = D_k{min(a, 3)}.
  A context with T_k(h) = 0 (never seen, or shorter than k − 1 bytes at the start of a split) passes
  p_{k−1} through.  a_n is the count of each n-gram in the train split; below it a_k(g) is the continuation
  count: the number of distinct bytes v with v·g one of the (k+1)-grams — the distinct n-grams of the train
  split, then their suffixes level by level.  The discounts come from each level's counts of counts n_1 … n_4:
  Y = n_1/(n_1 + 2n_2), D_1 = 1 − 2Y·n_2/n_1, D_2 = 2 − 3Y·n_3/n_2, D_3 = 3 − 4Y·n_4/n_3; one that cannot be
  estimated (a count of counts is 0: tiny corpora) is taken as 0.75, and each is clipped to [0.1, j], so
  D_k(a) ≤ a (no negative mass) and every seen context leaves mass to the level below.  Each level is then a
  distribution, and so is p_n: the probabilities over the 256 bytes sum to 1 at every context (tested).

Fitting is numpy throughout: every n-gram of the train split packed into one uint64 key (first byte most
significant), sorted once; each lower level from the suffixes of the level above; a query is a
``searchsorted`` per level.  The stdlib corpus's 11 MB train split fits a 5-gram in seconds.

``python -m linrope.evaluation.references`` prints and writes the bpb of each model on a split.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from linrope.base.csv_files import write_rows
from linrope.base.errors import ConfigError

LN2 = math.log(2.0)  # bits per byte = nats per byte / LN2 (as linrope.data.bytes, which imports torch)
MAX_ORDER = 8  # an n-gram is packed into one uint64 key
UNCOUNTED_DISCOUNT = 0.75  # a discount whose counts of counts are 0 (Kneser–Ney's customary single discount)
MIN_DISCOUNT = 0.1  # every seen context leaves at least this much of each count to the level below
COLUMNS = ["model", "split", "protocol", "length", "stride", "window", "document", "bytes", "nats", "bpb"]
WHOLE = ("split", None, None, None)  # a row of no windows: each byte with every byte of the split before it


def _as_bytes(text, what: str) -> np.ndarray:
    arr = np.frombuffer(text, dtype=np.uint8) if isinstance(text, (bytes, bytearray)) else np.asarray(text)
    if arr.ndim != 1 or arr.dtype != np.uint8:
        raise ConfigError(f"{what}: expected bytes or a 1-D uint8 array, got {arr.dtype} of shape {arr.shape}")
    return arr


def _runs(sorted_keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The distinct values of a sorted array, their first indices and how often each occurs."""
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    return starts, np.diff(np.append(starts, len(sorted_keys)))


def _mask(k: int) -> np.uint64:
    """The bits of the last k bytes of a key."""
    return np.uint64((1 << (8 * k)) - 1)


def pack_windows(text: np.ndarray, k: int) -> np.ndarray:
    """The k bytes starting at each offset 0 … len − k as one uint64 each, the first byte most significant."""
    n = max(len(text) - k + 1, 0)
    key = np.zeros(n, np.uint64)
    for j in range(k):
        key <<= np.uint64(8)
        key |= text[j : j + n]
    return key


def contexts_of(text: np.ndarray, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """For each target offset t = 1 … len − 1: the last ``width`` bytes before t packed into a uint64 (byte
    t − 1 least significant) and how many of them there are (min(t, width))."""
    m = len(text) - 1
    ctx = np.zeros(max(m, 0), np.uint64)
    for j in range(1, min(width, m) + 1):
        ctx[j - 1 :] |= text[: m - j + 1].astype(np.uint64) << np.uint64(8 * (j - 1))
    return ctx, np.minimum(np.arange(1, m + 1), width)


def discounts(counts: np.ndarray) -> np.ndarray:
    """[0, D_1, D_2, D_3+] of one level from its counts of counts (Chen & Goodman 1999; see the module)."""
    n1, n2, n3, n4 = (float(v) for v in np.bincount(np.minimum(counts, 5), minlength=6)[1:5])
    y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else math.nan
    out = [0.0]
    for j, (a, b) in enumerate(((n1, n2), (n2, n3), (n3, n4)), start=1):  # D_j = j − (j + 1)·Y·n_{j+1}/n_j
        d = j - (j + 1) * y * b / a if a > 0 else math.nan
        out.append(min(max(d if math.isfinite(d) else UNCOUNTED_DISCOUNT, MIN_DISCOUNT), float(j)))
    return np.array(out)


class _Level:
    """One level of the Kneser–Ney model: its k-grams (sorted keys) with their counts, and per context (the
    k-gram without its last byte) the total count and the weight γ of the level below."""

    def __init__(self, keys: np.ndarray, counts: np.ndarray):
        self.keys, self.counts = keys, counts.astype(np.int64)
        self.discount = discounts(self.counts)
        ctx = keys >> np.uint64(8)
        starts, _ = _runs(ctx)
        self.contexts = ctx[starts]
        self.total = np.add.reduceat(self.counts, starts).astype(np.float64)
        capped = np.minimum(self.counts, 3)
        mass = np.add.reduceat(self.discount[capped], starts)  # Σ_j D_j N_j(h)
        self.gamma = mass / self.total

    def prob(self, key: np.ndarray, lower: np.ndarray, use: np.ndarray) -> np.ndarray:
        """p_k(w | h) for the k-grams ``key`` = h·w given p_{k−1}(w | h′) (``lower``); where ``use`` is false
        (the context is shorter than k − 1 bytes) or h was never seen, ``lower`` itself."""
        ctx = key >> np.uint64(8)
        j = np.minimum(np.searchsorted(self.contexts, ctx), len(self.contexts) - 1)
        seen = use & (self.contexts[j] == ctx)
        i = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        a = np.where(self.keys[i] == key, self.counts[i], 0)
        higher = np.maximum(a - self.discount[np.minimum(a, 3)], 0.0) / self.total[j]
        return np.where(seen, higher + self.gamma[j] * lower, lower)


class Unigram:
    """Add-``alpha`` smoothed byte frequencies (alpha = 1: add-one, Laplace)."""

    order = 1

    def __init__(self, alpha: float = 1.0):
        if not alpha > 0:
            raise ConfigError(f"unigram alpha={alpha}: must be > 0 (every byte needs a probability)")
        self.alpha, self.probs = float(alpha), None
        self.name = "unigram"

    def fit(self, train) -> "Unigram":
        train = _as_bytes(train, "unigram: the train split")
        counts = np.bincount(train, minlength=256).astype(np.float64)
        self.probs = (counts + self.alpha) / (len(train) + 256 * self.alpha)
        return self

    def nll(self, text, context: Optional[np.ndarray] = None) -> np.ndarray:
        """−ln p of the bytes at offsets 1 … len − 1, in nats (float64); ``context`` is not read."""
        text = _as_bytes(text, "unigram: the scored split")
        return -np.log(self.probs)[text[1:]]

    def distribution(self, context: bytes = b"") -> np.ndarray:
        """p(w | context) for w = 0 … 255 (the context is not read)."""
        return self.probs.copy()


class KneserNey:
    """Interpolated modified Kneser–Ney byte model of order n (n − 1 bytes of context); see the module."""

    def __init__(self, order: int = 5):
        if not (isinstance(order, (int, np.integer)) and 1 <= order <= MAX_ORDER):
            raise ConfigError(f"n-gram order {order!r}: must be an integer from 1 to {MAX_ORDER}")
        self.order, self.levels = int(order), []
        self.name = f"{self.order}-gram"

    def fit(self, train) -> "KneserNey":
        train = _as_bytes(train, f"{self.name}: the train split")
        if len(train) < self.order:
            raise ConfigError(f"{self.name}: the train split has {len(train)} bytes, fewer than one {self.name}")
        grams, counts = np.unique(pack_windows(train, self.order), return_counts=True)
        levels = [_Level(grams, counts)]  # level n: raw counts
        for k in range(self.order - 1, 0, -1):  # level k: distinct left extensions among the (k+1)-grams
            grams, counts = np.unique(grams & _mask(k), return_counts=True)
            levels.append(_Level(grams, counts))
        self.levels = levels[::-1]  # levels[k - 1] is level k
        return self

    def nll_next(self, contexts: np.ndarray, lengths: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """−ln p(target | context) in nats: ``contexts`` uint64 (the byte just before the target least
        significant), ``lengths`` how many of its bytes are context (0 … n − 1), ``targets`` the bytes."""
        if not self.levels:
            raise RuntimeError(f"{self.name}: fit it on the train split before scoring")
        tgt = np.asarray(targets).astype(np.uint64)
        contexts, lengths = np.asarray(contexts, np.uint64), np.asarray(lengths)
        p = np.full(len(tgt), 1.0 / 256)
        for k, level in enumerate(self.levels, start=1):
            key = ((contexts & _mask(k - 1)) << np.uint64(8)) | tgt
            p = level.prob(key, p, lengths >= k - 1)
        return -np.log(p)

    def nll(self, text, context: Optional[np.ndarray] = None) -> np.ndarray:
        """−ln p of the bytes at offsets 1 … len − 1 given the (up to n − 1) bytes before each, in nats; with
        ``context`` (entry t − 1: how many bytes before offset t the scoring window holds, as
        ``linrope.data.windows.scored_context`` gives them) no more than that many."""
        text = _as_bytes(text, f"{self.name}: the scored split")
        ctx, lengths = contexts_of(text, self.order - 1)
        if context is not None:
            lengths = np.minimum(lengths, np.maximum(np.asarray(context), 0))
        return self.nll_next(ctx, lengths, text[1:])

    def distribution(self, context: bytes = b"") -> np.ndarray:
        """p(w | context) for w = 0 … 255; only the last n − 1 bytes of ``context`` are read."""
        tail = bytes(context)[len(context) - (self.order - 1) :] if self.order > 1 else b""
        packed = np.uint64(int.from_bytes(tail, "big")) if tail else np.uint64(0)
        w = np.arange(256)
        return np.exp(-self.nll_next(np.full(256, packed), np.full(256, len(tail)), w))


def model(order: int):
    """Order 1: the add-one unigram; order n ≥ 2: the interpolated modified Kneser–Ney n-gram."""
    return Unigram() if order == 1 else KneserNey(order)


def fitted(train, orders: Sequence[int] = (1, 5), log: Optional[Callable[[str], None]] = None) -> list:
    """Each model (``model(order)``) fitted on the train split ``train``; ``log`` gets a line per model."""
    if not orders:
        raise ConfigError("orders: name at least one model (1: the unigram, n ≥ 2: the n-gram)")
    out = []
    for order in orders:
        t0 = time.perf_counter()
        out.append(model(order).fit(train))
        if log:
            log(f"{out[-1].name}: fitted on {len(train):,} train bytes in {time.perf_counter() - t0:.1f} s")
    return out


def reference_scores(
    splits: Mapping[str, np.ndarray],
    split: str = "test",
    orders: Sequence[int] = (1, 5),
    log: Optional[Callable[[str], None]] = None,
    context: Optional[np.ndarray] = None,
) -> Dict[str, np.ndarray]:
    """{model name: per-byte nats on ``split``}, each model (``model(order)``) fitted on ``splits["train"]``;
    ``splits`` as ``linrope.data.bytes.load_corpus`` returns them; ``context`` (as ``nll``'s): the bytes each
    target may see, else every byte before it.  ``log`` gets a progress line per model."""
    for s in ("train", split):
        if s not in splits:
            raise ConfigError(f"split {s!r}: not among the corpus's splits ({', '.join(splits)})")
    text = splits[split]
    if len(text) < 2:
        raise ConfigError(f"the {split} split has {len(text)} bytes: nothing to score")
    out = {}
    for m in fitted(splits["train"], orders, log):
        t0 = time.perf_counter()
        out[m.name] = m.nll(text, context)
        if log:
            log(f"{m.name}: scored {len(text) - 1:,} {split} bytes in {time.perf_counter() - t0:.1f} s")
    return out


def window_rows(
    models: Sequence,
    text: np.ndarray,
    split: str,
    rows: Sequence[Tuple[str, int, int, Optional[int]]],
    parts: Optional[Sequence[tuple]] = None,
    documents: Optional[Sequence[Tuple[str, int, int]]] = None,
) -> List[Dict]:
    """The CSV rows (``COLUMNS``) of fitted ``models`` scored as each model row ``(protocol, length, stride,
    window)`` scores ``text`` (``WHOLE``: no windows): the same windows over the same stretches ``parts``
    (default: the whole split), so each target sees no more bytes than the row's model saw
    (``linrope.data.windows.scored_context``, the definition ``SlidingWindows`` reads)."""
    from linrope.data.windows import scored_context

    text = _as_bytes(text, f"the {split} split")
    parts = [(0, len(text) - 1)] if parts is None else parts
    out = []
    for row in rows:
        protocol, length, stride, window = row
        context = None if length is None else scored_context(len(text), parts, int(length), int(stride), window)
        scores = {m.name: m.nll(text, context) for m in models}
        out += summary_rows(scores, split, documents, row=row, scored=None if context is None else context >= 0)
    return out


def per_document(
    nats: np.ndarray, documents: Sequence[Tuple[str, int, int]], scored: Optional[np.ndarray] = None
) -> List[Dict]:
    """Per document ``(name, start, end)`` (offsets in the split, end exclusive): the nats of the targets whose
    offset falls in [start, end) and how many there are.  ``nats[t − 1]`` is the target at offset t (as the
    models return), so offset 0, which has no target, counts in no document.  Documents must lie in the split
    and not overlap; the bytes between them (the ``b"\\n"`` that joins files) belong to none.  ``scored``
    (a mask like ``nats``): only those targets count."""
    nats = np.asarray(nats, np.float64)
    n = len(nats)
    kept = np.ones(n, bool) if scored is None else np.asarray(scored, bool)
    nats = np.where(kept, nats, 0.0)
    before = np.concatenate(([0], np.cumsum(kept)))
    rows, last_end = [], 0
    for i, doc in enumerate(documents):
        try:
            name, start, end = doc
            start, end = int(start), int(end)
        except (TypeError, ValueError):
            raise ConfigError(f"document {i}: {doc!r} is not (name, start, end)") from None
        if not 0 <= start <= end <= n + 1:
            raise ConfigError(f"document {name!r}: [{start}, {end}) is not within the split's {n + 1} bytes")
        if start < last_end:
            raise ConfigError(f"document {name!r}: starts at {start}, before the previous one ends ({last_end})")
        last_end = end
        lo, hi = max(start, 1), max(end, 1)
        counted = {"bytes": int(before[hi - 1] - before[lo - 1]), "nats": float(nats[lo - 1 : hi - 1].sum())}
        rows.append({"document": str(name), "start": start, "end": end, **counted})
    return rows


def bpb(nats: float, count: int) -> float:
    return nats / count / LN2 if count else math.nan


def summary_rows(
    scores: Mapping[str, np.ndarray],
    split: str,
    documents: Optional[Sequence[Tuple[str, int, int]]] = None,
    row: Tuple = WHOLE,
    scored: Optional[np.ndarray] = None,
) -> List[Dict]:
    """The rows of the CSV (``COLUMNS``): per model the whole split (``document`` empty), then, with
    ``documents``, one row per document; ``row``: the model row ``(protocol, length, stride, window)`` they were
    scored as (``WHOLE``: no windows), ``scored``: the targets it scored (default all)."""
    where = dict(zip(("protocol", "length", "stride", "window"), row))
    rows = []
    for name, nats in scores.items():
        kept = np.ones(len(nats), bool) if scored is None else np.asarray(scored, bool)
        total = float(np.sum(nats[kept]))
        rows.append({"model": name, "split": split, **where, "document": "", "bytes": int(kept.sum()), "nats": total})
        for d in per_document(nats, documents, kept) if documents is not None else []:
            rows.append({"model": name, "split": split, **where, **{k: d[k] for k in ("document", "bytes", "nats")}})
    for r in rows:
        r["bpb"] = bpb(r["nats"], r["bytes"])
    return rows


def write_csv(rows: Sequence[Dict], path: Path) -> Path:
    """The rows as ``path``, atomically (a float in full, None blank)."""
    return write_rows(rows, COLUMNS, path)


def parse_orders(text: str) -> Tuple[int, ...]:
    try:
        orders = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: orders are integers separated by commas, e.g. 1,5") from None
    bad = [o for o in orders if not 1 <= o <= MAX_ORDER]
    if bad or len(set(orders)) != len(orders):
        raise argparse.ArgumentTypeError(f"{text!r}: each order once, each from 1 (the unigram) to {MAX_ORDER}")
    return orders


def parser() -> argparse.ArgumentParser:
    from linrope.config.command_line import program

    p = argparse.ArgumentParser(
        prog=program("python -m linrope.evaluation.references"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reference rows: byte models fitted on the corpus's train split, scored on another split\n"
        "(every target byte of it, offsets 1..n; with --length, through the windows a model row of that length\n"
        "uses, each byte seeing no more than the model saw).  Order 1 is the add-one unigram (a trained model\n"
        "worse than it has collapsed); order n >= 2 an interpolated modified Kneser-Ney n-gram with n - 1\n"
        "bytes of context.  Prints bits per byte per model and writes a CSV with the columns model, split,\n"
        "protocol, length, stride, window, document, bytes, nats, bpb (document empty: the whole split).  The\n"
        "splits are the training run's: the same path and fractions give the same ones.",
        epilog="examples:\n  python -m linrope.evaluation.references --out references.csv\n"
        "  python -m linrope.evaluation.references --length 128   # as the test of a model trained at 128\n"
        "  python -m linrope.evaluation.references --path my_corpus/ --split val --orders 1,3,5",
    )
    p.add_argument("--path", help="the corpus, as data.path (default: the Python standard library's .py sources)")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="split scored (default test)")
    p.add_argument(
        "--orders",
        type=parse_orders,
        default=(1, 5),
        help="models, comma-separated: 1 = unigram, n = n-gram (default 1,5)",
    )
    p.add_argument(
        "--length",
        type=int,
        help="score through windows of this many bytes, as a model row does "
        "(default: no windows: each byte with the n - 1 bytes before it in the split)",
    )
    p.add_argument("--stride", type=int, help="with --length: the windows move by this much (default: the length)")
    p.add_argument("--out", type=Path, help="CSV to write (default: print only)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="as data.val_fraction (default 0.05)")
    p.add_argument("--test-fraction", type=float, default=0.05, help="as data.test_fraction (default 0.05)")
    p.add_argument("--max-bytes", type=int, help="as data.max_bytes: read at most this many bytes of the corpus")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from linrope.base.errors import LinropeError

    p = parser()
    args = p.parse_args(argv)
    if args.out is not None and args.out.exists():  # before the corpus is read and the models fitted
        p.error(f"--out {args.out} exists (an earlier table): give another file, or delete it")
    if args.length is not None and args.length < 1:
        p.error(f"--length {args.length}: expected a window of at least 1 byte")
    if args.stride is not None and args.length is None:
        p.error("--stride moves the windows of --length: give --length too")
    say = functools.partial(print, flush=True)
    try:
        from linrope.data.bytes import load_corpus  # imports torch: not for the models themselves

        # context=1: the references need no window, any split of 2 bytes can be scored
        splits = load_corpus(
            args.path,
            context=1,
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            max_bytes=args.max_bytes,
        )
        say(f"corpus {args.path or 'stdlib'}: " + ", ".join(f"{s} {len(v):,} bytes" for s, v in splits.items()))
        if args.split == "train":
            say("(scoring the train split: the models were fitted on it, so these are not held-out numbers)")
        if args.length:
            stride = args.stride or args.length
            if not 1 <= stride <= args.length < len(splits[args.split]):
                raise ConfigError(f"--length {args.length} --stride {stride}: need 1 <= stride <= length < the split")
            row = ("windows" if stride == args.length else "sliding", args.length, stride, None)
            rows = window_rows(fitted(splits["train"], args.orders, log=say), splits[args.split], args.split, [row])
        else:
            rows = summary_rows(reference_scores(splits, args.split, args.orders, log=say), args.split)
    except LinropeError as e:
        raise SystemExit(f"linrope.evaluation.references: {e}") from None
    say(f"{'model':<10} {'bytes':>10} {'nats':>14} {'bpb':>8}")
    for r in rows:
        say(f"{r['model']:<10} {r['bytes']:>10} {r['nats']:>14.1f} {r['bpb']:>8.4f}")
    if args.out:
        say(f"wrote {write_csv(rows, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
