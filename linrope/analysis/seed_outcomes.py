"""Outcomes per seed that a mean ± t would misstate (docs/methods.md, "Failed seeds are counted"): failed seeds
(no value, not finite, or on the wrong side of the caller's bar) counted with min / median / max of the others, and
a split into two groups (``bimodal``); else the mean ± t of linrope.analysis.stats."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, Hashable, List, Mapping, Optional, Tuple

from linrope.analysis.stats import LEVEL, Interval, mean_ci
from linrope.base.errors import ResultsError

RATIO = 3.0


@dataclass(frozen=True)
class SeedOutcome:
    """The seeds of one configuration: which failed and why, the values of the others, and how to show them."""

    n: int
    failed: Dict[Hashable, str]  # seed -> why: "no value", "diverged (nan)", "stalls (4.512 > 4.440)"
    kept: Dict[Hashable, float]
    bimodal: bool
    groups: Tuple[Tuple[float, ...], ...]  # the kept values sorted, split at the gap when bimodal, else one group
    interval: Interval  # mean ± t over the kept seeds (shown only when nothing failed and nothing splits)
    fails: str  # the verb of the rule: "stall", "fall short"
    rule: str  # the bar: "> 4.44", "< 0.9", "< 0.9 or > 4.44" ("" without one)

    @property
    def k(self) -> int:
        return len(self.failed)

    def spread(self, digits: int = 3) -> str:
        vs = sorted(self.kept.values())
        if not vs:
            return "no value"
        return f"min {vs[0]:.{digits}f}, median {statistics.median(vs):.{digits}f}, max {vs[-1]:.{digits}f}"

    def text(self, digits: int = 3) -> str:
        """One cell: "2 of 5 seeds fail (1 diverged, 1 stalls); the other 3: min …" / "bimodal: …" / "2.412 ± …"."""
        if self.failed:
            heads = [why.split(" (")[0] for why in self.failed.values()]
            counts = {h: heads.count(h) for h in dict.fromkeys(heads)}
            seeds = f"{self.k} of {self.n} seed{'s' if self.n != 1 else ''}"
            if list(counts) == [_third(self.fails)]:  # "2 of 5 seeds stall (> 4.44)", "1 of 5 seeds stalls (…)"
                head = f"{seeds} {self.fails if self.k > 1 else _third(self.fails)} ({self.rule})"
            else:
                head = f"{seeds} fail ({', '.join(f'{c} {h}' for h, c in counts.items())})"
            if len(self.kept) == 1:
                return f"{head}; the other: {next(iter(self.kept.values())):.{digits}f}"
            return head + (f"; the other {len(self.kept)}: {self.spread(digits)}" if self.kept else "")
        if self.bimodal:
            parts = " and ".join(
                f"{len(g)} at {g[0]:.{digits}f}" + (f"–{g[-1]:.{digits}f}" if len(g) > 1 else "") for g in self.groups
            )
            return f"bimodal: {parts} ({self.spread(digits)}, n={self.n})"
        iv = self.interval
        if iv.mean is None:
            return "–"
        spread = f" ± {iv.half_width:.{digits}f}" if iv.lo is not None else ""
        return f"{iv.mean:.{digits}f}{spread} (n={iv.n})"


def _third(verb: str) -> str:
    """The verb for one seed: stall -> stalls, fall short -> falls short, miss -> misses."""
    first, _, rest = verb.partition(" ")
    first = first[:-1] + "ies" if first.endswith("y") else first + ("es" if first.endswith(("s", "sh")) else "s")
    return first + (" " + rest if rest else "")


def split(values: List[float], ratio: float = RATIO, min_gap: Optional[float] = None) -> Tuple[Tuple[float, ...], ...]:
    """The values sorted, as two groups when the largest gap between neighbours exceeds ``ratio`` × the wider
    group's range (at least ``min_gap``); else as one group.  Fewer than 3 values never split."""
    vs = sorted(values)
    if len(vs) < 3:
        return (tuple(vs),)
    gaps = [b - a for a, b in zip(vs, vs[1:])]
    i = max(range(len(gaps)), key=lambda j: gaps[j])
    low, high = vs[: i + 1], vs[i + 1 :]
    floor = 0.01 * abs(statistics.median(vs)) if min_gap is None else min_gap
    spread = max(low[-1] - low[0], high[-1] - high[0])
    if gaps[i] > ratio * max(spread, floor):
        return tuple(low), tuple(high)
    return (tuple(vs),)


def seed_outcomes(
    values: Mapping[Hashable, Optional[float]],
    *,
    worse_above: Optional[float] = None,
    worse_below: Optional[float] = None,
    fails: str = "fail",
    level: float = LEVEL,
    ratio: float = RATIO,
    min_gap: Optional[float] = None,
) -> SeedOutcome:
    """``{seed: value}`` → SeedOutcome.  A seed fails when its value is None ("no value"), not finite ("diverged"),
    above ``worse_above`` or below ``worse_below`` (``fails``, the verb: "stall", "fall short")."""
    if worse_above is not None and worse_below is not None and worse_below > worse_above:
        raise ResultsError(f"worse_below={worse_below} > worse_above={worse_above}: every seed would fail")
    failed: Dict[Hashable, str] = {}
    kept: Dict[Hashable, float] = {}
    verb = _third(fails)
    for seed in sorted(values, key=lambda s: (type(s).__name__, str(s))):
        v = values[seed]
        if v is None:
            failed[seed] = "no value"
        elif not math.isfinite(float(v)):
            failed[seed] = f"diverged ({float(v)})"
        elif worse_above is not None and v > worse_above:
            failed[seed] = f"{verb} ({v:.4g} > {worse_above:.4g})"
        elif worse_below is not None and v < worse_below:
            failed[seed] = f"{verb} ({v:.4g} < {worse_below:.4g})"
        else:
            kept[seed] = float(v)
    groups = split(list(kept.values()), ratio, min_gap)
    bars = [f"{op} {bar:.4g}" for op, bar in (("<", worse_below), (">", worse_above)) if bar is not None]
    return SeedOutcome(
        n=len(values),
        failed=failed,
        kept=kept,
        bimodal=len(groups) == 2,
        groups=groups,
        interval=mean_ci(list(kept.values()), level),
        fails=fails,
        rule=" or ".join(bars),
    )
