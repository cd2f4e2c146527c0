"""A report's comparisons A − B, computed in one place: ``claim_results`` gives each pair or claim in one group of
runs (a sweep's task, a study's arm), ``corrected`` places a table's results in its family (docs/methods.md, "A
report's family").  A sweep's report (linrope.analysis.report) prints its pairs from the t over seeds, uncorrected;
a study in arms (linrope.analysis.arms) tables its claims from the bootstrap where the runs kept their loss per
document, corrected over the table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from linrope.analysis.bootstrap import shared_bpb_difference
from linrope.analysis.evidence import documents_of
from linrope.analysis.multiplicity import Adjusted, adjust
from linrope.analysis.runs import Run, by_seed, extrapolation_row
from linrope.analysis.stats import LEVEL, Interval, paired
from linrope.analysis.study_config import Claim


def value_of(metric: str):
    """run -> its value of ``metric``: the logged value (its last), or the extrapolation table's value at a length
    (``bpb@256``: as trained, sliding windows; ``bpb@256 windows window128``: the row of that name,
    linrope.evaluation.tables.row_name)."""
    if "@" in metric:
        name, rest = metric.split("@")
        length, _, row = rest.partition(" ")
        return lambda run: (extrapolation_row(run.extrapolation, int(length), row or "none") or {}).get(name)
    return lambda run: run.value(metric, "last")


@dataclass(frozen=True)
class Boot:
    """A − B from the paired bootstrap over seeds *and* test documents (linrope.analysis.bootstrap), for runs that
    kept their loss per document: what the table reads of a ``stats.Paired`` (seeds, diff, t, p); ``estimate`` is what
    multiplicity.adjust reads."""

    estimate: Any  # bootstrap.Estimate
    seeds: tuple
    t = None

    @property
    def diff(self) -> Interval:
        e = self.estimate
        return Interval(len(self.seeds), e.value, e.lo, e.hi)

    @property
    def p(self) -> Optional[float]:
        return self.estimate.p


def boot_result(groups: Dict[str, List[Run]], claim: Claim, level: float, clusters=None) -> Optional[Boot]:
    """The bootstrap over seeds and document clusters (``clusters``: {document: cluster}; None: each document its
    own) when every run of A and B with the claim's row kept its loss per document there
    (linrope.analysis.evidence.documents_of), at least two seeds shared; else None."""
    cells, metric = {}, claim.metric
    for c in (claim.a, claim.b):
        cells[c] = documents_of(groups[c], metric)
        if not cells[c] or len(cells[c]) < len(by_seed(groups[c], value_of(metric))):
            return None  # a run without its documents: the seeds alone (stats.paired)
    shared, estimate = shared_bpb_difference(cells, claim.a, claim.b, level=level, clusters=clusters)
    return None if estimate is None else Boot(estimate, tuple(shared))


def claim_results(
    groups: Dict[str, List[Run]], claims: Sequence[Claim], level=LEVEL, clusters=None, documents: bool = True
) -> Dict[Claim, Any]:
    """claim -> its difference in one group of runs (None when a configuration is missing), its interval at
    ``level``: the bootstrap over seeds and document clusters (Boot; ``clusters`` as boot_result) where the runs
    kept their loss per document, else (and with ``documents=False``) a paired t over seeds (stats.Paired)."""
    out: Dict[Claim, Any] = {}
    for c in claims:
        if c.a not in groups or c.b not in groups:
            out[c] = None
            continue
        boot = boot_result(groups, c, level, clusters) if documents and "bpb" in c.metric else None
        out[c] = boot or paired(
            by_seed(groups[c.a], value_of(c.metric)), by_seed(groups[c.b], value_of(c.metric)), level
        )
    return out


@dataclass(frozen=True)
class Corrected:
    """A claim at one arm within the table's family: the paired result (95% interval) and its place in the family
    (multiplicity.Adjusted: Holm's p over the m comparisons with a test, the simultaneous interval at 1 − α/m)."""

    raw: Any  # stats.Paired, or Boot
    adjusted: Adjusted
    withheld: str = ""  # why it gets no verdict (a control missed, a seed collapsed at its row); still in the family
    why: str = ""  # its kind, a key of linrope.analysis.arms.NO_VERDICT

    @property
    def diff(self):
        return self.raw.diff

    @property
    def p_holm(self):
        return self.adjusted.p_holm

    @property
    def m(self):
        return self.adjusted.m

    @property
    def resolved(self):
        return self.adjusted.resolved and not self.withheld

    @property
    def simultaneous(self) -> Optional[Interval]:
        a = self.adjusted
        return None if a.family_lo is None else Interval(self.diff.n, a.value, a.family_lo, a.family_hi)


def corrected(
    results: Dict[str, Dict[Claim, Any]],
    claims: Sequence[Claim],
    withheld: Optional[Dict[tuple, Tuple[str, str]]] = None,
) -> Dict[str, Dict[Claim, Optional[Corrected]]]:
    """Every (arm, claim) result with its place in the table's family (multiplicity.adjust); one in ``withheld``
    ((arm, claim) -> (kind, what): a NO_VERDICT key and the detail) keeps its place in the family, so dropping it
    cannot ease the others, but gets no verdict."""
    withheld = withheld or {}
    keys = [(arm, c) for arm in results for c in claims if results[arm][c] is not None]

    family = adjust(
        [
            (f"{arm}: {c.a} − {c.b} ({c.metric})", getattr(results[arm][c], "estimate", results[arm][c]))
            for arm, c in keys
        ]
    )
    out: Dict[str, Dict[Claim, Optional[Corrected]]] = {arm: dict.fromkeys(claims) for arm in results}
    for (arm, c), adj in zip(keys, family):
        why, text = withheld.get((arm, c), ("", ""))
        out[arm][c] = Corrected(results[arm][c], adj, text, why)
    return out
