"""linrope.analysis.bootstrap: the interval over seeds and documents covers a known difference at its nominal rate
(simulated from a model with seed and document effects), reduces to the paired t-interval with seeds alone, gets
its document variance right in a case with a closed form, gains from pairing, is deterministic under its seed,
is fast, and names bad input in one line."""

import math
import time

import numpy as np
import pytest

from linrope.analysis.bootstrap import (
    LN2,
    bpb_difference,
    bpb_mean,
    p_floor,
    ratio_difference,
    seed_difference,
    seed_mean,
)
from linrope.analysis.stats import P_FLOOR, mean_ci, p_text, paired, t_quantile
from linrope.base.errors import ResultsError


def study(rng, *, seeds=5, docs=40, diff=0.05, seed_sd=0.03, inter_sd=0.08, doc_sd=0.5, cell_sd=0.02, rho=0.5):
    """{config: {seed: {doc: (nats, bytes)}}} from rate = μ_c + u_d + a_cd + s_cs + e_csd nats per byte: u the
    documents' shared difficulty, a how each configuration fares on each document, s the seed's effect
    (correlated ρ between A and B: the same seed's data order), e the rest; documents of random size.  The true
    A − B over seeds and documents is ``diff`` nats per byte (every effect has mean 0, independent of size)."""
    size = rng.integers(500, 5000, docs).astype(float)
    u = rng.normal(0.0, doc_sd, docs)
    sa = rng.normal(0.0, seed_sd, seeds)
    sb = rho * sa + math.sqrt(1.0 - rho * rho) * rng.normal(0.0, seed_sd, seeds)
    data = {}
    for c, mu, s in (("A", 2.0 + diff, sa), ("B", 2.0, sb)):
        a = rng.normal(0.0, inter_sd, docs)
        rate = mu + u + a + s[:, None] + rng.normal(0.0, cell_sd, (seeds, docs))
        data[c] = {k: {f"doc{d}": (rate[k, d] * size[d], size[d]) for d in range(docs)} for k in range(seeds)}
    return data, diff / LN2


# ---- coverage ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "regime,effects",
    [
        ("seeds and documents", dict(seed_sd=0.03, inter_sd=0.08)),
        ("seeds dominate", dict(seed_sd=0.05, inter_sd=0.0)),
    ],
)
def test_the_interval_covers_the_true_difference_at_its_nominal_rate(regime, effects):
    """200 simulated studies of 5 seeds × 20 documents: the 95% interval covers the true difference in 90–98% of
    them.  The percentile interval of the same replicates falls short when seeds dominate (the reason the t
    interval is the default: linrope.analysis.bootstrap's docstring)."""
    rng = np.random.default_rng(2024)
    t_hits = pct_hits = 0
    n = 200
    for i in range(n):
        data, true = study(rng, docs=20, **effects)
        e = bpb_difference(data, "A", "B", resamples=1000, seed=i)
        t_hits += e.lo <= true <= e.hi
        lo, hi = np.quantile(e.replicates, [0.025, 0.975])
        pct_hits += lo <= true <= hi
    assert 0.90 <= t_hits / n <= 0.98, (regime, t_hits / n)
    if regime == "seeds dominate":
        assert pct_hits / n < 0.90 < t_hits / n, (pct_hits / n, t_hits / n)


def test_seeds_alone_give_the_paired_t_interval_exactly():
    a = {1: 2.41, 2: 2.38, 3: 2.47, 4: 2.44, 5: 2.40}
    b = {1: 2.45, 2: 2.39, 3: 2.52, 4: 2.43, 5: 2.46}
    e = seed_difference({"A": a, "B": b}, "A", "B")
    ref = paired(a, b)
    assert (e.lo, e.hi, e.p, e.df) == pytest.approx((ref.diff.lo, ref.diff.hi, ref.p, 4.0), rel=1e-12)
    assert e.value == pytest.approx(ref.diff.mean, rel=1e-12) and e.paired and e.documents == 1
    one = seed_mean({"A": a}, "A")
    iv = mean_ci(list(a.values()))
    assert (one.value, one.lo, one.hi) == pytest.approx((iv.mean, iv.lo, iv.hi), rel=1e-12) and one.p is None


