"""linrope.analysis.seed_outcomes: failed seeds counted (no value, diverged, stalled above a reference, short of a
bar), split outcomes flagged, and a mean ± t only when neither — on the outcomes issue 34 found summarised as
mean ± t."""

import math

import pytest

from linrope.analysis.seed_outcomes import seed_outcomes, split
from linrope.analysis.stats import mean_ci
from linrope.base.errors import ResultsError


def test_stalled_and_diverged_seeds_are_counted_not_averaged():
    values = {1: 2.41, 2: 2.38, 3: 4.52, 4: 2.45, 5: math.nan}
    out = seed_outcomes(values, worse_above=4.44, fails="stall")  # 4.44: the unigram reference
    assert out.n == 5 and out.k == 2
    assert out.failed == {3: "stalls (4.52 > 4.44)", 5: "diverged (nan)"}
    assert out.kept == {1: 2.41, 2: 2.38, 4: 2.45}
    assert out.text() == "2 of 5 seeds fail (1 stalls, 1 diverged); the other 3: min 2.380, median 2.410, max 2.450"
    one = seed_outcomes({1: 2.41, 2: 2.38, 3: 4.52}, worse_above=4.44, fails="stall")
    assert one.text() == "1 of 3 seeds stalls (> 4.44); the other 2: min 2.380, median 2.395, max 2.410"
    two = seed_outcomes({1: 4.6, 2: 2.38, 3: 4.52}, worse_above=4.44, fails="stall")
    assert two.text() == "2 of 3 seeds stall (> 4.44); the other: 2.380"


def test_recall_short_of_its_bar():
    """softmax_alibi at width 64 (issue 34): 0.993 / 0.663 / 0.416, once reported as a mean ± t."""
    out = seed_outcomes({1: 0.993, 2: 0.663, 3: 0.416}, worse_below=0.9, fails="fall short")
    assert out.k == 2 and out.failed[2] == "falls short (0.663 < 0.9)"
    assert out.text() == "2 of 3 seeds fall short (< 0.9); the other: 0.993"
    missing = seed_outcomes({1: 0.99, 2: None, 3: 0.98}, worse_below=0.9)
    assert missing.failed == {2: "no value"} and missing.text().startswith("1 of 3 seeds fail (1 no value); ")


def test_a_stalled_seed_without_a_rule_is_flagged_bimodal():
    """placement=both (issue 34): one seed stalls at 3.38 while the others sit near 2.4."""
    out = seed_outcomes({1: 2.41, 2: 2.38, 3: 3.38, 4: 2.45, 5: 2.40})
    assert out.bimodal and out.k == 0 and out.groups == ((2.38, 2.40, 2.41, 2.45), (3.38,))
    assert out.text() == "bimodal: 4 at 2.380–2.450 and 1 at 3.380 (min 2.380, median 2.410, max 3.380, n=5)"


def test_one_group_gives_the_mean_and_t_interval():
    values = {1: 2.41, 2: 2.38, 3: 2.40, 4: 2.45, 5: 2.43}
    out = seed_outcomes(values, worse_above=4.44)
    iv = mean_ci(list(values.values()))
    assert not out.bimodal and out.k == 0 and out.interval == iv
    assert out.text() == f"{iv.mean:.3f} ± {iv.half_width:.3f} (n=5)"
    assert seed_outcomes({1: 2.4}).text() == "2.400 (n=1)"


@pytest.mark.parametrize(
    "values,groups",
    [
        ([1.0, 1.0, 0.99], 1),  # a tie and rounding: within 1% of the median, no split
        ([1.0, 2.0, 3.0], 1),  # evenly spread: the gap is no wider than a group
        ([2.40, 2.41, 3.38], 2),
        ([0.993, 0.663, 0.416], 1),  # widely spread, not two groups (a bar counts these)
        ([0.99, 0.98, 0.2, 0.21, 0.22], 2),
        ([2.4, 3.4], 1),  # two values never split
    ],
)
def test_split(values, groups):
    assert len(split(values)) == groups
    assert sorted(v for g in split(values) for v in g) == sorted(values)


def test_contradictory_bars_are_named():
    with pytest.raises(ResultsError, match="worse_below=5 > worse_above=4: every seed would fail"):
        seed_outcomes({1: 4.5}, worse_above=4, worse_below=5)
