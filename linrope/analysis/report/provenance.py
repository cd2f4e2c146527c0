"""The provenance section of ``linrope report``: which code, libraries and machines produced a study's runs.

A run without its own ``provenance.json`` (linrope.run.provenance) takes the study's, in a sweep folder or the
report's output folder.  Runs of more than one code (the committed ``linrope/`` and ``conf/`` with local changes; the
commit for runs that predate it) or torch version are named in one line at the top of the report, and refused unless
``--allow-mixed``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from linrope.analysis.cells import markdown_table
from linrope.run.provenance import code_text, commit_text
from linrope.run.provenance import read as read_provenance


def fill_in(runs: Sequence[Any], folders: Sequence[Path]) -> Optional[Dict[str, Any]]:
    """Give the runs without provenance the first study file found in ``folders`` (its ``source`` says so);
    returns that file, or None."""
    study = next((p for p in (read_provenance(f) for f in folders) if p), None)
    if study is not None:
        for r in runs:
            if r.provenance is None:
                r.provenance = {**study, "source": "study"}
    return study


def _versions(p: Mapping[str, Any]) -> Mapping[str, Any]:
    return p.get("versions") or {}


def _machine(p: Mapping[str, Any]) -> str:
    m = p.get("machine") or {}
    where = m.get("gpu") or m.get("cpu") or "not recorded"
    threads = f"{m['threads']} thread{'s' * (m['threads'] != 1)}" if m.get("threads") else ""
    extra = f"{m.get('gpu_driver')} driver" if m.get("gpu") else threads
    return f"{where}" + (f" ({extra})" if extra else "")


def mixed(runs: Sequence[Any]) -> Optional[str]:
    """One line when the runs come from more than one code or torch version, else None."""
    known = [r.provenance for r in runs if r.provenance]
    codes = sorted({code_text(p) for p in known})
    torches = sorted({str(_versions(p).get("torch")) for p in known})
    parts = []
    if len(codes) > 1:
        what = "commits" if not any(c.startswith("code ") for c in codes) else "versions of the code"
        parts.append(f"{len(codes)} {what} ({', '.join(codes)})")
    if len(torches) > 1:
        parts.append(f"{len(torches)} torch versions ({', '.join(torches)})")
    return f"the runs come from {' and '.join(parts)}" if parts else None


def section(runs: Sequence[Any]) -> List[str]:
    """``## Provenance``: one row per (code, versions, machine, precision) with its commits and run count."""
    rows: Dict[Tuple, int] = {}
    commits: Dict[Tuple, List[str]] = {}
    notes: List[str] = []
    for r in runs:
        p = r.provenance
        if not p:
            key: Tuple = ("–", "not recorded") + ("–",) * 5
        else:
            v = _versions(p)
            key = (
                code_text(p),
                str((p.get("linrope") or {}).get("code") or "not recorded"),
                str(v.get("torch") or "not recorded"),
                str(v.get("lightning") or "not recorded"),
                str(v.get("python") or "not recorded"),
                _machine(p),
                str(p.get("precision") or "not recorded"),
            )
            if p.get("source") == "study" and p.get("determined") and p["determined"] not in notes:
                notes.append(p["determined"])
        rows[key] = rows.get(key, 0) + 1
        commit = commit_text(p) if p else "–"
        if commit not in commits.setdefault(key, []):
            commits[key].append(commit)
    header = ["code", "commits", "torch", "lightning", "python", "machine", "precision", "runs"]
    table = markdown_table(header, [[k[1], _commits(commits[k]), *k[2:], str(n)] for k, n in rows.items()])
    out = ["## Provenance", "", table, ""]
    if notes:
        out += [
            "Not recorded by the runs themselves (they predate linrope's provenance record); determined after "
            "the fact: " + " ".join(notes),
            "",
        ]
    return out


def _commits(found: List[str]) -> str:
    return ", ".join(found) if len(found) <= 3 else f"{', '.join(found[:2])} and {len(found) - 2} more"


def check(runs: Sequence[Any], allow_mixed: bool) -> Optional[str]:
    """The top line for mixed runs (or None); refuses (SystemExit, one line) unless ``allow_mixed``."""
    line = mixed(runs)
    if line and not allow_mixed:
        raise SystemExit(f"linrope report: {line}: pass --allow-mixed to report them together, or report each apart")
    return f"**Mixed provenance: {line}.**" if line else None


def computed_on(p: Optional[Mapping[str, Any]]) -> Optional[str]:
    """What computed a run: its processor (the GPU, else the CPU; not its thread count) and torch version (None without
    a provenance record)."""
    if not p:
        return None
    m = p.get("machine") or {}
    return f"{m.get('gpu') or m.get('cpu') or 'not recorded'}, torch {_versions(p).get('torch') or 'not recorded'}"


def mixed_pairs(groups: Mapping[str, Mapping[str, Sequence[Any]]], claims: Sequence[Any], arms: Sequence[str],
                names: Sequence[str]) -> List[str]:  # fmt: skip
    """A paragraph naming every paired seed of a claim whose two runs were computed on different machines or torch
    versions (``groups``: arm -> configuration -> runs; ``names``: each arm's label), or nothing when there is none:
    seed s of A on one machine and of B on another are not the computation either would be on one machine, so the
    difference holds the machines' difference as well."""
    found: Dict[Tuple[str, str, str], Dict[Tuple[str, str], List[Any]]] = {}
    for arm, name in zip(arms, names):
        for c in claims:
            on = [{r.seed: computed_on(r.provenance) for r in groups[arm].get(x, [])} for x in (c.a, c.b)]
            for s in sorted(on[0].keys() & on[1].keys(), key=str):
                if on[0][s] and on[1][s] and on[0][s] != on[1][s]:
                    seeds = found.setdefault((name, c.a, c.b), {}).setdefault((on[0][s], on[1][s]), [])
                    if s not in seeds:
                        seeds.append(s)
    if not found:
        return []
    items = []
    for (name, a, b), by in found.items():
        for (ma, mb), seeds in by.items():
            word = "seed" if len(seeds) == 1 else "seeds"
            items.append(f"{name}: {a} − {b}, {word} {', '.join(map(str, seeds))} ({a} on {ma}; {b} on {mb})")
    return [
        f"**Pairs from two machines** ({len(items)}): a seed run on one machine is not the same computation as that "
        "seed on another, so these paired differences also hold the machines' difference: " + "; ".join(items) + ".",
        "",
    ]
