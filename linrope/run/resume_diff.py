"""What a resume changes: the settings of the checkpoint's run against the new run's, old → new per key.

``resume_record(checkpoint, ckpt_path, new_cfg, new_unresolved)`` compares the checkpoint's saved config
(``linrope.run.provenance.CONFIG_KEY``; a checkpoint written before it holds only ``hyper_parameters``: its model
and optim, and its data module's settings) with the new run's resolved config and returns the changes, one
line each (``resume: context 64 → 128 (also data.context, model.max_len) — the data order …``), and the chain
of runs the new one continues (run folder, step, commit of each).  Keys that follow another changed key through
an interpolation (``model.max_len: ${context}``) are folded into its line.  Changes to the seed, the batch
size, the context or the data are announced as breaking the reproducibility of the data order; a change of
the model's identity is refused elsewhere (``linrope.models.spec.check_identity``).

Foundation layer: plain dicts in, plain dicts out (no torch, no Lightning)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from linrope.base.atomic import atomic_write_bytes
from linrope.base.nested import ABSENT, differing, flatten, under
from linrope.run.folder import aside
from linrope.run.provenance import CONFIG_KEY, PROVENANCE_KEY, commit_text

# settings that cannot change what a run computes: where it writes, how it logs and shows progress, how it resumes
HOUSEKEEPING = tuple(
    "paths. hydra. ckpt_path logger. tags task_name trainer.default_root_dir trainer.enable_progress_bar "
    "data.num_workers".split()
)
# settings that differ between a run and its continuation by construction (besides those: what to do now, output)
NOT_COMPARED = HOUSEKEEPING + ("train", "test", "callbacks.", "extrapolation.")
# settings that decide which examples come in which order: changing them breaks the data order's reproducibility
DATA_ORDER = ("seed", "context", "data.")
DATA_ORDER_NOTE = "the data order no longer reproduces the uninterrupted run"
# the optimizer's settings that its saved state restores over the new config's (Lightning loads the AdamW state
# and the scheduler's base rates): changing them on a resume does nothing
RESTORED = ("optim.lr", "optim.betas", "optim.weight_decay")
INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


def saved_config(checkpoint: Mapping[str, Any]) -> tuple:
    """(flat config of the checkpoint's run, whether it is the whole config)."""
    whole = checkpoint.get(CONFIG_KEY)
    if isinstance(whole, Mapping):
        return flatten(whole), True
    hp = checkpoint.get("hyper_parameters") or {}
    part = {"model": hp.get("model") or {}, "optim": hp.get("optim") or {}}
    if checkpoint.get("datamodule_hyper_parameters"):
        part["data"] = dict(checkpoint["datamodule_hyper_parameters"])
    return flatten(part), False


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(_show, v)) + "]"
    return str(v)


def changes(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    whole: bool = True,
    new_unresolved: Optional[Mapping[str, Any]] = None,
) -> List[Dict[str, Any]]:
    """``[{"key", "old", "new", "also": [folded keys], "data_order": bool}]`` for the compared keys that differ.
    ``whole``: ``old`` is a run's whole config (else only keys ``old`` holds are compared)."""
    differ = {k: (a, b) for k, a, b in differing(old, new, NOT_COMPARED, keys=None if whole else sorted(old))}
    raw = new_unresolved or {}
    follows = {}
    for k in differ:
        m = INTERPOLATION.match(str(raw.get(k, "")))
        if m and m.group(1) in differ and m.group(1) != k and differ[m.group(1)] == differ[k]:
            follows[k] = m.group(1)
    out = []
    for k, (a, b) in differ.items():
        if k in follows:
            continue
        also = sorted(f for f, src in follows.items() if src == k)
        old, new = (None if v is ABSENT else v for v in (a, b))
        data_order = under(k, DATA_ORDER) or any(under(f, DATA_ORDER) for f in also)
        line = f"resume: {k} {_show(a)} → {_show(b)}" + (f" (also {', '.join(also)})" if also else "")
        line += f" — {DATA_ORDER_NOTE}" if data_order else ""
        if k in RESTORED:
            line += f" — no effect: the optimizer state restored from the checkpoint keeps {_show(old)}"
        out.append(dict(key=k, old=old, new=new, line=line, also=also, data_order=data_order, no_effect=k in RESTORED))
    return out


def chain(checkpoint: Mapping[str, Any], ckpt_path: Path) -> List[Dict[str, Any]]:
    """The runs the new run continues, oldest first: the checkpoint's own chain, then the checkpoint's run."""
    from linrope.run.folder import run_folder  # hydra: not for `linrope study`, which reads HOUSEKEEPING here

    prov = checkpoint.get(PROVENANCE_KEY) or {}
    earlier = [dict(e) for e in (prov.get("resumed_from") or []) if isinstance(e, Mapping)]
    code = prov.get("linrope") or {}
    run = {
        "run": str(run_folder(ckpt_path)),
        "checkpoint": str(ckpt_path),
        "step": checkpoint.get("global_step"),
        "commit": code.get("commit"),
        "dirty": code.get("dirty"),
        "started": prov.get("started"),
    }
    return earlier + [run]


