"""How a component declares its options, once, and how they are checked, in one line each.

A component's options are the keyword arguments of its constructor (a position scheme, an attention layer, a
data module) or the fields of a dataclass (the model, the optimiser, linrope's own settings), each annotated
with its type and, where it has one, its range::

    chunk_size: Annotated[int, Rule(low=1)] = 64
    feature_map: Annotated[str, Rule(choices=lambda: tuple(FEATURE_MAPS))] = "elu"
    stride: Annotated[Optional[int], Rule(low=1, note="null: half the length")]

``declared(component)`` reads that declaration; ``option_errors(declared, given, where)`` checks the options
given anywhere (a command line and its presets, a saved config, a checkpoint's hyper-parameters): one line per
key the component does not take, naming the nearest it does (``UnknownOption``), else one line per value it
refuses (``model.attention.chunk_size=0: expected an integer >= 1``).

Why not OmegaConf's structured configs or pydantic: both stop a value while Hydra composes or report it in their
own several-line wording, coerce (``"1"`` to 1, ``True`` to 1) unless made strict, and take no choices read from a
registry when checked; the one-line message names the expectation, which the declaration has to spell anyway."""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import operator
import sys
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

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

    def _bounds(self) -> Iterator[Tuple[str, float, Callable[[float, float], bool]]]:
        ops = (
            (">=", self.low, operator.ge),
            (">", self.above, operator.gt),
            ("<=", self.high, operator.le),
            ("<", self.below, operator.lt),
        )
        return ((op, v, test) for op, v, test in ops if v is not None)

    def expectation(self) -> str:
        if self.kind == "list":
            text = f"{'two' if self.length == 2 else 'a list of'} {_plural(self.item.expectation())}"
        elif self.kind == "choice":
            choices = [*self.choices(), *([None] if self.null and None not in self.choices() else [])]
            text = "one of " + ", ".join("null" if c is None else str(c) for c in choices)
        else:
            text = _NAMES[self.kind] + "".join(
                f"{' and' if i else ''} {op} {_num(v)}" for i, (op, v, _) in enumerate(self._bounds())
            )
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
        finite = not isinstance(value, float) or math.isfinite(value)
        return finite and all(test(value, v) for _, v, test in self._bounds())


_NAMES = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string", "any": "anything"}


def _plural(expectation: str) -> str:
    """``an integer >= 1`` -> ``integers >= 1``; ``one of pi, ntk`` -> ``pi, ntk``."""
    for one, many in (("one of ", ""), ("an integer", "integers"), ("a number", "numbers"), ("a string", "strings")):
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
        return Rule(kind="list", item=item, length=length, empty=given.empty, null=null, note=given.note)
    kind = "choice" if given.choices else _KINDS[annotation]
    return dataclasses.replace(given, kind=kind, null=null or given.null)


def _parameters(component: Any) -> Iterator[Tuple[str, Any, Any]]:
    """(name, annotation, default or ``inspect.Parameter.empty``) of each option of a component: a dataclass's
    fields, or a class's keyword arguments (its ``__init__``'s and, where that passes ``**kwargs`` on, its
    parents')."""
    if dataclasses.is_dataclass(component):
        hints = _field_hints(component)
        for f in dataclasses.fields(component):
            yield f.name, hints[f.name], inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        return
    seen = set()
    for klass in component.__mro__ if inspect.isclass(component) else ():
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        hints = typing.get_type_hints(init, include_extras=True)
        for p in params:
            if p.name not in seen and p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                seen.add(p.name)
                yield p.name, hints.get(p.name, Any), p.default
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break


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


def declared(component: Any, skip: Iterable[str] = ()) -> Dict[str, Rule]:
    """{option: Rule} of a component, less ``skip`` (what the caller passes itself)."""
    skip = set(skip)
    return {name: rule_of(hint) for name, hint, _ in _parameters(component) if name not in skip}


def defaults(component: Any) -> Dict[str, Any]:
    """{option: default} of a component's declaration (those that have one)."""
    return {name: default for name, _, default in _parameters(component) if default is not inspect.Parameter.empty}


def option_errors(
    rules: Mapping[str, Rule], given: Mapping[str, Any], where: str = "", also: Iterable[str] = ()
) -> List[str]:
    """One line per key of ``given`` that the component does not take (``also``: keys taken but not checked
    here), naming the nearest it does; else one line per value it refuses (``value_errors``)."""
    known = [*rules, *also]
    unknown = [str(UnknownOption(f"{where}.{k}" if where else str(k), known)) for k in given if k not in known]
    return unknown or value_errors(rules, given, where)


def value_errors(rules: Mapping[str, Rule], given: Mapping[str, Any], where: str = "") -> List[str]:
    """One line per value of ``given`` its rule refuses (``model.attention.chunk_size=0: expected an integer
    >= 1``); keys without a rule are left alone, and so is an OmegaConf interpolation (``data.context:
    ${context}``): it is checked where it is set."""
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
            shown = "null" if value is None else str(list(value)) if isinstance(value, tuple) else str(value)
            errors.append(f"{where + '.' if where else ''}{key}={shown}: expected {rule.expectation()}")
    return errors
