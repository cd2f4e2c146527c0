"""A data module rebuilt from a saved data config, without running anything the file names.

A run folder someone sent you holds ``.hydra/config.yaml``; its ``data`` section names a class
(``_target_``) that ``hydra.utils.instantiate`` would import and call with whatever arguments the
file gives — code execution.  Here the task name picks one of linrope's own data modules from a
fixed table, only the arguments that module's constructor takes are passed, and each value is
type-checked first against the constructor's annotations.  A ``_target_`` other than the table's class for that task is refused in one
line (``SavedDataError``); keys the constructor does not take are ignored with a warning."""
from __future__ import annotations

import inspect
import typing
import warnings
from typing import Any, Dict, Mapping, Optional

from linrope.base.errors import SavedDataError
from linrope.base.options import annotation_rule

from .modules import ByteDataModule
from .task_modules import ListOpsDataModule, MQARDataModule, OffsetCopyDataModule


# task name -> its data module class; nothing outside this table is ever built
DATA_MODULES: Dict[str, type] = {
    "bytes": ByteDataModule,
    "mqar": MQARDataModule,
    "offset_copy": OffsetCopyDataModule,
    "listops": ListOpsDataModule,
}


def constructor_fields(cls: type) -> Dict[str, Any]:
    """{name: type annotation} of the keyword arguments a data module takes: its ``__init__`` and, where that
    passes ``**common`` on, its parents' (the schema is the constructor itself, written once)."""
    fields: Dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        hints = typing.get_type_hints(init)
        fields.update({p.name: hints[p.name] for p in params if p.name in hints and p.name not in fields
                       and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)})
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return fields


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def checked_fields(cls: type, data: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The entries of ``data`` that ``cls``'s constructor takes, each type-checked (``SavedDataError``
    otherwise)."""
    hints = constructor_fields(cls)
    names = [n for n in hints if n != "task"]  # a task module builds its task object itself
    ignored = sorted(k for k in data if k not in names and k not in ("_target_", "task"))
    if ignored:
        warnings.warn(f"{where}: ignoring data keys that linrope's {cls.__name__} does not take: "
                      f"{', '.join(map(str, ignored))}")
    out = {}
    for name in names:
        if name in data:
            rule = annotation_rule(hints[name])
            if not rule.accepts(data[name]):
                raise SavedDataError(f"{where}: data.{name}={data[name]!r} — expected {rule.expectation()}")
            out[name] = data[name]
    return out


def build_data_module(data: Mapping[str, Any], task: Optional[str] = None, *, where: str = "the data config"):
    """One of linrope's data modules from a plain mapping (a saved ``data`` section, or a checkpoint's
    ``datamodule_hyper_parameters``).  ``task`` (the checkpoint's) wins over ``data.task``; they must agree."""
    named = data.get("task")
    if named is not None and task is not None and named != task:
        raise SavedDataError(f"{where}: data.task={named!r} but the checkpoint was trained on task {task!r}")
    task = task or named or "bytes"
    if task not in DATA_MODULES:
        raise SavedDataError(f"{where}: unknown task {task!r}; linrope builds only {', '.join(DATA_MODULES)}")
    cls = DATA_MODULES[task]
    target = data.get("_target_")
    if target is not None and target != class_path(cls):
        raise SavedDataError(f"{where}: data._target_={target!r} is not linrope's data module for task {task!r} "
                             f"({class_path(cls)}); refusing to build what a file names")
    return cls(**checked_fields(cls, data, where))