def test_the_document_variance_matches_its_closed_form():
    """With every document the same size, the statistic is linear in the documents' weights too, so the
    standard error has a closed form: se² = var(seed means)/S + var(document means)/D (sample variances)."""
    rng = np.random.default_rng(7)
    S, D = 5, 40
    x = rng.normal(0.0, 0.1, (S, 1)) + rng.normal(0.0, 0.2, (1, D)) + rng.normal(0.0, 0.05, (S, D))
    data = {
        "A": {s: {d: (x[s, d] + 3.0, 1.0) for d in range(D)} for s in range(S)},
        "B": {s: {d: (3.0, 1.0) for d in range(D)} for s in range(S)},
    }
    e = ratio_difference(data, "A", "B", resamples=20_000)
    vs, vd = np.var(x.mean(1), ddof=1) / S, np.var(x.mean(0), ddof=1) / D
    assert e.value == pytest.approx(x.mean(), rel=1e-12)
    assert e.se == pytest.approx(math.sqrt(vs + vd), rel=0.02)
    df = (vs + vd) ** 2 / (vs**2 / (S - 1) + vd**2 / (D - 1))
    assert e.df == pytest.approx(df, rel=0.05)
    assert e.hi - e.value == pytest.approx(t_quantile(0.975, e.df) * e.se, rel=1e-12)


def test_bits_per_byte_are_byte_weighted_over_documents_and_averaged_over_seeds():
    data = {
        "A": {1: {"x": (10.0, 10.0), "y": (30.0, 20.0)}, 2: {"x": (20.0, 10.0), "y": (40.0, 20.0)}},
        "B": {1: {"x": (5.0, 10.0), "y": (10.0, 20.0)}, 2: {"x": (5.0, 10.0), "y": (10.0, 20.0)}},
    }
    a = ((40 / 30) + (60 / 30)) / 2 / LN2
    b = (15 / 30) / LN2
    assert bpb_mean(data, "A").value == pytest.approx(a, rel=1e-12)
    assert bpb_difference(data, "A", "B").value == pytest.approx(a - b, rel=1e-12)


def test_accuracy_from_correct_and_count_per_group_of_queries():
    """Recall: per seed and group of test queries, (correct, count); accuracy is Σ correct / Σ count."""
    rng = np.random.default_rng(13)
    count = rng.integers(20, 60, 30).astype(float)
    data = {
        c: {s: {g: (float(rng.binomial(int(n), p)), n) for g, n in enumerate(count)} for s in range(5)}
        for c, p in (("A", 0.9), ("B", 0.6))
    }
    e = ratio_difference(data, "A", "B")
    acc = {c: np.mean([sum(x for x, _ in r[s].values()) / count.sum() for s in r]) for c, r in data.items()}
    assert e.value == pytest.approx(acc["A"] - acc["B"], rel=1e-12)
    assert e.lo < 0.3 < e.hi and e.p < 1e-6 and e.documents == 30


# ---- pairing -----------------------------------------------------------------------------------------------------
def test_a_shared_document_effect_cancels_in_the_difference():
    """Documents differ a lot in difficulty, equally for A and B: drawn once for both, that difficulty cancels;
    intervals of A and of B drawn apart (combined as √(se_A² + se_B²)) would carry it twice."""
    data, _ = study(np.random.default_rng(3), doc_sd=0.5, inter_sd=0.02, seed_sd=0.01)
    d = bpb_difference(data, "A", "B")
    apart = math.hypot(bpb_mean(data, "A").se, bpb_mean(data, "B").se)
    assert d.se * 5 < apart, (d.se, apart)


def test_a_shared_seed_effect_cancels_when_seeds_are_paired():
    data, _ = study(np.random.default_rng(4), seed_sd=0.1, rho=0.99, inter_sd=0.01)
    together = bpb_difference(data, "A", "B")
    apart = bpb_difference(data, "A", "B", paired=False)
    assert together.paired and not apart.paired
    assert together.value == apart.value
    assert (together.hi - together.lo) * 3 < apart.hi - apart.lo


def test_configurations_with_different_seeds_are_compared_unpaired():
    data, _ = study(np.random.default_rng(5))
    data["B"][7] = data["B"].pop(0)
    e = bpb_difference(data, "A", "B")
    assert not e.paired and e.seeds == (5, 5) and e.lo < e.value < e.hi
    with pytest.raises(ResultsError, match="paired=True, but 'A' ran seeds 0, 1, 2, 3, … 1 more and 'B'"):
        bpb_difference(data, "A", "B", paired=True)


# ---- determinism, speed, methods ---------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_numbers_and_dict_order_does_not_matter():
    data, _ = study(np.random.default_rng(6))
    one, two = bpb_difference(data, "A", "B", seed=11), bpb_difference(data, "A", "B", seed=11)
    assert np.array_equal(one.replicates, two.replicates) and (one.lo, one.hi, one.p) == (two.lo, two.hi, two.p)
    shuffled = {
        c: {s: dict(reversed(list(docs.items()))) for s, docs in reversed(list(r.items()))} for c, r in data.items()
    }
    assert np.array_equal(bpb_difference(shuffled, "A", "B", seed=11).replicates, one.replicates)
    other = bpb_difference(data, "A", "B", seed=12)
    assert not np.array_equal(other.replicates, one.replicates)
    assert other.lo == pytest.approx(one.lo, abs=0.1 * (one.hi - one.lo))  # Monte Carlo error only


