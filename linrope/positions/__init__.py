"""Layer 2, position schemes (may import: linrope.base, linrope.ops). Position schemes (docs/schemes.md): one module per scheme, one interface (``base.PositionScheme``).

``build_position(name, where=..., **dims, **options)`` builds a scheme by name;
``build_shared(name, **dims, **options)`` the part its paper shares across layers (or None);
``check_pairing(attention_kind, name)`` refuses pairings linear attention cannot take;
``option_errors(name, options)`` names the options a scheme does not take (and the nearest it does) or whose
values it refuses, before anything is built.
"""
from __future__ import annotations

import inspect
from importlib import import_module
from typing import List, Optional, Set

from linrope.base.errors import IncompatiblePairing, UnknownOption
from linrope.ops.rope import SCALINGS
from linrope.base.options import Rule, value_errors

from .base import REGISTRY, PositionScheme, register
from .functional import alibi_slopes, relative_distance, t5_bucket

# one module per scheme; importing registers it
SCHEME_MODULES = ("none", "learned", "sinusoidal", "rope", "floater", "multiplicative", "shaw", "xl", "t5",
                  "deberta", "tupe", "alibi")
for _m in SCHEME_MODULES:
    import_module(f"{__name__}.{_m}")

from .multiplicative import TABLES  # noqa: E402 - registered above, in SCHEME_MODULES' order
from .shaw import VARIANTS  # noqa: E402


def scheme_class(name: str):
    if name not in REGISTRY:
        raise ValueError(f"unknown position scheme {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def scheme_options(cls) -> Set[str]:
    """The options a scheme takes (its keyword arguments and its base's, less the model's dimensions)."""
    names = set()
    for c in cls.__mro__:
        if "__init__" in vars(c) and issubclass(c, PositionScheme):
            names |= {p.name for p in inspect.signature(c.__init__).parameters.values()
                      if p.kind is inspect.Parameter.KEYWORD_ONLY}
    names -= {"where", "d_model", "n_heads", "head_dim", "max_len", "causal", "shared"}
    if not cls.shares:
        names.discard("share")
    return names


def _positive():
    return Rule("int", low=1)


# the allowed values of the schemes' options, by name (a scheme's constructor checks what depends on several)
OPTION_RULES = {
    "scaling": Rule("choice", choices=lambda: tuple(SCALINGS)),
    "factor": Rule("number", above=0), "base": Rule("number", above=0),
    "table": Rule("choice", choices=lambda: TABLES), "variant": Rule("choice", choices=lambda: VARIANTS),
    "k": _positive(), "num_buckets": _positive(), "max_distance": _positive(), "hidden": _positive(),
    "init_std": Rule("number", low=0, null=True),
}


def option_errors(name: str, options, where: str = "model.position") -> List[str]:
    """One line per option the scheme ``name`` does not take (naming the nearest it does) or whose value it
    refuses; a scheme's own constructor checks the rest (``check_options``)."""
    if name not in REGISTRY:
        return [f"{where}.name={name}: expected one of {', '.join(sorted(REGISTRY))}"]
    known = scheme_options(REGISTRY[name]) | {"share"}  # share: the base says why not, if it shares nothing
    unknown = [str(UnknownOption(f"{where}.{k}", known)) for k in options if k not in known]
    return unknown or value_errors(options, OPTION_RULES, where)


def build_position(name: str, *, where: str, d_model: int, n_heads: int, head_dim: int, max_len: int,
                   causal: bool = True, **options) -> PositionScheme:
    cls = scheme_class(name)
    unknown = sorted(set(options) - scheme_options(cls) - {"shared", "share"})  # share: the base says why not
    if unknown:
        raise ValueError(f"position scheme {name!r} has no option {', '.join(unknown)}; its options: "
                         f"{', '.join(sorted(scheme_options(cls))) or 'none'}")
    try:
        return cls(where=where, d_model=d_model, n_heads=n_heads, head_dim=head_dim, max_len=max_len,
                   causal=causal, **options)
    except TypeError as e:  # an option the scheme does not take
        raise ValueError(f"position scheme {name!r}: {e}") from None


def check_options(name: str, **dims_and_options) -> None:
    """Raise the scheme's own one-line ValueError for a bad or unknown option, cheaply: every scheme checks
    its options whatever its role, and the input role allocates no attention parameters."""
    build_position(name, where="input", **dims_and_options)


def build_shared(name: str, **dims_and_options) -> Optional[PositionScheme]:
    """The scheme in its shared role (the parameters its paper shares across layers, built once, to be
    handed to every layer as ``shared=``); None if it shares nothing or its option says ``share: false``."""
    if not scheme_class(name).shares or dims_and_options.get("share") is False:
        return None
    return build_position(name, where="shared", **dims_and_options)


def check_pairing(attention_kind: str, name: str) -> None:
    """Refuse, in one line, a position scheme that linear attention cannot take."""
    cls = scheme_class(name)
    if attention_kind == "linear" and not cls.linear_ok:
        raise IncompatiblePairing(
            f"attention=linear with position={name} cannot work: {name} is a {cls.kind} scheme that acts on the "
            f"N×N score matrix{(' (' + cls.linear_note + ')') if cls.linear_note else ''}, and linear attention never "
            f"forms it; linear attention takes: {', '.join(n for n, c in sorted(REGISTRY.items()) if c.linear_ok)}"
        )


__all__ = ["PositionScheme", "REGISTRY", "register", "build_position", "build_shared", "check_options", "check_pairing", "option_errors", "scheme_class",
           "IncompatiblePairing", "relative_distance", "t5_bucket", "alibi_slopes", "SCHEME_MODULES"]
