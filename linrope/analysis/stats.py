"""Small-sample statistics for sweep reports, without scipy.

* ``t_cdf`` / ``t_quantile`` — Student's t distribution, from the regularised incomplete beta
  function ``I_x(a, b)`` evaluated by its continued fraction (modified Lentz), to float64 precision;
* ``mean_ci`` — mean of the values and the two-sided t-interval ``mean ± t_{1-α/2, n-1} · s / √n``;
* ``paired`` — the paired difference A − B over the seeds both have: mean difference, its t-interval
  and the two-sided p-value of the paired t-test (H0: mean difference 0).
* ``p_text`` — how every report prints a p-value: never below a floor (``P_FLOOR``, or an estimate's own,
  linrope.analysis.bootstrap.p_floor), "< floor" below it.

Runs that share a seed share their data order and initialisation, so the paired test removes
that shared part of the noise; an unpaired comparison would count it twice."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence, Tuple

LEVEL = 0.95  # the confidence level of every interval the reports print, paired differences' included
P_FLOOR = 1e-3  # the smallest p printed as a number: a bootstrap's 10 / B at B = 10 000; a t over seeds alone too
_TINY = 1e-300
_EPS = 1e-16


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (without its front factor), modified Lentz's method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            delta = c * d
            h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a, b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here; otherwise use the symmetry
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (the two-sided p-value)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * t_two_sided(t, df)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on ``t_cdf`` to float64 resolution."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):  # no float64 between them
            return mid
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid


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
