"""What a study claims, read from its config: ``conf/study/<experiment>.yaml``, beside its experiment.

A study is data: its pairs, the claims it tables across its arms, their verdicts and its positive control live in
the YAML file, and ``linrope report`` (``linrope.analysis.report``, ``linrope.analysis.arms``) is one code path for
every study.  Runs of ``task_name: <experiment>`` are read with ``conf/study/<experiment>.yaml``, others with
``conf/study/default.yaml``; ``--study NAME|FILE`` chooses another.  The keys and why the file sits beside its
experiment: docs/methods.md, "Studies are data".  Read with ``yaml.safe_load``: nothing in it is built or imported;
a bad key, metric or pair is one line (``linrope.base.errors.ConfigError``) naming the file and the key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import yaml

from linrope.base.errors import ConfigError, UnknownOption, nearest_hint
from linrope.config.command_line import CONF_DIR

KEYS = ("pairs", "metric", "arms", "claims", "verdict", "control", "table", "tuning")
ARMS = {"folder": str, "key": str, "label": str, "task": str, "axis": str}
CLAIM = {"text": str, "metric": str, "a": str, "b": str}
CONTROL = {"configuration": str, "at_least": float, "at_most": float, "what": str}
TABLE = {"file": str, "title": str, "intro": str, "claims_intro": str, "configurations": bool, "per_run": bool}
TABLE |= {"figure": str, "figure_title": str, "caption": str, "by_order": str, "collapse_below": float}
# a claim's signs (resolved or not) from the first arm to the last -> the verdict the study names for it
OUTCOMES = ("same", "opposite", "first_only", "last_only", "none", "unpaired", "single")
FIGURES = ("claims", "by_arm")
TUNING = ("key", "grid", "factor", "max_extensions", "seed", "metric", "mode")
TUNING_DEFAULTS = {"factor": 2.0, "max_extensions": 3, "seed": 0, "mode": "min"}
MODES = ("min", "max")
# bpb@2048 (sliding windows, as trained), bpb@2048 windows, bpb@2048 windows window128: the extrapolation table's rows
METRIC = re.compile(r"(train|val|test)/\w+|(bpb|acc)@\d+( (windows|pi|ntk|yarn|dynamic|window\d+))*")
DEFAULT = "default"


@dataclass(frozen=True)
class Claim:
    text: str  # the claim, as the study words it
    metric: str
    a: str
    b: str


@dataclass(frozen=True)
class Tuning:
    """A study's tuning stage (``tuning``): see the module docstring."""

    key: str  # the setting tuned, as on the command line (optim.lr)
    grid: Tuple[float, ...]  # the values every configuration tries first, ascending
    factor: float  # the step beyond an edge: × factor above the largest, ÷ factor below the smallest
    max_extensions: int  # values added beyond an edge at most, per configuration
    seed: int  # the tuning runs' seed
    metric: str  # val/<name>: the best value logged over a run is its score
    mode: str  # min or max: which is best

    @property
    def leaf(self) -> str:
        """The key's last part: a tuning run's folder is ``<configuration>-<leaf><value>`` (linear-lr0.002)."""
        return self.key.rpartition(".")[2]


@dataclass(eq=False)
class Study:
    name: str
    path: Path
    pairs: Tuple[Tuple[str, str], ...] = ()
    metric: Optional[str] = None
    arms: Optional[Dict[str, Any]] = None
    claims: Tuple[Claim, ...] = ()
    verdict: Optional[Dict[str, Any]] = None
    control: Optional[Dict[str, Any]] = None
    table: Dict[str, Any] = field(default_factory=dict)
    tuning: Optional[Tuning] = None

    @property
    def compared(self) -> List[Tuple[str, str]]:
        """The pairs its reports compare: ``pairs``, then each claim's."""
        return list(dict.fromkeys([*self.pairs, *((c.a, c.b) for c in self.claims)]))


