"""What a study claims, read from its config: ``conf/study/<experiment>.yaml``, beside its experiment.

A study is data: its pairs, the claims it tables across its arms, their verdicts and its positive control live in
the YAML file, and ``linrope report`` (``linrope.analysis.report``, ``linrope.analysis.arms``) is one code path for
every study.  Runs of ``task_name: <experiment>`` are read with ``conf/study/<experiment>.yaml``, others with
``conf/study/default.yaml``; ``--study NAME|FILE`` chooses another.  The keys and why the file sits beside its
experiment: docs/methods.md, "Studies are data".  Read with ``yaml.safe_load``: nothing in it is built or imported;
each section's keys are declared below and checked by ``linrope.base.options``, and a bad key, value, metric or pair
is one line (``linrope.base.errors.ConfigError``) naming the file and the key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple

import yaml
from pydantic import Field

from linrope.base.errors import ConfigError, nearest_hint
from linrope.base.options import Count, Option, declared, option_errors
from linrope.config.command_line import CONF_DIR

Text = Annotated[str, Field(pattern=r"\S", description="not empty")]
Legend = Annotated[Tuple[Text, Text], Field(description="the verdict, its legend")]
ByOrder = Annotated[
    str, Field(pattern=r"^(train|val|test)/\w*[A-Za-z_]$", description="a logged metric less its order, test/acc_q")
]
Setting = Annotated[
    str, Field(pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", description="a setting as on the command line, optim.lr")
]
Grid = Annotated[
    Tuple[Annotated[float, Field(gt=0)], ...],
    Field(min_length=1, description="YAML reads 1e-3 as text: write it with a point, 1.0e-3"),
]


def _declare(**hints: Any) -> Dict[str, Option]:
    """A section the study keeps as a mapping: what each key takes, checked by ``linrope.base.options``."""
    return {key: Option(hint) for key, hint in hints.items()}


KEYS = _declare(pairs=Any, metric=Any, arms=Any, claims=Any, verdict=Any, control=Any, table=Any, tuning=Any)
ARMS = _declare(folder=Text, key=Text, label=Text, task=Text, axis=Text)
CONTROL = _declare(configuration=Text, at_least=float, at_most=float, what=Text)
TABLE = _declare(file=Text, title=Text, intro=Text, claims_intro=Text, caption=Text, configurations=bool, per_run=bool)
TABLE |= _declare(figure=Literal["claims", "by_arm"], figure_title=Text, by_order=ByOrder, collapse_below=float)
# a claim's signs (resolved or not) from the first arm to the last -> the verdict the study names for it
OUTCOMES = ("same", "opposite", "first_only", "last_only", "none", "unpaired", "single")
VERDICT = _declare(column=Text, **dict.fromkeys(OUTCOMES, Legend))
TUNING_DEFAULTS = {"factor": 2.0, "max_extensions": 3, "seed": 0, "mode": "min"}
# bpb@2048 (sliding windows, as trained), bpb@2048 windows, bpb@2048 windows window128: the extrapolation table's rows
METRIC = re.compile(r"(train|val|test)/\w+|(bpb|acc)@\d+( (windows|pi|ntk|yarn|dynamic|window\d+))*")
DEFAULT = "default"


@dataclass(frozen=True)
class Claim:
    text: Text  # the claim, as the study words it
    metric: str
    a: Text
    b: Text


@dataclass(frozen=True)
class Tuning:
    """A study's tuning stage (``tuning``): see the module docstring."""

    key: Setting  # the setting tuned, as on the command line (optim.lr)
    grid: Grid  # the values every configuration tries first, ascending (and distinct: see _tuning)
    factor: Annotated[float, Field(gt=1, description="the step beyond an edge of the grid")]  # × above, ÷ below
    max_extensions: Count  # values added beyond an edge at most, per configuration
    seed: Count  # the tuning runs' seed
    metric: str  # val/<name>: the best value logged over a run is its score
    mode: Literal["min", "max"]  # which is best

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

    def section(self, node: Any, keys: Mapping[str, Option], where: str, needs: Iterable[str] = ()) -> Dict[str, Any]:
        """``node``: a mapping of the ``keys`` declared, each value of its type (``linrope.base.options``), and
        the keys it ``needs``."""
        if not isinstance(node, dict):
            raise self.fail(f"{where or 'the file'}: a mapping of {', '.join(keys)}, not {type(node).__name__}")
        errors = option_errors(keys, node, where, what="key")
        missing = [k for k in needs if k not in node]
        if errors or missing:
            raise self.fail("; ".join(errors) or f"{where}: needs {', '.join(missing)}")
        return dict(node)

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
    data = read.section({} if data is None else data, KEYS, "")  # each section checked below
    metric = read.metric(data["metric"], "metric") if "metric" in data else None
    pairs = data.get("pairs") or []
    if not isinstance(pairs, list):
        raise read.fail(f"pairs: {pairs!r}: a list of pairs [A, B]")
    study = Study(name or path.stem, path, tuple(read.pair(p, f"pairs[{i}]") for i, p in enumerate(pairs)), metric)
    claims = data.get("claims") or []
    if not isinstance(claims, list):
        raise read.fail(f"claims: {claims!r}: a list of claims {{text, metric, a, b}}")
    for i, node in enumerate(claims):
        c = read.section(node, declared(Claim), f"claims[{i}]", needs=("a", "b"))
        a, b = read.pair([c["a"], c["b"]], f"claims[{i}]")
        if "metric" not in c and metric is None:
            raise read.fail(f"claims[{i}]: needs a metric (or the study's metric)")
        study.claims += (
            Claim(c.get("text", f"{a} − {b}"), read.metric(c.get("metric", metric), f"claims[{i}].metric"), a, b),
        )
    if "arms" in data:
        study.arms = read.section(data["arms"], ARMS, "arms", needs=("folder", "key", "task"))
        study.arms.setdefault("label", "{n}")
    if "verdict" in data:
        study.verdict = read.section(data["verdict"], VERDICT, "verdict", needs=VERDICT)
    if "control" in data:
        study.control = read.section(data["control"], CONTROL, "control", needs=("configuration",))
        if ("at_least" in study.control) == ("at_most" in study.control):
            raise read.fail("control: needs one bar, at_least or at_most")
        if metric is None:
            raise read.fail("control: needs the study's metric")
    if "table" in data or study.arms is not None:
        needs = ("file", "title") if study.arms is not None else ()  # the table of a study in arms
        study.table = read.section(data.get("table", {}), TABLE, "table", needs)
        if metric is None and (
            study.table.get("configurations") or study.table.get("figure") == "by_arm" or "by_order" in study.table
        ):
            raise read.fail("table: its configurations, by_order and the by_arm figure need the study's metric")
    if "tuning" in data:
        study.tuning = _tuning(read, data["tuning"])
    _check_configurations(read, study)
    return study


def _tuning(read: _Reader, node: Any) -> Tuning:
    """``tuning``, every value checked (its declaration: ``Tuning``), its metric validation only (a test score never
    chooses), its grid ascending."""
    t = {**TUNING_DEFAULTS, **read.section(node, declared(Tuning), "tuning", needs=("key", "grid", "metric"))}
    if len(set(t["grid"])) != len(t["grid"]):
        raise read.fail(f"tuning.grid: {t['grid']!r}: a list of distinct positive numbers")
    metric = read.metric(t["metric"], "tuning.metric")
    if not metric.startswith("val/"):
        raise read.fail(f"tuning.metric: {metric!r}: validation only (val/<name>): the tuning never scores test")
    grid = tuple(sorted(float(v) for v in t["grid"]))
    return Tuning(t["key"], grid, float(t["factor"]), t["max_extensions"], t["seed"], metric, t["mode"])


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