def code_change(saved: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]]) -> Optional[str]:
    """``resume: the code changed: …`` when the checkpoint's run and this one recorded different code
    (linrope.run.provenance's ``code``, the hash of linrope/ and conf/ with any local edits; the commit where a
    run recorded no code hash), else None — also when either side recorded nothing to compare."""
    ours, theirs = ((p or {}).get("linrope") or {} for p in (current, saved))
    if ours.get("code") and theirs.get("code"):
        if ours["code"] == theirs["code"]:
            return None
        old, new = f"code {theirs['code']} ({commit_text(saved)})", f"code {ours['code']} ({commit_text(current)})"
    elif theirs.get("commit") and ours.get("commit") and commit_text(saved) != commit_text(current):
        old, new = commit_text(saved), commit_text(current)
    else:
        return None
    return (
        f"resume: the code changed: the checkpoint was written by {old}, this run is {new} — the continued "
        f"run is not what either code alone trains"
    )


def resume_record(
    checkpoint: Mapping[str, Any],
    ckpt_path,
    new_cfg: Mapping[str, Any],
    new_unresolved: Optional[Mapping[str, Any]] = None,
    current: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """What ``resume.json`` holds: the checkpoint, its commit, the changes (with their lines) and the chain.
    ``current``: this run's provenance; code that differs from the checkpoint's is the first line."""
    old, whole = saved_config(checkpoint)
    found = changes(
        old,
        flatten(new_cfg),
        whole=whole,
        new_unresolved=flatten(new_unresolved) if new_unresolved is not None else None,
    )
    code = code_change(checkpoint.get(PROVENANCE_KEY), current)
    return {
        "checkpoint": str(ckpt_path),
        "step": checkpoint.get("global_step"),
        "commit": commit_text(checkpoint.get(PROVENANCE_KEY)),
        "compared": "the whole config" if whole else "model, optim and data (an older checkpoint)",
        "code_changed": code is not None,
        "changes": found,
        "lines": ([code] if code else []) + [c["line"] for c in found],
        "continues": chain(checkpoint, Path(ckpt_path)),
    }


def announce(record: Mapping[str, Any], folder: Path, name: str = "resume.json") -> None:
    """Print the record's lines and write it to ``<folder>/resume.json`` (a list: one entry per resume)."""
    for line in record["lines"]:
        print(line, flush=True)
    path = Path(folder) / name
    try:
        earlier = json.loads(path.read_text()) if path.is_file() else []
    except (ValueError, OSError) as e:  # damaged: kept beside, never written over (the earlier resumes are in it)
        kept = aside(path.parent, f"{path.stem}.unreadable-", path.suffix)
        path.rename(kept)
        print(f"linrope: {path} could not be read ({type(e).__name__}); kept as {kept.name}", flush=True)
        earlier = []
    earlier = earlier if isinstance(earlier, list) else [earlier]
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(earlier + [dict(record)], indent=2, default=str, ensure_ascii=False) + "\n"
    atomic_write_bytes(text.encode(), path)


# ---- a checkpoint against the current code (evaluate, generate) -------------------------------------------------
def default_differences(model_cfg: Mapping[str, Any], conf_dir: Path) -> List[str]:
    """The options today's ``conf/attention/<kind>.yaml`` and ``conf/position/<name>.yaml`` set that the
    checkpoint's model config does not hold: the model is built with today's default for them, which may not
    be what it was trained with."""
    import yaml  # PyYAML comes with Hydra; only the two small files are read

    out = []
    for group, key in (("attention", "kind"), ("position", "name")):
        saved = dict((model_cfg or {}).get(group) or {})
        path = Path(conf_dir) / group / f"{saved.get(key)}.yaml"
        try:
            today = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        out += [
            f"model.{group}.{k} is not in the checkpoint: built with today's default {_show(v)}"
            for k, v in today.items()
            if k not in saved and not str(k).startswith(("_", "defaults"))
        ]
    return out


def describe_checkpoint(
    checkpoint: Mapping[str, Any], ckpt_path, conf_dir: Path, current: Optional[Mapping[str, Any]] = None
) -> str:
    """One line: the checkpoint's step, commit and versions, when its run started and when the file was written,
    whether today's code is another commit, and the options the current code's defaults decide
    (``default_differences``)."""
    prov = checkpoint.get(PROVENANCE_KEY)
    head = f"checkpoint {ckpt_path}: step {checkpoint.get('global_step', '?')}"
    if prov:
        versions = prov.get("versions") or {}
        head += f", commit {commit_text(prov)}, torch {versions.get('torch')}, run started {prov.get('started')}"
        try:  # when the file was written (its modification time, UTC)
            mtime = datetime.fromtimestamp(Path(str(ckpt_path)).stat().st_mtime, timezone.utc)
            head += f", written {mtime.isoformat(timespec='seconds')}"
        except OSError:
            pass
        if current and commit_text(current) != commit_text(prov):
            head += f" (this code: {commit_text(current)})"
    else:
        head += ", no provenance recorded (written before linrope recorded it)"
    model = (checkpoint.get("hyper_parameters") or {}).get("model") or {}
    defaults = default_differences(model, conf_dir)
    return head + ("; " + "; ".join(defaults) if defaults else "")
