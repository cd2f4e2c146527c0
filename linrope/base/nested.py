"""Nested configs as plain data: ``get`` reads one dotted key, ``flatten`` makes every leaf a dotted key.

A config is a nested mapping: a ``dict`` (a checkpoint's saved config, ``OmegaConf.to_container``) or an
OmegaConf ``DictConfig`` (a ``Mapping`` too).  Every layer that reads or compares configs uses these two,
so that a dotted key means the same thing everywhere: the config checks, the sweep objective's check, a
checkpoint's identity, a resume's changes, a study's job identity and a report's grouping of runs."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping


def get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """The value at a dotted key (``model.attention.kind``), or ``default`` where a part is missing or a node on
    the way is no mapping (a key set to null reads as None)."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    """A nested config as ``{dotted key: value}`` (``prefix`` before every key).  A value is compared as saved: a
    run folder saved before linrope's modules moved into its layers is migrated once (tools/migrate_runs.py)."""
    if not isinstance(node, Mapping):
        return {prefix[:-1]: node}
    out: Dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def under(key: str, prefixes: Iterable[str]) -> bool:
    """Whether a dotted key is one of ``prefixes`` or lies below one that ends in a dot (``paths.``)."""
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes)
