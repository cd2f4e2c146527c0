"""A data module rebuilt from a saved data config, without running anything the file names.

A run folder someone sent you holds ``.hydra/config.yaml``; its ``data`` section names a class
(``_target_``) that ``hydra.utils.instantiate`` would import and call with whatever arguments the
file gives — code execution.  Here the task name picks one of linrope's own data modules from a
fixed table, and each key and value is checked against that module's declaration (its constructor's annotated
arguments) first.  A ``_target_`` other than the table's class for that task, a key the module does not take
(naming the nearest) or a value it refuses is refused in one line (``SavedDataError``)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from linrope.base.errors import SavedDataError
from linrope.base.options import Option, declared, option_errors

from .modules import ByteDataModule
from .task_modules import ListOpsDataModule, MQARDataModule, OffsetCopyDataModule
from .text import TextDataModule

# task name -> its data module class; nothing outside this table is ever built
DATA_MODULES: Dict[str, type] = {
    "bytes": ByteDataModule,
    "mqar": MQARDataModule,
    "offset_copy": OffsetCopyDataModule,
    "listops": ListOpsDataModule,
    "text": TextDataModule,
}


def data_options(cls: type) -> Dict[str, Option]:
    """{option: Option} of a data module: its constructor's annotated keyword arguments and, where that passes
    ``**common`` on, its parents' (the declaration is the constructor itself, written once), less ``task``
    (a task module builds its task object itself)."""
    return declared(cls, skip=("task",))


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def checked_fields(cls: type, data: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The entries of ``data`` for ``cls``'s constructor, each checked against its declaration: a key it does
    not take (naming the nearest) or a value it refuses is a ``SavedDataError``, one line each."""
    rules = data_options(cls)
    errors = option_errors(rules, data, "data", also=("_target_", "task"))
    if errors:
        raise SavedDataError("\n".join(f"{where}: {e}" for e in errors))
    return {k: v for k, v in data.items() if k in rules}


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
        raise SavedDataError(
            f"{where}: data._target_={target!r} is not linrope's data module for task {task!r} "
            f"({class_path(cls)}); refusing to build what a file names"
        )
    return cls(**checked_fields(cls, data, where))
