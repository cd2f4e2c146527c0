"""Small-sample statistics for sweep reports (docs/methods.md, "Runs are paired by seed"): Student's t from scipy.special
(``stdtrit``, ``stdtr``: what ``scipy.stats.t.ppf`` and ``t.sf`` call, without scipy.stats' argument handling, which
costs 50 µs a call and a second to import), a mean's t-interval (``mean_ci``), the paired t over the seeds two
configurations share (``paired``), and how every report prints a p-value (``p_text``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence, Tuple

from scipy.special import stdtr, stdtrit

LEVEL = 0.95  # the confidence level of every interval the reports print, paired differences' included
P_FLOOR = 1e-3  # the smallest p printed as a number: a bootstrap's 10 / B at B = 10 000; a t over seeds alone too


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1) for Student's t with ``df`` degrees of freedom (scipy.stats.t.ppf)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    return float(stdtrit(df, p))


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom, the two-sided p-value (2 · scipy.stats.t.sf)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    return float(2.0 * stdtr(df, -abs(t)))


@dataclass(frozen=True)
class Interval:
    """Mean of n values with its two-sided t-interval (lo, hi); no interval for n < 2."""

    n: int
    mean: Optional[float]
    lo: Optional[float] = None
    hi: Optional[float] = None
    std: Optional[float] = None  # sample standard deviation (n - 1)

    @property
    def half_width(self) -> Optional[float]:
        return None if self.lo is None else (self.hi - self.lo) / 2.0

    def excludes_zero(self) -> bool:
        return self.lo is not None and (self.lo > 0.0 or self.hi < 0.0)


def mean_ci(values: Sequence[Optional[float]], level: float = LEVEL) -> Interval:
    """Mean and t-interval of the values present (None and NaN left out)."""
    vs = [float(v) for v in values if v is not None and not math.isnan(v)]
    n = len(vs)
    if n == 0:
        return Interval(0, None)
    mean = math.fsum(vs) / n
    if n == 1:
        return Interval(1, mean)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vs) / (n - 1))
    h = t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    return Interval(n, mean, mean - h, mean + h, std)


@dataclass(frozen=True)
class Paired:
    """A − B over matching seeds: the interval of the differences, t statistic and two-sided p."""

    seeds: Tuple[Hashable, ...]
    diff: Interval
    t: Optional[float]
    p: Optional[float]

    value = property(lambda self: self.diff.mean)  # what linrope.analysis.multiplicity.adjust reads of an estimate
    lo = property(lambda self: self.diff.lo)
    hi = property(lambda self: self.diff.hi)

    def interval(self, level: float) -> Tuple[float, float]:
        """(lo, hi) of the mean difference at another level: the t over the same seeds (n ≥ 2)."""
        d = self.diff
        h = t_quantile(0.5 + level / 2.0, d.n - 1) * d.std / math.sqrt(d.n)
        return d.mean - h, d.mean + h


def paired(a: Mapping[Hashable, float], b: Mapping[Hashable, float], level: float = LEVEL) -> Paired:
    """Paired difference A − B over the keys (seeds) both hold a value for."""
    seeds = tuple(sorted((s for s in a if s in b and a[s] is not None and b[s] is not None), key=str))
    diff = mean_ci([a[s] - b[s] for s in seeds], level)
    if diff.n < 2:
        return Paired(seeds, diff, None, None)
    if diff.std == 0.0:  # every seed moved by the same amount: no spread to test against
        t = 0.0 if diff.mean == 0.0 else math.copysign(math.inf, diff.mean)
    else:
        t = diff.mean / (diff.std / math.sqrt(diff.n))
    return Paired(seeds, diff, t, t_two_sided(t, diff.n - 1))


def p_text(p: Optional[float], floor: float = P_FLOOR) -> str:
    """A p-value as the reports print it: "–" without one; "< floor" below ``floor`` (what the design and the
    replicates can resolve: linrope.analysis.bootstrap's docstring); else three decimals, or two significant digits
    below 0.001 (a floor under 0.001 needs more than 10 000 replicates)."""
    if p is None:
        return "–"
    if p < floor:
        return f"< {floor:g}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"