def test_ten_thousand_replicates_of_5_seeds_by_40_documents_take_well_under_a_second():
    data, _ = study(np.random.default_rng(8))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        bpb_difference(data, "A", "B", resamples=10_000)
        best = min(best, time.perf_counter() - start)
    assert best < 0.5, best


def test_the_percentile_method_and_its_p_value():
    data, _ = study(np.random.default_rng(9), diff=0.0)
    e = bpb_difference(data, "A", "B", method="percentile")
    r = e.replicates
    assert (e.lo, e.hi) == pytest.approx(tuple(np.quantile(r, [0.025, 0.975])), rel=1e-12)
    k = min(np.sum(r <= 0), np.sum(r >= 0))
    assert e.p == pytest.approx(min(1.0, 2 * (k + 1) / (r.size + 1)))
    far, _ = study(np.random.default_rng(9), diff=1.0)
    assert bpb_difference(far, "A", "B", method="percentile").p == pytest.approx(2 / 10_001)  # never 0
    assert e.interval(0.99)[0] < e.lo and e.interval(0.99)[1] > e.hi


def test_an_interval_at_another_level():
    data, _ = study(np.random.default_rng(10))
    e = bpb_difference(data, "A", "B")
    lo, hi = e.interval(1 - 0.05 / 20)
    assert hi - e.value == pytest.approx(t_quantile(1 - 0.025 / 20, e.df) * e.se, rel=1e-12) and lo < e.lo


def test_one_seed_gives_a_value_and_no_interval():
    data, _ = study(np.random.default_rng(11), seeds=1)
    e = bpb_difference(data, "A", "B")
    assert e.lo is None and e.p is None and e.interval(0.9) == (None, None) and not e.excludes_zero()
    assert math.isfinite(e.value)


# ---- clusters of documents -----------------------------------------------------------------------------------------
def copies(data, k):
    """Every document of ``data`` as k identical copies (doc3 → doc3.0 … doc3.{k-1}, sorted as the originals), and their clusters."""
    out = {c: {s: {f"{d}.{i}": v for d, v in docs.items() for i in range(k)} for s, docs in r.items()}
           for c, r in data.items()}  # fmt: skip
    return out, {f"{d}.{i}": d for d in next(iter(next(iter(data.values())).values())) for i in range(k)}


def test_copies_of_a_document_do_not_narrow_the_interval_when_clustered():
    """Each document copied 4 times: drawn as independent documents the copies narrow the interval (and raise the
    df) as four times the documents would; drawn as clusters the interval is the original one (a cluster of k equal
    copies is the document with k times its nats and bytes: the same ratios in every replicate)."""
    data, _ = study(np.random.default_rng(21), docs=12, seed_sd=0.005, inter_sd=0.1)
    one = bpb_difference(data, "A", "B", seed=3)
    copied, grouping = copies(data, 4)
    loose = bpb_difference(copied, "A", "B", seed=3)
    clustered = bpb_difference(copied, "A", "B", seed=3, clusters=grouping)
    width = lambda e: e.hi - e.lo  # noqa: E731
    assert loose.documents == clustered.documents == 48 and clustered.clusters == 12 and loose.clusters is None
    assert width(loose) < 0.7 * width(one) and loose.df > 2 * one.df  # as if 48 independent documents
    assert (clustered.value, clustered.lo, clustered.hi, clustered.p, clustered.df) == pytest.approx(
        (one.value, one.lo, one.hi, one.p, one.df), rel=1e-9
    )


def test_the_cluster_variance_matches_its_closed_form():
    """Clusters of equal bytes: the statistic is linear in the clusters' weights, so se² = var(seed means)/S +
    var(cluster means)/K (sample variances, numpy), the documents of a cluster pooled."""
    rng = np.random.default_rng(22)
    S, K, per = 5, 15, 3
    x = rng.normal(0.0, 0.1, (S, 1, 1)) + rng.normal(0.0, 0.3, (1, K, 1)) + rng.normal(0.0, 0.2, (S, K, per))
    data = {
        "A": {s: {f"{k}.{j}": (x[s, k, j] + 3.0, 1.0) for k in range(K) for j in range(per)} for s in range(S)},
        "B": {s: {f"{k}.{j}": (3.0, 1.0) for k in range(K) for j in range(per)} for s in range(S)},
    }
    grouping = {f"{k}.{j}": k for k in range(K) for j in range(per)}
    e = ratio_difference(data, "A", "B", resamples=20_000, clusters=grouping)
    vs, vk = np.var(x.mean((1, 2)), ddof=1) / S, np.var(x.mean((0, 2)), ddof=1) / K
    assert e.value == pytest.approx(x.mean(), rel=1e-12) and e.clusters == K and e.documents == K * per
    assert e.se == pytest.approx(math.sqrt(vs + vk), rel=0.02)
    assert e.df == pytest.approx((vs + vk) ** 2 / (vs**2 / (S - 1) + vk**2 / (K - 1)), rel=0.05)
    singletons = ratio_difference(data, "A", "B", resamples=2_000, clusters={d: d for d in grouping})
    plain = ratio_difference(data, "A", "B", resamples=2_000)
    assert (singletons.lo, singletons.hi, singletons.p) == (plain.lo, plain.hi, plain.p)  # one document each: as none


