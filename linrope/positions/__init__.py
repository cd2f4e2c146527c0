"""Layer 2, position schemes (may import: linrope.base, linrope.ops). Position schemes (docs/schemes.md): one module per scheme, one interface (``base.PositionScheme``).

``build_position(name, where=..., **dims, **options)`` builds a scheme by name, its options checked first;
``build_shared(name, **dims, **options)`` the part its paper shares across layers (or None);
``check_pairing(attention_kind, name, options)`` refuses pairings linear attention cannot take;
``model_problems(name, options, head_dim=..., max_len=..., causal=...)`` what a scheme's options ask of the model
(randomized positions' range against a table of ``max_len`` rows; the scheme's ``dims_problems``);
``option_errors(name, options)`` names the options a scheme does not take (and the nearest it does) or whose
values it refuses, before anything is built: a scheme's options are its constructor's annotated keyword
arguments (``linrope.base.options``), read here and nowhere else.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import Any, Dict, List, Mapping, Optional

from linrope.base.errors import IncompatiblePairing
from linrope.base.options import Option, declared, defaults
from linrope.base.options import option_errors as declared_errors

from .base import DIMS, REGISTRY, PositionScheme, register
from .functional import alibi_slopes, relative_distance, t5_bucket
from .randomized import linear_problem, table_problems

# one module per scheme, which registers its class (``register``) when imported: every module of this folder is
# imported here, so a new scheme is its module alone, with no list to extend; the registry is the one list of schemes
# that the rest of the code and the tests read
for _m in pkgutil.iter_modules(__path__):
    import_module(f"{__name__}.{_m.name}")
SCHEME_MODULES = tuple(sorted({cls.__module__.rsplit(".", 1)[1] for cls in REGISTRY.values()}))


def scheme_class(name: str):
    if name not in REGISTRY:
        raise ValueError(f"unknown position scheme {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def scheme_options(cls) -> Dict[str, Option]:
    """{option: Option} of a scheme: its constructor's keyword arguments and its base's, less the model's
    dimensions (``share`` only where the paper shares something)."""
    return {k: r for k, r in declared(cls, skip=DIMS).items() if k != "share" or cls.shares}


def scheme_settings(name: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """Every option of the scheme ``name``: ``options`` over its defaults."""
    return {**{k: v for k, v in defaults(scheme_class(name)).items() if k not in DIMS}, **options}


def option_errors(name: str, options: Mapping[str, Any], where: str = "model.position") -> List[str]:
    """One line per option the scheme ``name`` does not take (naming the nearest it does), else per value it
    refuses, else per problem of several options (``option_problems``)."""
    if name not in REGISTRY:
        return [f"{where}.name={name}: expected one of {', '.join(sorted(REGISTRY))}"]
    cls = REGISTRY[name]
    # share: known to every scheme, so that one that shares nothing says why not (option_problems)
    errors = declared_errors(scheme_options(cls), options, where, also=("share",))
    return errors or [f"{where}: {e}" for e in cls.option_problems(scheme_settings(name, options))]


def build_position(name: str, *, where: str, d_model: int, n_heads: int, head_dim: int, max_len: int,
                   causal: bool = True, shared: Optional[PositionScheme] = None, **options) -> PositionScheme:  # fmt: skip
    """The scheme ``name`` in the role ``where``; its options checked first (``ValueError``, one line each)."""
    errors = option_errors(name, options, where=name)
    if not errors:
        settings = scheme_settings(name, options)
        errors = [
            f"{name}: {e}"
            for e in REGISTRY[name].dims_problems(settings, head_dim=head_dim, max_len=max_len, causal=causal)
        ]
    if errors:
        raise ValueError("\n".join(errors))
    return scheme_class(name)(where=where, d_model=d_model, n_heads=n_heads, head_dim=head_dim,
                              max_len=max_len, causal=causal, shared=shared, **options)  # fmt: skip


def build_shared(name: str, **dims_and_options) -> Optional[PositionScheme]:
    """The scheme in its shared role (the parameters its paper shares across layers, built once, to be
    handed to every layer as ``shared=``); None if it shares nothing or its option (given, else the scheme's
    default: FIRE's is false, as its paper) says ``share: false``."""
    cls = scheme_class(name)
    if not cls.shares or dims_and_options.get("share", defaults(cls).get("share")) is False:
        return None
    return build_position(name, where="shared", **dims_and_options)


def check_pairing(attention_kind: str, name: str, options: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse, in one line, a position scheme (with ``options``) that linear attention cannot take."""
    cls = scheme_class(name)
    if attention_kind == "linear" and cls.linear_ok and options is not None:
        settings = scheme_settings(name, options)
        problem = linear_problem(name, cls.linear_decays(settings), settings.get("max_position"))
        if problem:
            raise IncompatiblePairing(problem)
    if attention_kind == "linear" and not cls.linear_ok:
        raise IncompatiblePairing(
            f"attention=linear with position={name} cannot work: {name} is a {cls.kind} scheme that acts on the "
            f"N×N score matrix{(' (' + cls.linear_note + ')') if cls.linear_note else ''}, and linear attention never "
            f"forms it; linear attention takes: {', '.join(n for n, c in sorted(REGISTRY.items()) if c.linear_ok)}"
        )


def model_problems(name: str, options: Mapping[str, Any], *, head_dim: int, max_len: int, causal: bool) -> List[str]:
    """One line per thing the scheme ``name`` with ``options`` asks of the model that it lacks: a table of
    ``max_len`` rows that randomized positions (``max_position``) would overrun; what its ``dims_problems`` name."""
    cls, settings = scheme_class(name), scheme_settings(name, options)
    found = table_problems(name, cls.bounded_by_max_len(settings), settings.get("max_position"), max_len)
    dims = cls.dims_problems(settings, head_dim=head_dim, max_len=max_len, causal=causal)
    return found + [f"model.position: {e}" for e in dims]


__all__ = [
    "PositionScheme",
    "REGISTRY",
    "register",
    "build_position",
    "build_shared",
    "check_pairing",
    "model_problems",
    "option_errors",
    "scheme_class",
    "scheme_settings",
    "IncompatiblePairing",
    "relative_distance",
    "t5_bucket",
    "alibi_slopes",
    "SCHEME_MODULES",
]
