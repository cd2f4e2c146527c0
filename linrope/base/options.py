"""The schema of a config: every scalar the code reads, its type, range and allowed values.

``SCHEMA`` is the one table of them, for train.py's config (``linrope.config.checks.validate`` checks it first);
``EXTRAPOLATION`` the settings of a length-extrapolation table (conf/extrapolation/default.yaml), which
train.py reads under ``extrapolation.`` and ``python -m linrope.evaluate`` at its top level.  Each
component checks its own options (the model, its attention and position scheme: ``linrope.models.spec``; the
optimiser: ``linrope.models.optim``; a data module: its constructor); this table holds what crosses them.  Each
failure is one line."""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from linrope.base.nested import get


@dataclass(frozen=True)
class Rule:
    """One entry of ``SCHEMA``: an int, a number or one of ``choices``; bounds are inclusive (``low``,
    ``high``) or strict (``above``, ``below``); ``null``: None is allowed too."""
    kind: str                                    # "int" | "number" | "bool" | "str" | "choice"
    low: Optional[float] = None
    above: Optional[float] = None
    high: Optional[float] = None
    below: Optional[float] = None
    choices: Optional[Callable[[], Sequence[Any]]] = None  # read from the code's own vocabulary when checked
    null: bool = False
    note: str = ""

    def expectation(self) -> str:
        if self.kind == "choice":
            text = "one of " + ", ".join("null" if c is None else str(c) for c in self.choices())
        else:
            text = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string"}[self.kind]
            bounds = [f"{op} {_num(v)}" for op, v in ((">=", self.low), (">", self.above), ("<=", self.high),
                                                       ("<", self.below)) if v is not None]
            text += (" " + " and ".join(bounds)) if bounds else ""
        text += " or null" if self.null and self.kind != "choice" else ""
        return text + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null or (self.kind == "choice" and None in self.choices())
        if self.kind == "choice":
            return value in self.choices()
        if self.kind in ("bool", "str"):
            return isinstance(value, bool if self.kind == "bool" else str)
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return ((self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and (self.high is None or value <= self.high) and (self.below is None or value < self.below))


def annotation_rule(annotation: Any) -> Rule:
    """The Rule of a constructor argument's type hint: int, float, str, bool, or Optional of one."""
    args = typing.get_args(annotation)
    nullable = typing.get_origin(annotation) is typing.Union and type(None) in args
    base = next(a for a in args if a is not type(None)) if nullable else annotation
    return Rule({int: "int", float: "number", str: "str", bool: "bool"}[base], null=nullable)


def value_errors(options: Mapping[str, Any], rules: Mapping[str, Rule], where: str) -> List[str]:
    """One line per value of a component's plain ``options`` that its ``rules`` refuse
    (``model.attention.chunk_size=0: expected an integer >= 1``)."""
    return [f"{where}.{k}={'null' if v is None else v}: expected {rules[k].expectation()}"
            for k, v in options.items() if k in rules and not rules[k].accepts(v)]


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


POSITIVE_INT, COUNT = Rule("int", low=1), Rule("int", low=0)
# torch.set_float32_matmul_precision's settings: highest (PyTorch's default: float32 products in float32), high
# (TF32 on NVIDIA GPUs since Ampere), medium (bfloat16 products too); null leaves the process's setting alone
MATMUL_PRECISIONS = ("highest", "high", "medium")
FRACTION = Rule("number", above=0, below=1)
SCHEMA: Dict[str, Rule] = {
    "seed": Rule("int"), "compile": Rule("bool"),
    "context": POSITIVE_INT,
    # the data (every data module takes these; a module's own options are checked by its constructor)
    "data.context": POSITIVE_INT, "data.eval_context": Rule("int", low=1, null=True),
    "data.batch_size": POSITIVE_INT, "data.eval_batch_size": POSITIVE_INT,
    "data.val_windows": POSITIVE_INT, "data.test_windows": POSITIVE_INT,
    "data.val_fraction": FRACTION, "data.test_fraction": FRACTION,
    "data.max_bytes": Rule("int", low=1, null=True), "data.num_workers": COUNT, "data.allow_binary": Rule("bool"),
    # the Trainer (the model checks its options: linrope.models.spec; the optimiser its own: linrope.models.optim)
    "trainer.max_steps": Rule("int", low=-1, note="-1: no limit"),
    "trainer.max_epochs": Rule("int", low=-1, null=True, note="-1: no limit"),
    "trainer.num_nodes": POSITIVE_INT,
    "trainer.matmul_precision": Rule("choice", choices=lambda: (*MATMUL_PRECISIONS, None),
                                     note="float32 matmuls; high: TF32 on GPUs"),
    "trainer.log_every_n_steps": POSITIVE_INT, "trainer.accumulate_grad_batches": POSITIVE_INT,
    "trainer.gradient_clip_val": Rule("number", low=0, null=True),
    "callbacks.last_checkpoint.every_n_train_steps": Rule("int", low=1, null=True,
                                                          note="null: only after validation and at the end"),
}


# the top level of train.py's config: linrope's own settings and the sections of its config groups
TOP_LEVEL = ("task_name", "tags", "seed", "train", "test", "ckpt_path", "compile", "optimized_metric",
             "retain_freed_memory", "context", "extrapolation", "model", "data", "optim", "trainer", "callbacks",
             "logger", "paths")

# the settings of a length-extrapolation table (conf/extrapolation/default.yaml; linrope.evaluation.extrapolation.SETTINGS)
EXTRAPOLATION: Dict[str, Rule] = {
    "split": Rule("choice", choices=lambda: ("val", "test")), "scored_bytes": POSITIVE_INT,
    "stride": Rule("int", low=1, null=True, note="null: half the length"), "task_examples": POSITIVE_INT,
    "batch_size": POSITIVE_INT, "max_score_mb": Rule("number", above=0),
}
ROPE_ROWS = ("pi", "ntk", "none")
EXTRAPOLATION_KEYS = ("enabled", "factors", "scalings", *EXTRAPOLATION)  # under extrapolation. in train.py


def schema_errors(cfg) -> List[str]:
    """One line per value of ``SCHEMA`` that has the wrong type or lies out of range."""
    errors = rule_errors(cfg, SCHEMA)
    return errors + extrapolation_errors(cfg, "extrapolation.")


def extrapolation_errors(cfg, prefix: str) -> List[str]:
    """One line per bad setting of a length-extrapolation table: under ``extrapolation.`` in train.py's
    config, at the top (``prefix`` "") in linrope.evaluate's."""
    errors = rule_errors(cfg, {prefix + k: rule for k, rule in EXTRAPOLATION.items()})
    factors, scalings = get(cfg, prefix + "factors"), get(cfg, prefix + "scalings")
    if factors is not None and not (isinstance(factors, (list, ListConfig)) and len(factors) > 0 and all(
            Rule("number", above=0).accepts(f) for f in factors)):
        errors.append(f"{prefix}factors={_shown(factors)}: expected a list of numbers > 0")
    if scalings is not None and not (isinstance(scalings, (list, ListConfig)) and all(s in ROPE_ROWS for s in scalings)):
        errors.append(f"{prefix}scalings={_shown(scalings)}: expected a list of pi, ntk ([] for the model as trained only)")
    return errors


def _shown(value) -> str:
    return str(list(value)) if isinstance(value, (list, ListConfig)) else str(value)


def rule_errors(cfg, rules: Mapping[str, Rule]) -> List[str]:
    """One line per value of ``rules`` (dotted key: Rule) that has the wrong type or lies out of range.  A
    value that is an interpolation (``data.context: ${context}``) is reported where it is set, not again
    where it is used."""
    errors = []
    for key, rule in rules.items():
        parent, _, leaf = key.rpartition(".")
        node = get(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node or OmegaConf.is_interpolation(node, leaf):
            continue
        value = node[leaf]
        if not rule.accepts(value):
            shown = "null" if value is None else value
            errors.append(f"{key}={shown}: expected {rule.expectation()}")
    return errors
