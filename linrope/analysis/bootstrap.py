"""Intervals that vary both sources of a study's noise: the training seed and the test documents (in clusters).

The method, its reasons and its checks: docs/methods.md, "Uncertainty" and "How precisely a p is printed".  The
input is ``{config: {seed: {document: (numerator, denominator)}}}`` (nats and bytes; correct and count), every run
scoring the same documents with the same denominators (both checked); ``clusters``, {document: cluster}
(linrope.analysis.clusters), makes clusters the units drawn.  ``method="t"`` (the default): ``value ± t · se`` with
Welch–Satterthwaite's df; ``method="percentile"``: the replicates' percentile interval, kept to compare with.  Every
draw comes from ``numpy.random.default_rng(seed)``.  Failed or stalled seeds are no input here: count them first
(linrope.analysis.seed_outcomes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from linrope.analysis.stats import LEVEL, t_quantile, t_two_sided
from linrope.base.errors import ResultsError, first_names

LN2 = math.log(2.0)
RESAMPLES = 10_000
METHODS = ("t", "percentile")
_BLOCK = 4_000_000  # replicates × documents × runs' sums per block of draws (32 MB of float64)

Cells = Mapping[Hashable, Mapping[Hashable, Mapping[Hashable, Tuple[float, float]]]]


@dataclass(frozen=True)
class Estimate:
    """A configuration's mean (``what`` = "A") or a difference A − B, with its interval at ``level``.

    ``lo``/``hi``/``p`` are None without an interval (a configuration with fewer than 2 seeds); ``p`` is None for
    a single configuration (no null value to test).  ``replicates`` are the two-way bootstrap's values of the
    statistic; ``se`` and ``df`` the t interval's (see the module's docstring)."""

    what: str
    value: float
    level: float
    lo: Optional[float]
    hi: Optional[float]
    p: Optional[float]
    method: str
    se: Optional[float]
    df: Optional[float]
    seeds: Tuple[int, ...]  # seeds behind each configuration (A, or A and B)
    documents: int
    paired: bool
    resamples: int
    replicates: np.ndarray = field(repr=False, compare=False)
    clusters: Optional[int] = None  # the document clusters resampled (None: as many as documents)

    @property
    def p_floor(self) -> float:
        """The smallest p printed as a number (the module's docstring): max(10/B, 1/N), up to a power of ten."""
        groups = self.seeds[:1] if self.paired else self.seeds
        return p_floor(self.resamples, groups, self.documents if self.clusters is None else self.clusters)

    def interval(self, level: float) -> Tuple[Optional[float], Optional[float]]:
        """(lo, hi) at another level, by the same method (a family-wise level for linrope.analysis.multiplicity)."""
        if self.lo is None:
            return None, None
        return _interval(self.method, self.value, self.se, self.df, self.replicates, level)

    def excludes_zero(self) -> bool:
        return self.lo is not None and (self.lo > 0.0 or self.hi < 0.0)


def p_floor(resamples: Optional[int], seed_groups: Iterable[int], clusters: int = 1) -> float:
    """``max(10 / B, 1 / N)`` rounded up to a power of ten: B ``resamples`` (None: no replicates, a closed form),
    N = Π C(2s − 1, s) over the groups of seeds drawn together (one group when paired) × C(2c − 1, c) for c clusters,
    the distinct resamples of the design."""
    log_n = sum(_log10_comb(2 * s - 1, s) for s in seed_groups) + _log10_comb(2 * clusters - 1, clusters)
    floor = max(10.0 / resamples if resamples else 0.0, 10.0**-log_n)
    return 10.0 ** math.ceil(math.log10(floor) - 1e-9) if floor > 0 else 0.0


def _log10_comb(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(10.0) if n > 0 else 0.0


# ---- input -------------------------------------------------------------------------------------------------------
def _key(x: Hashable) -> Tuple[str, str]:
    return (type(x).__name__, str(x))


@dataclass(frozen=True)
class _Config:
    name: Hashable
    seeds: Tuple[Hashable, ...]
    num: np.ndarray  # seeds × documents
    den: np.ndarray


def _config(data: Cells, name: Hashable, docs: Optional[Tuple[Hashable, ...]]) -> _Config:
    if name not in data:
        raise ResultsError(f"no results for configuration {name!r}; there are {first_names(map(str, data), 8)}")
    runs = data[name]
    if not runs:
        raise ResultsError(f"configuration {name!r} has no seed")
    seeds = tuple(sorted(runs, key=_key))
    if docs is None:
        docs = tuple(sorted(runs[seeds[0]], key=_key))
        if not docs:
            raise ResultsError(f"configuration {name!r} seed {seeds[0]!r} scored no document")
    num = np.empty((len(seeds), len(docs)))
    den = np.empty((len(seeds), len(docs)))
    for i, seed in enumerate(seeds):
        cells = runs[seed]
        if set(cells) != set(docs):
            extra, lacking = set(cells) - set(docs), set(docs) - set(cells)
            what = f"lacks {first_names(sorted(map(str, lacking)))}" if lacking else ""
            what += ("; " if what else "") + (f"has {first_names(sorted(map(str, extra)))} besides" if extra else "")
            raise ResultsError(
                f"{name!r} seed {seed!r} did not score the documents the others did: it {what} (every run must "
                f"score the same test text)"
            )
        for j, doc in enumerate(docs):
            try:
                n, d = (float(x) for x in cells[doc])
            except (TypeError, ValueError):
                raise ResultsError(
                    f"{name!r} seed {seed!r} document {doc!r}: expected (numerator, denominator), got {cells[doc]!r}"
                ) from None
            if not (math.isfinite(n) and math.isfinite(d) and d > 0):
                raise ResultsError(
                    f"{name!r} seed {seed!r} document {doc!r}: ({n}, {d}) is not a finite numerator over a "
                    f"positive denominator (a failed run is counted by linrope.analysis.seed_outcomes, not resampled)"
                )
            num[i, j], den[i, j] = n, d
    return _Config(name, seeds, num, den)


def _same_text(configs: Sequence[_Config], docs: Sequence[Hashable]) -> None:
    """A document's denominator (its bytes, its examples) is the same in every run."""
    ref = configs[0].den[0]
    for c in configs:
        for i, row in enumerate(c.den):
            j = np.flatnonzero(row != ref)
            if j.size:
                k = int(j[0])
                raise ResultsError(
                    f"document {docs[k]!r} has denominator {row[k]:g} in {c.name!r} seed {c.seeds[i]!r} but "
                    f"{ref[k]:g} in {configs[0].name!r} seed {configs[0].seeds[0]!r}: not the same test text"
                )


# ---- the bootstrap -----------------------------------------------------------------------------------------------
def _counts(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    """``r`` draws of n items from n with replacement, as counts (r × n; each row multinomial(n, 1/n))."""
    idx = rng.integers(0, n, size=(r, n)) + n * np.arange(r)[:, None]
    return np.bincount(idx.ravel(), minlength=r * n).reshape(r, n).astype(float)


def _replicates(
    arms: Sequence[Tuple[float, int, np.ndarray, np.ndarray]],
    sizes: Sequence[int],
    n_docs: int,
    resample: Sequence[int],
    docs: bool,
    resamples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """The statistic Σ coef · mean over seeds of Σ w·num / Σ w·den, ``resamples`` times: seed groups in
    ``resample`` (indices into ``sizes``) and, if ``docs``, the documents drawn with replacement as counts."""
    out = np.empty(resamples)
    parts = [m for _, _, num, den in arms for m in (num, den)]  # every arm's num and den: one matmul
    rows, cut = np.concatenate(parts), np.cumsum([0] + [m.shape[0] for m in parts])
    fixed = rows.sum(1)
    rows_t = np.ascontiguousarray(rows.T)  # documents × rows
    block = max(1, _BLOCK // (max(n_docs, max(sizes)) * rows.shape[0]))
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        # the drawn documents' sums (= multinomial counts as weights; a gather, not BLAS, whose threads cost more
        # than they save on products this small)
        sums = (
            rows_t[rng.integers(0, n_docs, size=(r, n_docs))].sum(1)
            if docs
            else np.broadcast_to(fixed, (r, len(fixed)))
        )
        w = [_counts(rng, s, r) if g in resample else None for g, s in enumerate(sizes)]
        total = np.zeros(r)
        for i, (coef, g, _, _) in enumerate(arms):
            ratio = sums[:, cut[2 * i] : cut[2 * i + 1]] / sums[:, cut[2 * i + 1] : cut[2 * i + 2]]
            total += coef * (ratio.mean(1) if w[g] is None else (w[g] * ratio).sum(1) / sizes[g])
        out[start : start + r] = total
    return out


def _interval(method, value, se, df, replicates, level) -> Tuple[float, float]:
    if not 0.0 < level < 1.0:
        raise ResultsError(f"a confidence level is between 0 and 1, got {level}")
    if method == "percentile":
        lo, hi = np.quantile(replicates, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
        return float(lo), float(hi)
    h = t_quantile(0.5 + level / 2.0, df) * se if se > 0 else 0.0
    return value - h, value + h


def _p(method: str, value: float, se: float, df: float, replicates: np.ndarray) -> float:
    if method == "percentile":
        tail = min(np.count_nonzero(replicates <= 0.0), np.count_nonzero(replicates >= 0.0))
        return float(min(1.0, 2.0 * (tail + 1) / (replicates.size + 1)))
    if se == 0.0:  # every replicate the same: nothing to test against
        return 1.0 if value == 0.0 else 0.0
    return t_two_sided(value / se, df)


def _grouped(configs: Sequence[_Config], docs: Sequence[Hashable], clusters: Mapping[Hashable, Hashable]) -> int:
    """Sum each configuration's documents by cluster in place (``num``/``den``: seeds × clusters, clusters in the
    order of their first document); returns the number of clusters."""
    missing = [d for d in docs if d not in clusters]
    if missing:
        raise ResultsError(
            f"clusters: no cluster for {len(missing)} of the {len(docs)} documents scored "
            f"({first_names(sorted(map(str, missing)))}): give every scored document its cluster"
        )
    order: Dict[Hashable, int] = {}
    index = np.array([order.setdefault(clusters[d], len(order)) for d in docs])
    member = np.zeros((len(docs), len(order)))
    member[np.arange(len(docs)), index] = 1.0
    for i, c in enumerate(configs):
        configs[i] = _Config(c.name, c.seeds, c.num @ member, c.den @ member)
    return len(order)


def _estimate(
    data: Cells,
    names: Sequence[Hashable],
    *,
    scale: float = 1.0,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
    paired: Optional[bool] = None,
    method: str = "t",
    clusters: Optional[Mapping[Hashable, Hashable]] = None,
) -> Estimate:
    """``scale`` · (mean over seeds of Σ numerator / Σ denominator over documents) of one configuration, or of A − B,
    resampling seeds and document clusters.  ``paired``: None pairs the seeds when both configurations ran the same
    ones; True insists (one line otherwise); False draws each configuration's seeds on their own.  ``clusters``:
    {document: cluster} (every scored document; None: each document its own).  Accuracy: ``(correct, count)``."""
    if method not in METHODS:
        raise ResultsError(f"method {method!r}: it takes {', '.join(METHODS)}")
    if not 0.0 < level < 1.0:
        raise ResultsError(f"a confidence level is between 0 and 1, got {level}")
    if int(resamples) < 100:
        raise ResultsError(f"resamples={resamples}: at least 100 (default {RESAMPLES})")
    first = _config(data, names[0], None)
    docs = tuple(sorted(data[names[0]][first.seeds[0]], key=_key))
    configs = [first] + [_config(data, n, docs) for n in names[1:]]
    _same_text(configs, docs)
    n_docs = len(docs) if clusters is None else _grouped(configs, docs, clusters)  # the units the bootstrap draws
    same_seeds = len(configs) == 2 and set(configs[0].seeds) == set(configs[1].seeds)
    if paired and not same_seeds and len(configs) == 2:
        a, b = configs
        raise ResultsError(
            f"paired=True, but {a.name!r} ran seeds {first_names(map(str, a.seeds))} and {b.name!r} "
            f"{first_names(map(str, b.seeds))}: pair them on the seeds both ran, or pass paired=False"
        )
    is_paired = len(configs) == 2 and same_seeds and paired is not False
    groups = [0, 0] if is_paired else list(range(len(configs)))
    sizes = [len(c.seeds) for c in configs][: max(groups) + 1]
    coefs = (1.0, -1.0)[: len(configs)]
    arms = [(scale * k, g, c.num, c.den) for k, g, c in zip(coefs, groups, configs)]
    value = float(sum(k * np.mean(c.num.sum(1) / c.den.sum(1)) for k, c in zip(coefs, configs)) * scale)
    what = " − ".join(map(str, names))
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)]
    replicates = _replicates(arms, sizes, n_docs, range(len(sizes)), True, resamples, streams[0])
    seeds = tuple(len(c.seeds) for c in configs)
    common = dict(
        seeds=seeds,
        documents=len(docs),
        paired=is_paired,
        resamples=int(resamples),
        replicates=replicates,
        clusters=None if clusters is None else n_docs,
    )
    if min(seeds) < 2:  # one seed says nothing of training noise: no interval, as linrope.analysis.stats
        return Estimate(what, value, level, None, None, None, method, None, None, **common)
    levels: List[Tuple[float, int]] = []  # (bootstrap variance resampling one level only, its count)
    for g, s in enumerate(sizes):  # linear in the seed weights: the bootstrap's variance in closed form
        per_seed = sum(k * c.num.sum(1) / c.den.sum(1) for k, gg, c in zip(coefs, groups, configs) if gg == g)
        levels.append((float(np.var(scale * per_seed)) / s, s))
    if n_docs > 1:  # a ratio of document sums: drawn
        levels.append((float(np.var(_replicates(arms, sizes, n_docs, [], True, resamples, streams[1]))), n_docs))
    parts = [v * n / (n - 1) for v, n in levels]
    var = sum(parts)
    se = math.sqrt(var)
    df = var * var / sum(u * u / (n - 1) for u, (_, n) in zip(parts, levels)) if var > 0 else float(sum(seeds) - 1)
    lo, hi = _interval(method, value, se, df, replicates, level)
    p = _p(method, value, se, df, replicates) if len(configs) == 2 else None
    return Estimate(what, value, level, lo, hi, p, method, se, df, **common)


# ---- the public functions ----------------------------------------------------------------------------------------
def ratio_difference(data: Cells, a: Hashable, b: Hashable, **kw) -> Estimate:
    """A − B; keywords (scale, level, resamples, seed, paired, method, clusters): ``_estimate``."""
    return _estimate(data, (a, b), **kw)


def ratio_mean(data: Cells, config: Hashable, **kw) -> Estimate:
    """One configuration's mean with its interval; keywords as ``ratio_difference`` but ``paired``."""
    return _estimate(data, (config,), paired=None, **kw)


def bpb_difference(data: Cells, a: Hashable, b: Hashable, **kw) -> Estimate:
    """A − B in bits per byte from ``{config: {seed: {document: (nats, bytes)}}}`` (see ``ratio_difference``;
    ``clusters=`` {document: cluster} resamples clusters of documents)."""
    return ratio_difference(data, a, b, scale=1.0 / LN2, **kw)


def shared_bpb_difference(cells: Cells, a: Hashable, b: Hashable, **kw) -> Tuple[List[Hashable], Optional[Estimate]]:
    """(the seeds A and B both ran in ``cells``, ``bpb_difference`` paired over those seeds; None below two): the
    comparison a report makes of a claim (linrope.analysis.report.claims, linrope.analysis.evidence)."""
    shared = sorted(set(cells[a]) & set(cells[b]), key=str)
    if len(shared) < 2:
        return shared, None
    data = {c: {s: cells[c][s] for s in shared} for c in (a, b)}
    return shared, bpb_difference(data, a, b, **kw)


def bpb_mean(data: Cells, config: Hashable, **kw) -> Estimate:
    """A configuration's bits per byte (mean over seeds of Σ nats / Σ bytes / ln 2), resampling seeds and document
    clusters."""
    return ratio_mean(data, config, scale=1.0 / LN2, **kw)


def _seed_cells(values: Mapping[Hashable, Mapping[Hashable, float]]) -> Dict[Hashable, Dict[Hashable, Dict]]:
    return {c: {s: {"all": (v, 1.0)} for s, v in seeds.items()} for c, seeds in values.items()}


def seed_difference(values: Mapping[Hashable, Mapping[Hashable, float]], a: Hashable, b: Hashable, **kw) -> Estimate:
    """A − B from one value per seed, ``{config: {seed: value}}`` (no documents: seeds alone are resampled)."""
    return ratio_difference(_seed_cells(values), a, b, **kw)


def seed_mean(values: Mapping[Hashable, Mapping[Hashable, float]], config: Hashable, **kw) -> Estimate:
    """A configuration's mean from one value per seed, with its interval over seeds."""
    return ratio_mean(_seed_cells(values), config, **kw)