class _Reader:
    """Checks one file's values, each failure one line naming the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, text: str) -> ConfigError:
        return ConfigError(f"{self.path}: {text}")

    def mapping(self, node: Any, keys: Iterable[str], where: str) -> Dict[str, Any]:
        keys = tuple(keys)
        if not isinstance(node, dict):
            raise self.fail(f"{where or 'the file'}: a mapping of {', '.join(keys)}, not {type(node).__name__}")
        for k in node:
            if k not in keys:
                raise self.fail(str(UnknownOption(f"{where}.{k}" if where else str(k), keys, "key")))
        return node

    def typed(self, node: Dict[str, Any], types: Dict[str, type], where: str) -> Dict[str, Any]:
        out = dict(self.mapping(node, types, where))
        for k, v in out.items():
            want = types[k]
            ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) if want is float else isinstance(v, want)
            if not ok or (want is str and not v.strip()):
                raise self.fail(
                    f"{where}.{k}: {v!r}: a {'number' if want is float else want.__name__}"
                    f"{' (not empty)' if want is str else ''}"
                )
        return out

    def metric(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not METRIC.fullmatch(value):
            raise self.fail(
                f"{where}: {value!r}: a metric is test/<name>, val/<name>, train/<name> (logged) or "
                f"bpb@<length> / acc@<length> (the extrapolation table, as trained, sliding windows; a row of another "
                f"protocol, scaling or window: bpb@<length> windows, bpb@<length> windows window<keys>)"
            )
        return value

    def pair(self, node: Any, where: str) -> Tuple[str, str]:
        ok = isinstance(node, list) and len(node) == 2 and all(isinstance(x, str) and x for x in node)
        if not ok or node[0] == node[1]:
            raise self.fail(f"{where}: {node!r}: a pair is two different configuration names, [A, B]")
        return node[0], node[1]

    def required(self, node: Dict[str, Any], keys: Sequence[str], where: str) -> None:
        missing = [k for k in keys if k not in node]
        if missing:
            raise self.fail(f"{where}: needs {', '.join(missing)}")


def load(path: Path, name: Optional[str] = None) -> Study:
    """The study of the config file ``path`` (named by its stem unless ``name``), every value checked."""
    path = Path(path)
    read = _Reader(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise read.fail(f"cannot read it ({e.strerror or e})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise read.fail(f"not YAML text ({str(e).splitlines()[0]})") from None
    data = read.mapping({} if data is None else data, KEYS, "")
    metric = read.metric(data["metric"], "metric") if "metric" in data else None
    pairs = data.get("pairs") or []
    if not isinstance(pairs, list):
        raise read.fail(f"pairs: {pairs!r}: a list of pairs [A, B]")
    study = Study(name or path.stem, path, tuple(read.pair(p, f"pairs[{i}]") for i, p in enumerate(pairs)), metric)
    claims = data.get("claims") or []
    if not isinstance(claims, list):
        raise read.fail(f"claims: {claims!r}: a list of claims {{text, metric, a, b}}")
    for i, node in enumerate(claims):
        c = read.typed(node, CLAIM, f"claims[{i}]")
        read.required(c, ("a", "b"), f"claims[{i}]")
        a, b = read.pair([c["a"], c["b"]], f"claims[{i}]")
        if "metric" not in c and metric is None:
            raise read.fail(f"claims[{i}]: needs a metric (or the study's metric)")
        study.claims += (
            Claim(c.get("text", f"{a} − {b}"), read.metric(c.get("metric", metric), f"claims[{i}].metric"), a, b),
        )
    if "arms" in data:
        study.arms = read.typed(data["arms"], ARMS, "arms")
        read.required(study.arms, ("folder", "key", "task"), "arms")
        study.arms.setdefault("label", "{n}")
    if "verdict" in data:
        study.verdict = _verdict(read, data["verdict"])
    if "control" in data:
        study.control = read.typed(data["control"], CONTROL, "control")
        read.required(study.control, ("configuration",), "control")
        if ("at_least" in study.control) == ("at_most" in study.control):
            raise read.fail("control: needs one bar, at_least or at_most")
        if metric is None:
            raise read.fail("control: needs the study's metric")
    if "table" in data:
        study.table = read.typed(data["table"], TABLE, "table")
        if study.table.get("figure", FIGURES[0]) not in FIGURES:
            raise read.fail(f"table.figure: {study.table['figure']!r}: one of {', '.join(FIGURES)}")
        if metric is None and (
            study.table.get("configurations") or study.table.get("figure") == "by_arm" or "by_order" in study.table
        ):
            raise read.fail("table: its configurations, by_order and the by_arm figure need the study's metric")
        if "by_order" in study.table and not re.fullmatch(r"(train|val|test)/\w*[A-Za-z_]", study.table["by_order"]):
            raise read.fail(
                f"table.by_order: {study.table['by_order']!r}: a logged metric's name less its order, "
                f"test/acc_q for test/acc_q1, test/acc_q2, …"
            )
    if study.arms is not None:
        read.required(study.table, ("file", "title"), "table")
    if "tuning" in data:
        study.tuning = _tuning(read, data["tuning"])
    _check_configurations(read, study)
    return study


def _verdict(read: _Reader, node: Any) -> Dict[str, Any]:
    out = dict(read.mapping(node, ("column", *OUTCOMES), "verdict"))
    read.required(out, ("column", *OUTCOMES), "verdict")
    for k in OUTCOMES:
        v = out[k]
        if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, str) and x for x in v):
            raise read.fail(f"verdict.{k}: {v!r}: [the verdict, its legend]")
    return out


def _tuning(read: _Reader, node: Any) -> Tuning:
    """``tuning``, every value checked: validation only (a test score never chooses), a grid of distinct positive
    numbers, a factor above 1."""
    t = {**TUNING_DEFAULTS, **read.mapping(node, TUNING, "tuning")}
    read.required(t, ("key", "grid", "metric"), "tuning")
    key = t["key"]
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise read.fail(f"tuning.key: {key!r}: a setting as on the command line (optim.lr)")
    grid = t["grid"]
    numbers = isinstance(grid, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in grid)
    if not numbers or not grid or not all(v > 0 for v in grid) or len(set(grid)) != len(grid):
        text = next((v for v in grid if isinstance(v, str)), None) if isinstance(grid, list) else None
        hint = f" (YAML reads {text} as text: write it with a point, 1.0e-3)" if text and _number(text) else ""
        raise read.fail(f"tuning.grid: {grid!r}: a list of distinct positive numbers{hint}")
    factor = t["factor"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 1:
        raise read.fail(f"tuning.factor: {factor!r}: a number above 1 (the step beyond an edge of the grid)")
    for k in ("max_extensions", "seed"):
        if not isinstance(t[k], int) or isinstance(t[k], bool) or t[k] < 0:
            raise read.fail(f"tuning.{k}: {t[k]!r}: a whole number, 0 or more")
    metric = read.metric(t["metric"], "tuning.metric")
    if not metric.startswith("val/"):
        raise read.fail(f"tuning.metric: {metric!r}: validation only (val/<name>): the tuning never scores test")
    if t["mode"] not in MODES:
        raise read.fail(f"tuning.mode: {t['mode']!r}: one of {', '.join(MODES)}")
    return Tuning(
        key, tuple(sorted(float(v) for v in grid)), float(factor), t["max_extensions"], t["seed"], metric, t["mode"]
    )


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def experiment_models(name: str, conf_dir: Path) -> Optional[List[str]]:
    """The models ``conf/experiment/<name>.yaml`` sweeps (``hydra.sweeper.params.model``), None when it names none."""
    path = conf_dir / "experiment" / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        models = data["hydra"]["sweeper"]["params"]["model"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return [m.strip() for m in str(models).split(",") if m.strip()]


def _check_configurations(read: _Reader, study: Study) -> None:
    """Every configuration a study of ``conf/study/`` names is one its experiment runs (a typo is one line)."""
    if study.path.resolve().parent != (CONF_DIR / "study").resolve():
        return
    models = experiment_models(study.path.stem, CONF_DIR)
    if models is None:
        return
    named = [(f"pairs[{i}]", x) for i, p in enumerate(study.pairs) for x in p]
    named += [(f"claims[{i}].{k}", getattr(c, k)) for i, c in enumerate(study.claims) for k in "ab"]
    named += [("control.configuration", study.control["configuration"])] if study.control else []
    for where, x in named:
        if x not in models:
            raise read.fail(f"{where}: {x!r} is no model experiment={study.path.stem} runs; {nearest_hint(x, models)}")


def named(text: str) -> Study:
    """``--study``: a study of ``conf/study/`` by name, or a YAML file by its path."""
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return load(Path(text))
    path = CONF_DIR / "study" / f"{text}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in (CONF_DIR / "study").glob("*.yaml"))
        raise ConfigError(f"--study {text}: no {path}; {nearest_hint(text, have)}")
    return load(path)


def for_runs(runs: Sequence[Any]) -> Study:
    """The study of these runs: ``conf/study/<task_name>.yaml`` of their experiment, else ``default.yaml``."""
    conf_dir = CONF_DIR
    names = sorted({str(r.get("task_name")) for r in runs if r.get("task_name") is not None})
    found = [n for n in names if (conf_dir / "study" / f"{n}.yaml").is_file()]
    if len(found) == 1 and len(names) == 1:
        return load(conf_dir / "study" / f"{found[0]}.yaml")
    if found:
        raise ConfigError(
            f"the runs come from {len(names)} experiments ({', '.join(names)}), each with its own "
            f"claims: report each apart, or choose one with --study NAME"
        )
    return load(conf_dir / "study" / f"{DEFAULT}.yaml")
