"""Nested configs as plain data: ``get`` reads one dotted key, ``flatten`` makes every leaf a dotted key,
``differing`` lists the keys where two configs differ.

A config is a nested mapping: a ``dict`` (a checkpoint's saved config, ``OmegaConf.to_container``) or an
OmegaConf ``DictConfig`` (a ``Mapping`` too).  Every layer that reads or compares configs uses these two,
so that a dotted key means the same thing everywhere: the config checks, the sweep objective's check, a
checkpoint's identity, a resume's changes, a study's job identity and a report's grouping of runs."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple


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


class _Absent:
    """What ``differing`` gives for a key one mapping lacks: shown ``(absent)``, equal to nothing but itself."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


def differing(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    skip: Iterable[str] = (),
    *,
    keys: Optional[Iterable[str]] = None,
    null_is_absent: bool = False,
) -> List[Tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each key of ``old`` or ``new`` in sorted order (or each of ``keys``, in their
    order) whose values differ, less the keys ``under`` one of ``skip``.  A key one mapping lacks has the value
    ``ABSENT``; ``null_is_absent``: a lacking key and one set to null do not differ."""
    lacking = None if null_is_absent else ABSENT
    found = []
    for k in sorted(set(old) | set(new)) if keys is None else keys:
        if not under(k, skip) and old.get(k, lacking) != new.get(k, lacking):
            found.append((k, old.get(k, ABSENT), new.get(k, ABSENT)))
    return found
