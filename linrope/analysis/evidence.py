"""What a bytes comparison rests on (docs/methods.md, "Evidence" and "Uncertainty", where each rule is argued):
``section`` gives a report's "Evidence" section for runs that kept their loss per document: the text scored, the
reference rows (a unigram and a Kneser–Ney 5-gram scored through each model row's windows, ``references.csv``; a
seed above its row's unigram has collapsed there), failed seeds (linrope.analysis.seed_outcomes), the test
documents' clusters (linrope.analysis.clusters), each comparison A − B from the paired bootstrap with raw, Holm and
Benjamini–Hochberg p (linrope.analysis.multiplicity; ``evidence.csv``), and the loss by position beside the
context-limited control (``positions.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from linrope.analysis.bootstrap import shared_bpb_difference
from linrope.analysis.cells import markdown_table
from linrope.analysis.clusters import FILE as CLUSTERS
from linrope.analysis.clusters import cluster_lines, document_clusters, floor_text, runs_corpus
from linrope.analysis.multiplicity import adjust, resolved_count
from linrope.analysis.runs import Run, extrapolation_row
from linrope.analysis.seed_outcomes import seed_outcomes
from linrope.base.csv_files import read_rows
from linrope.base.plots import Curve, Panel, plot_curves, series_colour
from linrope.evaluation.tables import row_name

LN2 = math.log(2.0)
FILES = ("evidence.csv", "references.csv", "positions.png", CLUSTERS)
REFERENCE_ORDERS = (1, 5)


# ---- which row a metric reads --------------------------------------------------------------------------------
def train_context(run: Run) -> Optional[int]:
    value = run.get("context", run.get("data.context"))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def row_for(run: Run, metric: str) -> Optional[Dict[str, Any]]:
    """The extrapolation row behind ``metric``: ``test/bpb`` is the non-overlapping windows at the training context
    (exactly the test's windows); ``bpb@<length>[ <row>]`` the row of that length and name."""
    if metric == "test/bpb":
        length, name = train_context(run), "windows"
    elif metric.startswith("bpb@"):
        rest = metric.split("@", 1)[1]
        length_text, _, name = rest.partition(" ")
        length, name = int(length_text), name or "none"
    else:
        return None
    return extrapolation_row(run.extrapolation, length, name)


def row_values(runs: Sequence[Run], metric: str) -> Dict[Any, float]:
    """{seed: bpb of ``metric``'s row}, for the runs that have it."""
    out = {}
    for run in runs:
        row = row_for(run, metric)
        if row and row.get("bpb") is not None:
            out[run.seed] = float(row["bpb"])
    return out


def above(values: Mapping[Any, float], bar: Optional[float]) -> List[Any]:
    """The seeds whose value is above ``bar`` (none when there is no bar), or is not a finite number."""
    if bar is None:
        return []
    return sorted((s for s, v in values.items() if not math.isfinite(v) or v > bar), key=str)


def above_unigram(groups, refs: Optional["References"], metric: str, configs, kept=None) -> str:
    """``A 1 of 3, B 2 of 3``: each configuration's seeds above the unigram of ``metric``'s row, out of the seeds with
    that row (``kept``: {configuration: the seeds to count}); "" when none is, or without references."""
    out = []
    for c in configs if refs else ():
        values, bar = row_values(groups.get(c, []), metric), refs.unigram(groups.get(c, []), metric)
        seeds = values if kept is None else kept[c]
        bad = above({k: v for k, v in values.items() if k in seeds}, bar)
        out += [f"{c} {len(bad)} of {len(seeds)}"] if bad else []
    return ", ".join(out)


def row_metric(row: Mapping[str, Any]) -> str:
    """The metric that names an extrapolation row: ``bpb@2048`` (sliding, as trained), ``bpb@2048 windows``."""
    name = row_name(row)
    return f"bpb@{row['length']}" + ("" if name == "none" else f" {name}")


def collapse_lines(groups: Mapping[str, Sequence[Run]], refs: Optional["References"]) -> List[str]:
    """A table: per configuration and extrapolation row, how many seeds scored above the unigram of that row (the
    unigram scored through the row's windows)."""
    if not refs:
        return []
    rows = [r for runs in groups.values() for run in runs for r in run.extrapolation]
    metrics = sorted(
        {(r["length"], row_metric(r)) for r in rows if r.get("status") == "ok" and r.get("bpb") is not None}
    )
    if not metrics:
        return []
    body, bars = [], set()
    for label, runs in groups.items():
        cells = []
        for _, metric in metrics:
            values = row_values(runs, metric)
            bar = refs.unigram(runs, metric)
            bars.add(bar)
            bad = above(values, bar)
            text = f"{len(bad)} of {len(values)}" if values else "–"
            cells.append(f"**{text}**" if bad else text)
        body.append([label, *cells])
    return [
        "**Rows above the unigram** (seeds whose bpb at that row is above the unigram's scored through the row's "
        "windows"
        + (f", {bars.pop():.3f} at every row (the same bytes)" if len(bars) == 1 and None not in bars else "")
        + ": collapsed there; a comparison at a row with such a seed gets no verdict).  Rows: bpb@L slides windows "
        "of L bytes "
        "(stride L/2); *windows*: non-overlapping windows; *window<N>*: attention to the last N keys only.",
        "",
        markdown_table(["configuration", *(m for _, m in metrics)], body),
        "",
    ]


def reference_row_text(key: Tuple, test: bool = False) -> str:
    """A reference row's windows in words: ``test: windows of 128`` / ``bpb@2048: sliding 2048 by 1024``."""
    protocol, length, stride, window = key
    metric = row_metric({"length": length, "protocol": protocol, "scaling": "none", "window": window})
    words = f"windows of {length}" if protocol == "windows" else f"windows of {length} sliding by {stride}"
    return ("test/bpb = " if test else "") + f"{metric} ({words}" + (f", last {window} keys" if window else "") + ")"


def documents_of(runs: Sequence[Run], metric: str) -> Dict[Any, Dict[str, Tuple[float, float]]]:
    """{seed: {document: (nats, bytes)}} of ``metric``'s row, for the runs that kept it and whose numbers there are
    finite: a run that diverged at the row (NaN or infinite loss) has no documents to resample; ``diverged_at``
    names it."""
    out: Dict[Any, Dict[str, Tuple[float, float]]] = {}
    for run in runs:
        row = row_for(run, metric)
        if row and row.get("per_document"):
            docs = {d["document"]: (float(d["nats"]), float(d["bytes"])) for d in row["per_document"]}
            if all(math.isfinite(n) and math.isfinite(b) for n, b in docs.values()):
                out[run.seed] = docs
    return out


def diverged_at(runs: Sequence[Run], metric: str) -> List[Any]:
    """The seeds whose row of ``metric`` kept its documents with a loss that is not finite (left out by
    ``documents_of``)."""
    kept = documents_of(runs, metric)
    return sorted({r.seed for r in runs if (row_for(r, metric) or {}).get("per_document")} - set(kept), key=str)


def has_documents(groups: Mapping[str, Sequence[Run]]) -> bool:
    return any(r.get("per_document") for runs in groups.values() for run in runs for r in run.extrapolation)


# ---- reference rows -------------------------------------------------------------------------------------------
def row_key(row: Mapping[str, Any]) -> Tuple[str, int, int, Optional[int]]:
    """The windows an extrapolation row scored through: (protocol, length, stride, attention window or None) —
    what its reference rows are scored as (a RoPE scaling changes the model, not the windows)."""
    protocol, length = row.get("protocol") or "sliding", int(row["length"])
    stride = row.get("stride") or (length if protocol == "windows" else max(1, length // 2))
    return protocol, length, int(stride), (int(row["window"]) if row.get("window") else None)


def test_key(run: Run) -> Optional[Tuple[str, int, int, None]]:
    """The test's windows: non-overlapping windows of the training context over the whole split."""
    context = train_context(run)
    return None if context is None else ("windows", context, context, None)


class References:
    """The reference rows of ``references.csv``: each model's bpb scored through the windows of each model row
    (``row_key``), so a model row is read against references that saw exactly the context it saw."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]):
        self.bpb: Dict[Tuple[str, Tuple], float] = {}
        for r in rows:
            if not r.get("document") and r.get("protocol") not in (None, "", "split"):
                key = (r["protocol"], int(r["length"]), int(r["stride"]), int(r["window"]) if r["window"] else None)
                self.bpb[(r["model"], key)] = float(r["bpb"])
        self.models = list(dict.fromkeys(m for m, _ in self.bpb))
        self.keys = set(k for _, k in self.bpb)

    def __bool__(self) -> bool:
        return bool(self.bpb)

    def at(self, model: str, key) -> Optional[float]:
        return self.bpb.get((model, key)) if key is not None else None

    def row(self, key) -> Dict[str, float]:
        """{model: bpb} through the windows ``key``."""
        return {m: self.bpb[(m, key)] for m in self.models if (m, key) in self.bpb}

    def for_metric(self, model: str, runs: Sequence[Run], metric: str) -> Optional[float]:
        """``model``'s bpb through the windows of ``metric``'s row (the test's for ``test/bpb``)."""
        for run in runs:
            if metric == "test/bpb":
                return self.at(model, test_key(run))
            row = row_for(run, metric)
            if row:
                return self.at(model, row_key(row))
        return None

    def unigram(self, runs: Sequence[Run], metric: str) -> Optional[float]:
        """The collapse bar of ``metric``'s row: the unigram scored through that row's windows."""
        return self.for_metric("unigram", runs, metric)


def needed_keys(groups: Mapping[str, Sequence[Run]]) -> List[Tuple]:
    """Every model row of the runs, as ``row_key``: the test's, then each extrapolation row's windows."""
    keys = {test_key(run) for runs in groups.values() for run in runs} - {None}
    keys |= {
        row_key(r) for runs in groups.values() for run in runs for r in run.extrapolation if r.get("status") == "ok"
    }
    return sorted(keys, key=lambda k: (k[1], k[0] != "windows" or k[2] != k[1], k[0], k[2], k[3] or 0))


def read_references(folder: Path) -> Optional[References]:
    """The rows of ``folder/references.csv`` (the split's rows, not each document's), or None without it."""
    path = folder / "references.csv"
    if not path.is_file():
        return None
    return References(read_rows(path)[1])


def references(groups: Mapping[str, Sequence[Run]], out: Path) -> Tuple[Optional[References], str]:
    """(the reference rows, a note): read from ``out/references.csv`` when it holds a row for every model row of
    the runs, else fitted now on the corpus the runs name (their data config), when its test split has the bytes
    the runs scored, scored through each model row's windows and written there."""
    path = out / "references.csv"
    keys = needed_keys(groups)
    found = read_references(out)
    if found is not None and set(keys) <= found.keys:
        return found, ""
    splits, why = runs_corpus(groups)
    if splits is None:
        return None, f"no reference rows: {why}"
    try:
        from linrope.evaluation.references import fitted, window_rows, write_csv
    except Exception as e:  # noqa: BLE001 - as a corpus that cannot be read: the report goes on without the rows
        return None, f"no reference rows: the runs' corpus cannot be read here ({str(e).splitlines()[0][:120]})"
    models = fitted(splits["train"], REFERENCE_ORDERS)
    rows = window_rows(models, splits["test"], "test", keys, documents=splits.documents["test"])
    write_csv(rows, path)
    return References(rows), ""


# ---- the section ---------------------------------------------------------------------------------------------
def _fmt(x: Optional[float], digits: int = 3, sign: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _span(lo: Optional[float], hi: Optional[float]) -> str:
    return f"[{_fmt(lo, sign=True)}, {_fmt(hi, sign=True)}]"


def section(
    groups: Mapping[str, Sequence[Run]],
    comparisons: Sequence[Tuple[str, str, str, str]],
    out: Path,
    refs_and_note: Optional[Tuple[Optional[Dict[str, float]], str]] = None,
) -> Tuple[List[str], List[Dict[str, Any]]]:
    """(markdown lines, evidence.csv rows) of the runs' evidence; ``comparisons``: (text, metric, A, B);
    ``refs_and_note``: what ``references`` gave, when the caller has asked it already."""
    lines = ["## Evidence", ""]
    refs, note = refs_and_note if refs_and_note is not None else references(groups, out)
    grouping, grouping_why = document_clusters(groups, out)
    # scored text
    body = []
    for label, runs in groups.items():
        tests = {(run.value("test/bytes", "last"), run.value("test/documents", "last")) for run in runs}
        tests = {t for t in tests if t[0] is not None}  # a run still training has no test yet
        tested = "; ".join(f"{int(b):,} bytes, {int(d)} documents" for b, d in sorted(tests)) or "–"
        rows = sorted({(r["scored"], r.get("documents")) for run in runs for r in run.extrapolation})
        body.append([label, str(len(runs)), tested, "; ".join(f"{s:,} bytes, {d} documents" for s, d in rows) or "–"])
    lines += [
        "**Scored text.**  What each configuration's test and extrapolation rows scored (every row of a run scores "
        "the same bytes).",
        "",
        markdown_table(["configuration", "runs", "test", "extrapolation rows"], body),
        "",
    ]
    # references
    if refs:
        first = next(run for runs in groups.values() for run in runs)
        rows = [
            [reference_row_text(key, key == test_key(first)), *(_fmt(refs.at(m, key)) for m in refs.models)]
            for key in needed_keys(groups)
        ]
        lines += [
            "**Reference rows** (fitted on the train split, scored on the same test bytes through the same windows as "
            "each model row, so each byte sees no more context than the models saw there; references.csv).  A run "
            "above the unigram of its row has collapsed.",
            "",
            markdown_table(["row (windows)", *(f"{m} bpb" for m in refs.models)], rows),
            "",
        ]
    elif note:
        lines += [f"**Reference rows:** {note}.", ""]
    # seeds
    outcome = {}
    body = []
    for label, runs in groups.items():
        unigram = refs.unigram(runs, "test/bpb") if refs else None
        o = seed_outcomes({run.seed: run.value("test/bpb", "last") for run in runs}, worse_above=unigram, fails="stall")
        outcome[label] = o
        body.append([label, o.text()])
    lines += [
        "**Seeds** (test bpb; a seed that diverged or scored above the unigram is counted, not averaged).",
        "",
        markdown_table(["configuration", "test bpb over seeds"], body),
        "",
    ]
    lines += collapse_lines(groups, refs)
    lines += cluster_lines(groups, grouping, grouping_why)
    # comparisons
    family, records, notes, collapses = [], [], [], []
    for text, metric, a, b in comparisons:
        if a not in groups or b not in groups or not all(documents_of(groups[c], metric) for c in (a, b)):
            continue  # a configuration, or the row the metric names, is not in these runs
        kept = {c: [r for r in groups[c] if r.seed not in outcome[c].failed] for c in (a, b)}
        cells = {c: documents_of(kept[c], metric) for c in (a, b)}  # a seed diverged at this row: left out too
        shared, estimate = shared_bpb_difference(cells, a, b, clusters=grouping)
        diverged = {c: diverged_at(kept[c], metric) for c in (a, b)}
        dropped = {c: sorted(map(str, [*outcome[c].failed, *diverged[c]])) for c in (a, b)}
        why = "; ".join(f"{c} {', '.join(s)}" for c, s in dropped.items() if s)
        family.append((f"{a} − {b} ({metric})", estimate))
        notes.append(why and f"failed seeds left out: {why}")
        # a seed that diverged at this row counts as above its unigram (``above``): no verdict
        counted = {c: {*cells[c], *diverged[c]} for c in (a, b)}
        collapses.append(above_unigram(groups, refs, metric, (a, b), counted) if metric != "test/bpb" else "")
        records.append(
            {
                "claim": text,
                "metric": metric,
                "a": a,
                "b": b,
                "seeds": len(shared),
                "clusters": None if estimate is None else estimate.clusters or estimate.documents,
                "p_floor": None if estimate is None else estimate.p_floor,
            }
        )
    adjusted = adjust(family)
    body = []
    for record, adj, why, at_row in zip(records, adjusted, notes, collapses):
        collapsed = any(not outcome[c].kept for c in (record["a"], record["b"]))  # every seed failed
        verdict = (
            "resolved" if adj.resolved else "not resolved" if adj.p_holm is not None else "no test (fewer than 2 seeds)"
        )
        verdict = "no verdict (every seed failed)" if collapsed else verdict
        if at_row and not collapsed:
            verdict = f"no verdict (above the unigram at this row: {at_row})"
        record.update(
            diff=adj.value,
            lo=adj.lo,
            hi=adj.hi,
            p=adj.p,
            p_holm=adj.p_holm,
            p_bh=adj.p_bh,
            family_lo=adj.family_lo,
            family_hi=adj.family_hi,
            verdict=verdict,
            above_unigram=at_row,
            note=why or "",
        )
        a_b = f"{record['a']} − {record['b']}"
        body.append(
            [
                record["claim"] or a_b,
                a_b,
                record["metric"],
                f"{_fmt(adj.value, sign=True)} {_span(adj.lo, adj.hi)}",
                _span(adj.family_lo, adj.family_hi),
                *(adj.p_text(p) for p in (adj.p, adj.p_holm, adj.p_bh)),
                f"**{verdict}**" if verdict == "resolved" else verdict,
                str(record["seeds"]) + (f" ({why})" if why else ""),
            ]
        )
    if body:
        raw, holm, bh = resolved_count(adjusted)
        m = adjusted[0].m if adjusted else 0
        family_text = (
            f"family: the {m} comparison{'s' if m != 1 else ''} below with a test, simultaneous intervals at 1 − 0.05/{m}; "
            f"p raw, Holm (the "
            f"verdict) and Benjamini–Hochberg.  Resolved at 5%: {raw} raw, {holm} after Holm, {bh} after BH"
            + (f"; {sum(map(bool, collapses))} at a row above the unigram get no verdict." if any(collapses) else ".")
            if m
            else "no comparison has two seeds left to test."
        )
        lines += [
            f"**Comparisons** (A − B in bpb, below 0: A better; failed seeds left out).  Interval: 95%, from a paired "
            f"bootstrap that resamples both the seeds and the clusters of test documents (linrope.analysis.bootstrap: "
            f"a t interval on the bootstrap's per-level variances); {family_text}  {floor_text(adjusted)}",
            "",
            markdown_table(
                ["claim", "A − B", "metric", "A − B [95%]", "simultaneous", "p", "p Holm", "p BH", "verdict", "seeds"],
                body,
            ),
            "",
        ]
    lines += position_lines(groups, out)
    return lines, records


PER_OCTAVE = 4  # the figure's bins beyond the first four buckets: log-spaced, as its x axis


def log_bins(buckets: Sequence[Mapping[str, Any]]) -> List[Tuple[float, int, float]]:
    """Equal-width position buckets (start, end, bytes, nats) merged into bins even on a log axis: the first four
    buckets as they are, then PER_OCTAVE bins per doubling; (mid-point, bytes, nats) per bin, exact sums.  Equal
    buckets on a log axis crowd the right end with noisy points (64 of 32 bytes at 2 048, most beyond 512)."""
    if not buckets:
        return []
    width = max(1, min(d["end"] - d["start"] for d in buckets))
    bins: Dict[int, List[Any]] = {}
    for d in buckets:
        key = (
            d["start"] // width
            if d["start"] < 4 * width
            else 4 * PER_OCTAVE + int(math.floor(PER_OCTAVE * math.log2(d["start"] / (4 * width))))
        )
        b = bins.setdefault(key, [d["start"], d["end"], 0, 0.0])
        b[0], b[1] = min(b[0], d["start"]), max(b[1], d["end"])
        b[2] += d["bytes"]
        b[3] += d["nats"]
    return [((lo + hi) / 2, n, nats) for lo, hi, n, nats in (bins[k] for k in sorted(bins))]


def position_lines(groups: Mapping[str, Sequence[Run]], out: Path) -> List[str]:
    """The loss by position at the longest non-overlapping length, beside its context-limited control."""
    table, curves = [], []
    windows: set = set()  # the context-limited controls' windows
    found = {
        label: [
            r for run in runs for r in run.extrapolation if r.get("per_position") and r.get("protocol") == "windows"
        ]
        for label, runs in groups.items()
    }
    if not any(found.values()):
        return []
    # one set of bands for every row: from the training context and the longest length of any configuration (a
    # configuration that stops shorter, e.g. a learned table, has "–" past its own)
    top = max(r["length"] for rows in found.values() for r in rows)
    context = train_context(next(runs[0] for label, runs in groups.items() if found[label])) or 1
    edges = sorted({e for e in (0, context // 2, context, 2 * context, top // 2, top) if e <= top})
    for i, (label, runs) in enumerate(groups.items()):
        rows = found[label]
        if not rows:
            continue
        longest = max(r["length"] for r in rows)
        for window in (None, *sorted({r.get("window") for r in rows if r.get("window")})):
            picked = [
                r for r in rows if r["length"] == longest and r.get("window") == window and r["scaling"] == "none"
            ]
            if not picked:
                continue
            points: Dict[float, List[float]] = {}
            for r in picked:
                for mid, n, nats in log_bins(r["per_position"]):
                    points.setdefault(mid, []).append(nats / n / LN2)
            name = label if window is None else f"{label}, last {window} keys"
            windows |= {window} - {None}
            style = {"color": series_colour(i), "linestyle": "-" if window is None else ":"}
            curves.append((str(runs[0].get("model.attention.kind") or ""), Curve(name, points, style)))  # its panel
            bands = []
            for lo, hi in zip(edges, edges[1:]):
                per_run = []
                for r in picked:
                    band = [d for d in r["per_position"] if lo <= d["start"] < hi]
                    n = sum(d["bytes"] for d in band)
                    if n:
                        per_run.append(sum(d["nats"] for d in band) / n / LN2)
                bands.append(_fmt(sum(per_run) / len(per_run)) if per_run else "–")
            table.append([name, str(longest), *bands])
    if not table:
        return []
    header = ["configuration", "length", *(f"positions {lo}–{hi - 1}" for lo, hi in zip(edges, edges[1:]))]
    kinds = sorted({k for k, _ in curves})  # a panel per attention kind when both are there
    panels = [
        Panel(f"{k} attention" if len(kinds) > 1 and k else "", [c for kc, c in curves if kc == k]) for k in kinds
    ]
    png = plot_curves(
        panels,
        out / "positions.png",
        xlabel="position in the window (bytes before the target; log-spaced bins)",
        ylabel="bits per byte",
        title="Loss by position, non-overlapping windows at the longest length"
        + (f" (dotted: attention to the last {', '.join(map(str, sorted(windows)))} keys only)" if windows else ""),
        log2_x=True,
        vlines=[train_context(next(iter(groups.values()))[0]) or 0],
        vline_label="training context",
    )
    return [
        "**Loss by position** (bpb, mean over seeds, non-overlapping windows at the longest length; a position "
        "beyond the training context is a distance never trained on; the control sees at most the training "
        "context).  The control is not the training distribution either: beyond the training context none of its "
        "keys starts a window, and in a deeper layer each kept key was computed from keys further back; so read "
        "its rows against the positions below the training context as well as against the full model.",
        "",
        markdown_table(header, table),
        "",
        *([f"![loss by position]({png.name})", ""] if png else []),
    ]
