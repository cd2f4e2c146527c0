"""linrope.analysis.multiplicity (statsmodels' multipletests): Holm and Benjamini–Hochberg against values computed
by hand from the example of Benjamini & Hochberg (1995) and a small one, a missing p left out of the family, against
the step-down / step-up procedures written out for random families, and the family's simultaneous intervals and
verdicts."""

import gc
import random

import pytest

from linrope.analysis.bootstrap import seed_difference
from linrope.analysis.multiplicity import (
    adjust,
    benjamini_hochberg,
    bonferroni,
    family_level,
    holm,
    resolved_count,
)
from linrope.analysis.stats import paired
from linrope.base.errors import ResultsError

# Benjamini & Hochberg (1995), section 4: 15 p-values from a study of myocardial infarction treatments.  At 0.05,
# Bonferroni and Holm reject the first 3, BH the first 4.
BH95 = [
    0.0001,
    0.0004,
    0.0019,
    0.0095,
    0.0201,
    0.0278,
    0.0298,
    0.0344,
    0.0459,
    0.3240,
    0.4262,
    0.5719,
    0.6528,
    0.7590,
    1.0,
]
# By hand: Holm (m − i + 1) · p_(i), running maximum; BH m / i · p_(i), running minimum from the largest.
BH95_HOLM = [0.0015, 0.0056, 0.0247, 0.114, 0.2211, 0.278, 0.278, 0.278, 0.3213, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
BH95_BH = [
    0.0015,
    0.003,
    0.0095,
    0.035625,
    0.0603,
    0.0638571428571,  # 7th: 15/7 · 0.0298; the 6th's 15/6 · 0.0278 = 0.0695 takes the smaller that follows
    0.0638571428571,
    0.0645,
    0.0765,
    0.486,
    0.5811818181818,
    0.714875,
    0.7532307692308,
    0.8132142857143,
    1.0,
]


def test_holm_and_bh_on_the_benjamini_hochberg_example():
    assert holm(BH95) == pytest.approx(BH95_HOLM, rel=1e-9)
    assert benjamini_hochberg(BH95) == pytest.approx(BH95_BH, rel=1e-9)
    assert sum(p <= 0.05 for p in holm(BH95)) == 3
    assert sum(p <= 0.05 for p in benjamini_hochberg(BH95)) == 4
    assert sum(p <= 0.05 for p in bonferroni(BH95)) == 3


def test_a_small_family_in_any_order_and_with_a_missing_p():
    ps = [0.01, 0.04, None, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): Holm 4·0.005, 3·0.01, 2·0.03, max(0.06, 1·0.04)
    assert holm(ps) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    # BH 4/1·0.005, 4/2·0.01, 4/3·0.03, 4/4·0.04, running minimum from the top
    assert benjamini_hochberg(ps) == pytest.approx([0.02, 0.04, None, 0.04, 0.02])
    assert bonferroni(ps) == pytest.approx([0.04, 0.16, None, 0.12, 0.02])
    assert holm([]) == [] and benjamini_hochberg([0.2]) == [0.2] and holm([0.2]) == [0.2]
    assert holm([None]) == [None] and benjamini_hochberg([None, None]) == [None, None] and bonferroni([None]) == [None]


def step_down(ps, alpha):
    """Holm as he wrote it: reject p_(1), p_(2), … while p_(i) ≤ α / (m − i + 1); stop at the first that is not."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    rejected = set()
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        rejected.add(i)
    return rejected


def step_up(ps, alpha):
    """BH as written: the largest k with p_(k) ≤ k α / m; reject p_(1) … p_(k)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    k = max((r + 1 for r, i in enumerate(order) if ps[i] <= (r + 1) * alpha / len(ps)), default=0)
    return set(order[:k])


@pytest.fixture
def frozen_gc():
    """statsmodels' Holm runs gc.collect() on every call (statsmodels PR 8671, closed unmerged): a tenth of a second
    in a test process, 300 families would take a minute.  Frozen, the objects alive before the test are not scanned."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_adjusted_p_values_reject_what_the_procedures_reject(frozen_gc):
    rng = random.Random(5)
    for _ in range(300):
        m = rng.randint(1, 12)
        ps = [rng.random() ** rng.choice([1, 3, 6]) for _ in range(m)]
        alpha = rng.choice([0.01, 0.05, 0.1, 0.2])
        h, b = holm(ps), benjamini_hochberg(ps)
        assert {i for i, p in enumerate(h) if p <= alpha} == step_down(ps, alpha)
        assert {i for i, p in enumerate(b) if p <= alpha} == step_up(ps, alpha)
        # BH ≤ Holm, to an ulp: both adjust the smallest p to m · p, statsmodels' BH as p / (1 / m) (1/m rounded)
        assert all(x >= p for x, p in zip(h, ps)) and all(y <= x * (1 + 1e-15) for y, x in zip(b, h))


def test_bad_p_values_are_named():
    with pytest.raises(ResultsError, match=r"p-value 1 of the family is 1.5: a p-value is a number in \[0, 1\]"):
        holm([0.1, 1.5])
    with pytest.raises(ResultsError, match="alpha=5"):
        family_level(3, 5)


# ---- a family of estimates ---------------------------------------------------------------------------------------
A = {1: 2.41, 2: 2.38, 3: 2.47, 4: 2.44, 5: 2.40}


def shifted(by, noise):
    return {s: v + by + n for (s, v), n in zip(A.items(), noise)}


def test_a_family_gets_simultaneous_intervals_and_holm_verdicts():
    noise = [0.004, -0.003, 0.002, -0.001, -0.002]
    values = {
        "A": A,
        "far": shifted(0.05, noise),  # A − far about −0.05, tight: resolved after correction
        "near": shifted(0.004, noise),  # small: p 0.037, resolved at 5% alone, not after Holm over 3
        "same": shifted(0.0, noise),
    }
    family = [(b, seed_difference(values, "A", b)) for b in ("far", "near", "same")] + [("missing", None)]
    out = adjust(family)
    assert [a.name for a in out] == ["far", "near", "same", "missing"]
    raw = [paired(A, values[b]).p for b in ("far", "near", "same")]
    assert [a.p for a in out[:3]] == pytest.approx(raw, rel=1e-12)
    assert [a.p_holm for a in out[:3]] == pytest.approx(holm(raw))
    assert [a.p_bh for a in out[:3]] == pytest.approx(benjamini_hochberg(raw))
    assert out[0].m == 3 and out[3].p is None and out[3].p_holm is None and out[3].family_lo is None
    # the simultaneous interval is the paired t-interval at 1 − 0.05/3
    ref = paired(A, values["far"], level=1 - 0.05 / 3).diff
    assert (out[0].family_lo, out[0].family_hi) == pytest.approx((ref.lo, ref.hi), rel=1e-12)
    assert out[0].family_lo < out[0].lo and out[0].family_hi > out[0].hi
    assert out[1].p < 0.05 < out[1].p_holm, "the example needs a comparison that only the correction undoes"
    assert out[0].resolved and out[0].sign == -1 and not out[1].resolved and out[1].sign == 0
    assert out[0].verdict().startswith("resolved (Holm p ") and "over 3 comparisons" in out[0].verdict()
    assert out[1].verdict().startswith("not resolved (Holm p ")
    assert out[3].verdict() == "no test (fewer than 2 seeds)"
    assert resolved_count(out) == (2, 1, sum(a.p_bh is not None and a.p_bh <= 0.05 for a in out))
    assert family_level(3) == pytest.approx(1 - 0.05 / 3) and family_level(0) == 0.95


def test_a_holm_verdict_whose_simultaneous_interval_includes_zero_says_so():
    """Holm's second step tests at α/(m − 1), the simultaneous interval sits at α/m: between the two, a comparison
    is resolved and its interval still touches 0."""

    class Fake:
        def __init__(self, p, lo, hi):
            self.value, self.p, self.lo, self.hi = (lo + hi) / 2, p, lo, hi

        def interval(self, level):
            return self.lo, self.hi

    out = adjust([("first", Fake(0.001, 0.1, 0.3)), ("second", Fake(0.04, -0.01, 0.2))], alpha=0.1)
    assert out[1].resolved and out[1].verdict().endswith("its simultaneous interval still includes 0)")
    assert not out[0].verdict().endswith("includes 0)")
