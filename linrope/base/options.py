"""How a component declares its options, once, and how they are checked, in one line each (docs/architecture.md,
"Options: one declaration per component")::

    chunk_size: Annotated[int, Field(ge=1)] = 64
    feature_map: Annotated[str, OneOf(lambda: tuple(FEATURE_MAPS))] = "elu"
    stride: Annotated[Optional[int], Field(ge=1, description="null: half the length")]

``declared(component)`` reads a declaration, ``option_errors(declared, given, where)`` checks what is given:
pydantic's strict mode on JSON's types (no ``"1"`` for 1, no ``True`` for 1, finite numbers), what is expected read
from the type's JSON schema (``model.attention.chunk_size=0: expected an integer >= 1``)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import typing
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Annotated, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Sequence, Tuple

from pydantic import ConfigDict, Field, TypeAdapter
from pydantic_core import core_schema

from linrope.base.errors import UnknownOption

Positive = Annotated[int, Field(ge=1)]  # the common types of options
Count = Annotated[int, Field(ge=0)]


@dataclass(frozen=True)
class OneOf:
    """An option's choices, read from the code's own vocabulary (a registry) when checked."""

    choices: Callable[[], Sequence[Any]]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        def check(value: Any) -> Any:
            if value is not None and value not in self.choices():  # None: the type allows it (Optional)
                raise ValueError(f"not one of {self.choices()}")
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Dict[str, Any]:
        inner = handler(schema)
        null = {"type": "null"} in inner.get("anyOf", []) and None not in self.choices()
        described = {k: v for k, v in inner.items() if k == "description"}
        return {**described, "enum": [*self.choices(), *([None] if null else [])]}


_STRICT = ConfigDict(strict=True, allow_inf_nan=False)


@dataclass(frozen=True)
class Option:
    """One declared option: its type hint, checked by pydantic."""

    hint: Any

    @cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.hint, config=_STRICT)

    def accepts(self, value: Any) -> bool:
        """Whether pydantic takes ``value`` as JSON would carry it (a tuple as a list, as YAML gives it)."""
        try:
            self.adapter.validate_json(json.dumps(value))
        except (TypeError, ValueError):  # not JSON (a Path, an object), or refused (ValidationError)
            return False
        return True

    def expectation(self) -> str:
        """``an integer >= 1 or null (null: half the length)``: the type's JSON schema in words."""
        return _expectation(self.adapter.json_schema())


_NAMES = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string"}
_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


def _expectation(schema: Mapping[str, Any]) -> str:
    kinds = schema.get("anyOf", [schema])
    null = {"type": "null"} in kinds
    some = [k for k in kinds if k != {"type": "null"}]
    if len(some) > 1:  # a union: each kind in words (``an integer >= 1 or a number > 0 and <= 1``)
        text = " or ".join(_expectation(k) for k in some) + (" or null" if null else "")
        return text + (f" ({schema['description']})" if "description" in schema else "")
    one = some[0] if some else {}
    choices = one.get("enum", [one["const"]] if "const" in one else None)
    if choices is not None:
        choices = [*choices, *([None] if null and None not in choices else [])]
        text = "one of " + ", ".join("null" if c is None else str(c) for c in choices)
    elif one.get("type") == "array":
        pair = "prefixItems" in one and one.get("maxItems") == 2
        item = one["prefixItems"][0] if "prefixItems" in one else one.get("items", {})
        text = f"{'two' if pair else 'a list of'} {_plural(_expectation(item))}"
    else:
        bounds = [f" {op} {_num(one[key])}" for key, op in _BOUNDS if key in one]
        text = _NAMES.get(one.get("type"), "anything") + " and".join(bounds)
    text += " or null" if null and choices is None else ""
    return text + (f" ({schema['description']})" if "description" in schema else "")


def _plural(expectation: str) -> str:
    """``an integer >= 1`` -> ``integers >= 1``; ``one of pi, ntk`` -> ``pi, ntk``."""
    for one, many in (("one of ", ""), ("an integer", "integers"), ("a number", "numbers"), ("a string", "strings")):
        if expectation.startswith(one):
            return many + expectation[len(one) :]
    return expectation


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


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
    they hold: ``OneOf(lambda: ...)`` would not find the module's names)."""
    hints: Dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = vars(sys.modules[klass.__module__])
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            hints[name] = eval(annotation, module, dict(vars(klass))) if isinstance(annotation, str) else annotation
    return hints


def declared(component: Any, skip: Iterable[str] = ()) -> Dict[str, Option]:
    """{option: Option} of a component, less ``skip`` (what the caller passes itself)."""
    skip = set(skip)
    return {name: option for name, option in _declared(component).items() if name not in skip}


@lru_cache(maxsize=None)
def _declared(component: Any) -> Dict[str, Option]:  # read once: each Option builds its pydantic schema once
    return {name: Option(hint) for name, hint, _ in _parameters(component)}


def defaults(component: Any) -> Dict[str, Any]:
    """{option: default} of a component's declaration (those that have one)."""
    return {name: default for name, _, default in _parameters(component) if default is not inspect.Parameter.empty}


def option_errors(
    options: Mapping[str, Option], given: Mapping[str, Any], where: str = "", also: Iterable[str] = (), what="option"
) -> List[str]:
    """One line per key of ``given`` that the component does not take (``also``: keys taken but not checked
    here), naming the nearest it does (``what``: an option, a file's key); else one line per value it refuses
    (``value_errors``)."""
    known = [*options, *also]
    unknown = [str(UnknownOption(f"{where}.{k}" if where else str(k), known, what)) for k in given if k not in known]
    return unknown or value_errors(options, given, where)


def value_errors(options: Mapping[str, Option], given: Mapping[str, Any], where: str = "") -> List[str]:
    """One line per value of ``given`` its option refuses (``model.attention.chunk_size=0: expected an integer
    >= 1``); keys without an option are left alone, and so is an OmegaConf interpolation (``data.context:
    ${context}``): it is checked where it is set."""
    from omegaconf import DictConfig, OmegaConf  # light; not needed by plain mappings

    errors = []
    for key, option in options.items():
        if (
            option.hint is Any
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
        if not option.accepts(value):
            shown = "null" if value is None else str(list(value)) if isinstance(value, tuple) else str(value)
            errors.append(f"{where + '.' if where else ''}{key}={shown}: expected {option.expectation()}")
    return errors
