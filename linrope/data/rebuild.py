"""A data module rebuilt from a saved data config, without running anything the file names.

A run folder someone sent you holds ``.hydra/config.yaml``; its ``data`` section names a class
(``_target_``) that ``hydra.utils.instantiate`` would import and call with whatever arguments the
file gives — code execution.  Here the task name picks one of linrope's own data modules from a
fixed table, only the fields that task's config dataclass declares are passed, and each value is
type-checked first.  A ``_target_`` other than the table's class for that task is refused in one
line (``SavedDataError``); keys the dataclass does not declare are ignored with a warning."""
from __future__ import annotations

import dataclasses
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from linrope.errors import SavedDataError

from .modules import ByteDataModule
from .task_modules import ListOpsDataModule, MQARDataModule, OffsetCopyDataModule


@dataclass
class ByteData:
    path: Optional[str] = None
    context: int = 256
    batch_size: int = 16
    eval_batch_size: int = 16
    val_windows: int = 64
    test_windows: int = 256
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    max_bytes: Optional[int] = None
    num_workers: int = 0
    seed: int = 1234
    eval_context: Optional[int] = None


@dataclass
class TaskData:
    context: int = 256
    batch_size: int = 16
    eval_batch_size: int = 16
    val_examples: int = 256
    test_examples: int = 512
    test_factor: Optional[int] = None
    num_workers: int = 0
    seed: int = 1234
    eval_seed: int = 0


@dataclass
class MQARData(TaskData):
    num_kv_pairs: int = 8
    num_queries: Optional[int] = None
    key_vocab: int = 64
    value_vocab: int = 64


@dataclass
class OffsetCopyData(TaskData):
    n_symbols: int = 64
    offset: int = 16
    max_offset: Optional[int] = None


@dataclass
class ListOpsData(TaskData):
    max_depth: int = 10
    max_args: int = 10
    leaf_prob: float = 0.75
    min_length: Optional[int] = None
    max_tries: int = 200


# task name -> (its config dataclass, its data module class); nothing outside this table is ever built
DATA_MODULES: Dict[str, Tuple[Type, type]] = {
    "bytes": (ByteData, ByteDataModule),
    "mqar": (MQARData, MQARDataModule),
    "offset_copy": (OffsetCopyData, OffsetCopyDataModule),
    "listops": (ListOpsData, ListOpsDataModule),
}


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _type_error(value: Any, annotation: Any) -> Optional[str]:
    """None when ``value`` fits ``annotation`` (int, float, str, bool, Optional of one), else what was expected."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        if value is None and type(None) in args:
            return None
        annotation = next(a for a in args if a is not type(None))
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return None
    if annotation in (str, bool) and isinstance(value, annotation):
        return None
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[annotation] + \
        (" or null" if args else "")


def checked_fields(schema: Type, data: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The entries of ``data`` that ``schema`` declares, each type-checked (``SavedDataError`` otherwise)."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    ignored = sorted(k for k in data if k not in names and k not in ("_target_", "task"))
    if ignored:
        warnings.warn(f"{where}: ignoring data keys that linrope's {schema.__name__} does not declare: "
                      f"{', '.join(map(str, ignored))}")
    out = {}
    for name in names:
        if name in data:
            problem = _type_error(data[name], hints[name])
            if problem:
                raise SavedDataError(f"{where}: data.{name}={data[name]!r} — expected {problem}")
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
    schema, cls = DATA_MODULES[task]
    target = data.get("_target_")
    if target is not None and target != class_path(cls):
        raise SavedDataError(f"{where}: data._target_={target!r} is not linrope's data module for task {task!r} "
                             f"({class_path(cls)}); refusing to build what a file names")
    return cls(**checked_fields(schema, data, where))