def test_a_document_without_a_cluster_is_named():
    data, _ = study(np.random.default_rng(23), seeds=2, docs=3)
    bad(data, r"clusters: no cluster for 1 of the 3 documents scored \(doc2\)", clusters={"doc0": 0, "doc1": 0})


# ---- how precisely a p is printed ------------------------------------------------------------------------------------
def test_the_p_floor_is_ten_over_the_replicates_or_one_over_the_distinct_resamples():
    """max(10/B, 1/N) rounded up to a power of ten, N = Π C(2s−1, s) × C(2c−1, c), against math.comb."""
    for resamples, seeds, clusters in [(10_000, [5], 30), (None, [5], 1), (None, [3], 1), (100_000, [5], 30),
                                       (None, [5, 5], 1), (10_000, [3], 2), (1_000_000, [5], 3)]:  # fmt: skip
        n = math.prod(math.comb(2 * s - 1, s) for s in seeds) * math.comb(2 * clusters - 1, clusters)
        floor = max(10 / resamples if resamples else 0.0, 1 / n)
        assert p_floor(resamples, seeds, clusters) == pytest.approx(10.0 ** math.ceil(math.log10(floor) - 1e-12))
    assert p_floor(10_000, [5], 30) == pytest.approx(1e-3) and p_floor(None, [5], 1) == pytest.approx(0.01)
    assert p_floor(None, [3], 1) == pytest.approx(0.1) and p_floor(10_000, [3], 2) == pytest.approx(0.1)  # 1/30
    data, _ = study(np.random.default_rng(24), docs=30, diff=0.5)
    e = bpb_difference(data, "A", "B")
    assert e.p < 1e-10 and e.p_floor == pytest.approx(1e-3)  # 10 000 replicates of 5 seeds × 30 documents
    few = bpb_difference(study(np.random.default_rng(24), seeds=3, docs=4)[0], "A", "B", clusters={
        "doc0": 0, "doc1": 0, "doc2": 1, "doc3": 1})  # fmt: skip
    assert few.p_floor == pytest.approx(0.1)  # 3 seeds × 2 clusters: 10 × 3 distinct resamples


def test_a_p_below_its_floor_is_printed_as_less_than_the_floor():
    assert p_text(6.2e-29) == "< 0.001" and P_FLOOR == 1e-3
    assert p_text(0.001) == "0.001" and p_text(0.0044) == "0.004" and p_text(0.0749) == "0.075"
    assert p_text(0.0042, 0.01) == "< 0.01" and p_text(4.2e-4, 1e-4) == "0.00042" and p_text(None) == "–"


# ---- bad input, one line each ------------------------------------------------------------------------------------
def bad(data, match, **kw):
    with pytest.raises(ResultsError, match=match):
        bpb_difference(data, "A", "B", **kw)


def test_bad_input_is_named():
    data, _ = study(np.random.default_rng(12), seeds=2, docs=3)
    bad({"A": data["A"]}, r"no results for configuration 'B'; there are A")
    missing = {"A": data["A"], "B": {0: dict(data["B"][0]), 1: dict(data["B"][1])}}
    del missing["B"][1]["doc2"]
    bad(missing, r"'B' seed 1 did not score the documents the others did: it lacks doc2")
    other = {"A": data["A"], "B": {s: {**d, "doc2": (1.0, 999.0)} for s, d in data["B"].items()}}
    bad(other, r"document 'doc2' has denominator 999 in 'B' seed 0 but \d+ in 'A' seed 0: not the same test text")
    nan = {"A": data["A"], "B": {s: {**d, "doc0": (math.nan, d["doc0"][1])} for s, d in data["B"].items()}}
    bad(nan, r"'B' seed 0 document 'doc0': \(nan, .*seed_outcomes")
    bad(data, "method 'bca': it takes t, percentile", method="bca")
    bad(data, "resamples=10: at least 100", resamples=10)
    bad(data, "a confidence level is between 0 and 1, got 95", level=95)
