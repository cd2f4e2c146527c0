"""Nested configs as plain data: ``get`` reads one dotted key, ``flatten`` makes every leaf a dotted key.

A config is a nested mapping: a ``dict`` (a checkpoint's saved config, ``OmegaConf.to_container``) or an
OmegaConf ``DictConfig`` (a ``Mapping`` too).  Every layer that reads or compares configs uses these two,
so that a dotted key means the same thing everywhere: the config checks, the sweep objective's check, a
checkpoint's identity, a resume's changes, a study's job identity and a report's grouping of runs."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from linrope.base.moved import current_name


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
    """A nested config as ``{dotted key: value}`` (``prefix`` before every key); a ``_target_`` saved before a
    module moved reads as its path today (``linrope.base.moved``), so a folder saved then is the same
    configuration as one composed now."""
    if not isinstance(node, Mapping):
        key = prefix[:-1]
        return {key: current_name(node) if key.endswith("_target_") and isinstance(node, str) else node}
    out: Dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out
