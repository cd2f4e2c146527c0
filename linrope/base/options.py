"""How a component declares its options, once, and how they are checked, in one line each.

A component's options are the keyword arguments of its constructor (a position scheme, an attention layer, a
data module) or the fields of a dataclass (the model, the optimiser, linrope's own settings), each annotated
with its type and, where it has one, its range::

    chunk_size: Annotated[int, Rule(low=1)] = 64
    feature_map: Annotated[str, Rule(choices=lambda: tuple(FEATURE_MAPS))] = "elu"
    stride: Annotated[Optional[int], Rule(low=1, note="null: half the length")]

``declared(component)`` reads that declaration (types from the annotations: int, float, str, bool, Optional,
lists and pairs of them, ``Literal``); ``option_errors(declared, given, where)`` is the one check made of the
options given anywhere — the composed config of a command line and its preset files, a saved config, a
checkpoint's hyper-parameters: one line for each key the component does not take, naming the nearest it
does (``UnknownOption``), else one line for each value it refuses (``model.attention.chunk_size=0: expected
an integer >= 1``).

Why not OmegaConf's structured configs: they check types but not ranges or choices read from a registry,
stop at the first error with a several-line message, and as Hydra schemas they would refuse a bad value while
Hydra composes, before linrope can say it in one line.  The declarations here are plain dataclasses and
signatures, so they also serve as structured configs wherever one is wanted."""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import sys
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from linrope.base.errors import UnknownOption


@dataclass(frozen=True)
class Rule:
    """The type and range of one option: ``kind`` (read from the annotation) an int, a number, a bool, a str,
    one of ``choices``, or a list of ``item``; bounds inclusive (``low``, ``high``) or strict (``above``,
    ``below``); ``null``: None is allowed too; ``length``: a list of exactly that many; ``empty``: a list may
    be empty; ``note``: said after the expectation."""

    kind: str = ""  # "int" | "number" | "bool" | "str" | "choice" | "list" | "any"
    low: Optional[float] = None
    above: Optional[float] = None
    high: Optional[float] = None
    below: Optional[float] = None
    choices: Optional[Callable[[], Sequence[Any]]] = None  # read from the code's own vocabulary when checked
    null: bool = False
    note: str = ""
    item: Optional["Rule"] = None
    length: Optional[int] = None
    empty: bool = True

    def expectation(self) -> str:
        if self.kind == "list":
            many = "two" if self.length == 2 else "a list of"
            text = f"{many} {_plural(self.item.expectation())}"
        elif self.kind == "choice":
            choices = [*self.choices(), *([None] if self.null and None not in self.choices() else [])]
            text = "one of " + ", ".join("null" if c is None else str(c) for c in choices)
        else:
            text = {
                "int": "an integer",
                "number": "a number",
                "bool": "true or false",
                "str": "a string",
                "any": "anything",
            }[self.kind]
            bounds = [
                f"{op} {_num(v)}"
                for op, v in ((">=", self.low), (">", self.above), ("<=", self.high), ("<", self.below))
                if v is not None
            ]
            text += (" " + " and ".join(bounds)) if bounds else ""
        text += " or null" if self.null and self.kind != "choice" else ""
        return text + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null or (self.kind == "choice" and None in self.choices())
        if self.kind == "any":
            return True
        if self.kind == "list":
            if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length):
                return False
            return (self.empty or len(value) > 0) and all(self.item.accepts(v) for v in value)
        if self.kind == "choice":
            return not isinstance(value, (list, tuple, dict)) and value in self.choices()
        if self.kind in ("bool", "str"):
            return isinstance(value, bool if self.kind == "bool" else str)
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (
            (self.low is None or value >= self.low)
            and (self.above is None or value > self.above)
            and (self.high is None or value <= self.high)
            and (self.below is None or value < self.below)
        )


def _plural(expectation: str) -> str:
    """``an integer >= 1`` -> ``integers >= 1``; ``one of pi, ntk`` -> ``pi, ntk``."""
    if expectation.startswith("one of "):
        return expectation[len("one of ") :]
    for one, many in (("an integer", "integers"), ("a number", "numbers"), ("a string", "strings")):
        if expectation.startswith(one):
            return many + expectation[len(one) :]
    return expectation


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


Positive = Annotated[int, Rule(low=1)]  # the common types of options
Count = Annotated[int, Rule(low=0)]

_KINDS = {int: "int", float: "number", str: "str", bool: "bool", Any: "any"}


