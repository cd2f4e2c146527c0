"""A report's family of comparisons, corrected for their number (docs/methods.md, "A report's family"): verdicts on
Holm's adjusted p, Benjamini–Hochberg's beside it, the simultaneous (Bonferroni) interval at ``1 − α / m``, ``m``
the comparisons with a p-value.  statsmodels' ``multipletests`` is imported when a family is first adjusted: it
brings pandas (half a second), which a report's command line should not wait for."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from linrope.analysis.stats import P_FLOOR, p_text
from linrope.base.errors import ResultsError

ALPHA = 0.05


def _adjusted(p_values: Sequence[Optional[float]], method: str) -> list:
    """statsmodels' adjusted p-values over the p-values present, in the order given (None stays None)."""
    from statsmodels.stats.multitest import multipletests

    for i, p in enumerate(p_values):
        if p is not None and not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
            raise ResultsError(f"p-value {i} of the family is {p!r}: a p-value is a number in [0, 1] (or None)")
    ps = [None if p is None else float(p) for p in p_values]
    present = [i for i, p in enumerate(ps) if p is not None]
    out = list(ps)
    if present:  # an empty family: statsmodels before 0.15 divides by its size, 0
        for i, p in zip(present, multipletests([ps[i] for i in present], method=method)[1]):
            out[i] = float(p)
    return out


def holm(p_values: Sequence[Optional[float]]) -> list:
    """Holm's step-down adjusted p-values, in the order given (None stays None)."""
    return _adjusted(p_values, "holm")


def benjamini_hochberg(p_values: Sequence[Optional[float]]) -> list:
    """Benjamini–Hochberg's step-up adjusted p-values (FDR), in the order given (None stays None)."""
    return _adjusted(p_values, "fdr_bh")


def bonferroni(p_values: Sequence[Optional[float]]) -> list:
    """``min(1, m · p)`` (None stays None): the p-values the simultaneous intervals agree with."""
    return _adjusted(p_values, "bonferroni")


def family_level(m: int, alpha: float = ALPHA) -> float:
    """The level of each of m simultaneous (Bonferroni) intervals: ``1 − α / m`` (``1 − α`` for m ≤ 1)."""
    if not 0.0 < alpha < 1.0:
        raise ResultsError(f"alpha={alpha}: a significance level is between 0 and 1")
    return 1.0 - alpha / max(m, 1)


@dataclass(frozen=True)
class Adjusted:
    """One comparison of a family: its raw numbers, its adjusted p-values, its simultaneous interval and the
    verdict (on the Holm-adjusted p)."""

    name: str
    value: Optional[float]
    lo: Optional[float]  # the raw interval, at the comparison's own level
    hi: Optional[float]
    p: Optional[float]
    p_holm: Optional[float]
    p_bh: Optional[float]
    family_lo: Optional[float]  # the simultaneous interval, at family_level(m, alpha)
    family_hi: Optional[float]
    m: int
    alpha: float
    p_floor: float = P_FLOOR  # the smallest p it prints as a number (its estimate's, else stats.P_FLOOR)

    @property
    def resolved(self) -> bool:
        return self.p_holm is not None and self.p_holm <= self.alpha

    @property
    def sign(self) -> int:
        """+1 / −1 when resolved (the sign of the difference), 0 when not."""
        return 0 if not self.resolved or not self.value else int(math.copysign(1, self.value))

    def verdict(self) -> str:
        """'resolved' / 'not resolved' on the Holm-adjusted p, with the caveat when the intervals disagree."""
        if self.p_holm is None:
            return "no test (fewer than 2 seeds)"
        if not self.resolved:
            return f"not resolved (Holm p {self.p_text(self.p_holm)} > {self.alpha:g} over {self.m} comparisons)"
        inside = self.family_lo is not None and self.family_lo <= 0.0 <= self.family_hi
        note = "; its simultaneous interval still includes 0" if inside else ""
        return f"resolved (Holm p {self.p_text(self.p_holm)} ≤ {self.alpha:g} over {self.m} comparisons{note})"

    def p_text(self, p: Optional[float]) -> str:
        """``p`` (its raw, Holm or BH p) as printed: stats.p_text at this comparison's floor."""
        return p_text(p, self.p_floor)


def adjust(family: Sequence[Tuple[str, object]], alpha: float = ALPHA) -> list:
    """[(name, estimate)] → [Adjusted], one per comparison, in the order given.  An estimate is anything with
    ``value``, ``lo``, ``hi``, ``p`` and ``interval(level)`` (linrope.analysis.bootstrap.Estimate); a None
    estimate (a configuration missing) stays in the list with no numbers."""
    ps = [None if e is None else e.p for _, e in family]
    m = sum(p is not None for p in ps)
    level = family_level(m, alpha)
    out = []
    for (name, e), ph, pb in zip(family, holm(ps), benjamini_hochberg(ps)):
        raw = (None,) * 4 if e is None else (e.value, e.lo, e.hi, e.p)
        simultaneous = (None, None) if e is None or e.p is None else e.interval(level)
        out.append(Adjusted(name, *raw, ph, pb, *simultaneous, m, alpha, getattr(e, "p_floor", P_FLOOR)))
    return out


def resolved_count(adjusted: Sequence[Adjusted]) -> Tuple[int, int, int]:
    """(resolved raw at α, resolved after Holm, resolved after BH at α as FDR) over the family: what the report
    prints above its verdicts."""
    if not adjusted:
        return 0, 0, 0
    alpha = adjusted[0].alpha
    raw = sum(a.p is not None and a.p <= alpha for a in adjusted)
    bh = sum(a.p_bh is not None and a.p_bh <= alpha for a in adjusted)
    return raw, sum(a.resolved for a in adjusted), bh
