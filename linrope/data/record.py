"""What a data=text run read, recorded so that whatever reads its checkpoint again reads the same (issue 52).

``data_record(datamodule)``: the tokenizer (as typed, its absolute path, content hash and vocabulary) and the corpus
(its absolute path or HF dataset, the shard folder and key, documents and tokens).  The run's provenance holds it
(``linrope.run.provenance``: provenance.json and every checkpoint).  ``check_tokenizer`` and ``check_corpus``
compare it with what a resume, evaluate, passkey, the harness or generate would use now, and refuse another in one
``DataMismatch`` line naming both; a checkpoint without a record (written before it) is not checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from linrope.base.errors import DataMismatch, first_names

from .shards import MANIFEST, cache_key


def tokenizer_record(tok) -> Dict[str, Any]:
    return {"spec": tok.name, "path": tok.path, "sha256": tok.digest, "vocab_size": int(tok.vocab_size)}


def data_record(dm) -> Dict[str, Any]:
    """The record of a built ``TextDataModule`` (its tokenizer, source and shards)."""
    hp, m = dm.hparams, dm.shards.manifest
    path = hp.get("path")
    hf = hp.get("hf_dataset")
    return {
        "tokenizer": tokenizer_record(dm.tokenizer),
        "corpus": {
            "path": str(Path(str(path)).expanduser().absolute()) if path and not hf else None,
            "hf": [hf, hp.get("hf_config"), hp.get("hf_split")] if hf else None,
            "shards": str(Path(dm.folder).resolve()),
            "key": m.get("key"),
            "content": content_key(m),
            "documents": int(m.get("documents", 0)),
            "tokens": int(m.get("tokens", 0)),
        },
    }


def content_key(manifest: Mapping[str, Any]) -> str:
    """The shards' key less the tokenizer's name as typed (``tok.json`` or its absolute path: one file, by hash)."""
    settings = dict(manifest.get("settings") or {})
    settings["tokenizer"] = {k: v for k, v in (settings.get("tokenizer") or {}).items() if k != "name"}
    return cache_key({k: v for k, v in (manifest.get("source") or {}).items() if k != "root"}, settings)


def _shown(t: Mapping[str, Any]) -> str:
    return f"{t.get('path') or t.get('spec')} (sha256 {t.get('sha256')}, {t.get('vocab_size')} tokens)"


def check_tokenizer(saved: Optional[Mapping[str, Any]], tok, who: str, hint: str) -> None:
    """``tok`` is the tokenizer of ``saved`` (a record's ``tokenizer``), by content hash; else one line."""
    if not saved or not saved.get("sha256") or saved["sha256"] == tok.digest:
        return
    raise DataMismatch(
        f"{who}: tokenizer {tok.name} is {_shown(tokenizer_record(tok))}, not the run's: {_shown(saved)}; {hint}"
    )


def check_corpus(saved: Optional[Mapping[str, Any]], now: Mapping[str, Any], who: str, hint: str) -> None:
    """The shards of ``now`` (a record's ``corpus``) are those of ``saved``, by key; else one line naming the files
    that changed (read from the run's manifest, when its shard folder is still there) or the settings."""
    if not saved or not saved.get("content") or saved["content"] == now.get("content"):
        return
    where = f"data.hf_dataset={now['hf'][0]}" if now.get("hf") else f"data.path {now.get('path') or '(default)'}"
    what = _differences(Path(str(saved.get("shards"))), Path(str(now.get("shards"))))
    raise DataMismatch(
        f"{who}: the corpus differs from the run's: {where} gives shards {now.get('key')} ({now.get('documents')} "
        f"documents, {now.get('tokens')} tokens), the run trained on {saved.get('key')} ({saved.get('documents')} "
        f"documents, {saved.get('tokens')} tokens){what}; {hint}"
    )


def _differences(old: Path, new: Path, limit: int = 3) -> str:
    try:
        a, b = (json.loads((f / MANIFEST).read_text()) for f in (old, new))
    except (OSError, ValueError):
        return f" (its manifest {old / MANIFEST} is gone: what changed cannot be named)"
    files = [{f["path"]: f.get("sha256") for f in (m.get("source") or {}).get("files", [])} for m in (a, b)]
    said: List[str] = [f"{p} added" for p in files[1] if p not in files[0]]
    said += [f"{p} removed" for p in files[0] if p not in files[1]]
    said += [f"{p} changed" for p in files[1] if p in files[0] and files[0][p] != files[1][p]]
    if not said:
        sa, sb = a.get("settings") or {}, b.get("settings") or {}
        said = [f"{k} {sa.get(k)} → {sb.get(k)}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    return f": {first_names(said, limit, more=' and')}" if said else ""