def rule_of(annotation: Any) -> Rule:
    """The Rule of a type hint: int, float, str, bool, Any, ``Literal[...]``, a list or pair of them,
    ``Optional`` of any, each possibly ``Annotated`` with a ``Rule`` that adds a range, choices or a note."""
    given = Rule()
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *extras = typing.get_args(annotation)
        given = next((e for e in extras if isinstance(e, Rule)), given)
    args = typing.get_args(annotation)
    null = typing.get_origin(annotation) is typing.Union and type(None) in args
    if null:
        annotation = next(a for a in args if a is not type(None))
        if typing.get_origin(annotation) is typing.Annotated:
            return dataclasses.replace(rule_of(annotation), null=True)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return dataclasses.replace(given, kind="choice", choices=lambda: args, null=null)
    if origin in (list, tuple, collections.abc.Sequence):
        item = rule_of(args[0]) if args else Rule("any")
        length = len(args) if origin is tuple and args and args[-1] is not Ellipsis else None
        ranged = {k: getattr(given, k) for k in ("low", "above", "high", "below", "choices")}
        item = dataclasses.replace(
            item, **{k: v for k, v in ranged.items() if v is not None}, kind="choice" if given.choices else item.kind
        )
        return dataclasses.replace(
            Rule(), kind="list", item=item, length=length, empty=given.empty, null=null, note=given.note
        )
    kind = "choice" if given.choices else _KINDS[annotation]
    return dataclasses.replace(given, kind=kind, null=null or given.null)


def declared(component: Any, skip: Iterable[str] = ()) -> Dict[str, Rule]:
    """{option: Rule} of a component: a dataclass's fields, or a class's keyword arguments (its ``__init__``'s
    and, where that passes ``**kwargs`` on, its parents'), less ``skip`` (what the caller passes itself)."""
    skip = set(skip)
    if dataclasses.is_dataclass(component):
        hints = _field_hints(component)
        return {f.name: rule_of(hints[f.name]) for f in dataclasses.fields(component) if f.name not in skip}
    rules: Dict[str, Rule] = {}
    for klass in component.__mro__ if inspect.isclass(component) else ():
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        hints = typing.get_type_hints(init, include_extras=True)
        rules.update(
            {
                p.name: rule_of(hints.get(p.name, Any))
                for p in params
                if p.name not in rules
                and p.name not in skip
                and p.name != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            }
        )
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return rules


def _field_hints(cls: type) -> Dict[str, Any]:
    """The annotations of a dataclass and its bases, each evaluated in its own module (``typing.get_type_hints``
    would evaluate a class's string annotations with the class, not its module, as the globals of a lambda
    they hold: ``choices=lambda: ...`` would not find the module's names)."""
    hints: Dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = vars(sys.modules[klass.__module__])
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            hints[name] = eval(annotation, module, dict(vars(klass))) if isinstance(annotation, str) else annotation
    return hints


def defaults(component: Any) -> Dict[str, Any]:
    """{option: default} of a component's declaration (those that have one)."""
    if dataclasses.is_dataclass(component):
        return {f.name: f.default for f in dataclasses.fields(component) if f.default is not dataclasses.MISSING}
    out: Dict[str, Any] = {}
    for klass in component.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        out.update({p.name: p.default for p in params if p.name not in out and p.default is not p.empty})
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


def unknown_errors(rules: Iterable[str], given: Iterable[str], where: str) -> List[str]:
    """One line per key of ``given`` not among ``rules``, naming the nearest that is."""
    known = list(rules)
    return [str(UnknownOption(f"{where}.{k}" if where else str(k), known)) for k in given if k not in known]


def option_errors(
    rules: Mapping[str, Rule], given: Mapping[str, Any], where: str = "", also: Iterable[str] = ()
) -> List[str]:
    """The check of a component's options wherever they come from: one line per key of ``given`` that it does
    not take (``also``: keys taken but not checked here), naming the nearest it does; else one line per value
    it refuses.  A value of an OmegaConf node that is an interpolation (``data.context: ${context}``) is
    checked where it is set, not again where it is used."""
    unknown = unknown_errors([*rules, *also], given, where)
    return unknown or value_errors(rules, given, where)


def value_errors(rules: Mapping[str, Rule], given: Mapping[str, Any], where: str = "") -> List[str]:
    """One line per value of ``given`` its rule refuses (``model.attention.chunk_size=0: expected an integer
    >= 1``); keys without a rule are left alone."""
    from omegaconf import DictConfig, OmegaConf  # light; not needed by plain mappings

    errors = []
    for key, rule in rules.items():
        if (
            rule.kind == "any"
            or key not in given
            or (isinstance(given, DictConfig) and OmegaConf.is_interpolation(given, key))
        ):
            continue
        value = given[key]
        if OmegaConf.is_config(value):
            try:
                value = OmegaConf.to_container(value, resolve=True)
            except Exception:  # noqa: BLE001 - an interpolation inside (${hydra:...}): checked where it is set
                continue
        if not rule.accepts(value):
            errors.append(f"{where + '.' if where else ''}{key}={_shown(value)}: expected {rule.expectation()}")
    return errors


def _shown(value: Any) -> str:
    return "null" if value is None else str(list(value)) if isinstance(value, tuple) else str(value)
