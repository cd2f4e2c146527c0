"""The command line, checked before Hydra runs anything: an unknown option of a config group (``model=nope``)
is one line that lists the options there are, and an unknown key (``trainer.max_step=10``) one line that names
the nearest key (Hydra's own messages are several lines).

``CONF_DIR`` is where linrope's configs are, and a user's own config folders (``--config-dir DIR`` / ``-cd DIR``,
``hydra.searchpath``) add their options to its: docs/package.md, "Where the configs are" and "Your own presets and
experiments".

``answer_help`` answers ``--help`` of the Hydra commands before Hydra, torch or Lightning is imported: the
``hydra.help.template`` of the command's config (``conf/train.yaml``'s is in ``conf/hydra/default.yaml``), with
``$APP_CONFIG_GROUPS`` filled in from the config folders; ``--cfg job`` prints every key and its value.  Standard
library and PyYAML at the top level: ``python -m linrope evaluate --help`` answers as fast as an argparse command."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import FrozenSet, List, Optional, Sequence

_PACKAGED = Path(__file__).resolve().parents[1] / "conf"  # linrope/conf in an installed wheel
CONF_DIR = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "conf"
_FLAGS_WITH_VALUE = set(
    "-c --cfg -p --package --info -cp --config-path -cn --config-name -cd --config-dir --experimental-rerun".split()
)


class _Unknown(Exception):
    """A config source this check cannot read (pkg://..., another primary config path): leave it to Hydra."""


def group_options(group: str, conf_dir: Path = CONF_DIR, extra: Sequence[Path] = ()) -> List[str]:
    """The options of a config group: its YAML files in ``conf_dir`` and in the user's ``extra`` folders."""
    found = set()
    for root in (conf_dir, *extra):
        folder = root / group
        if folder.is_dir():
            found.update(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))
    return sorted(found)


def _search_path_entries(value: str) -> List[Path]:
    """The folders of ``hydra.searchpath=[file://A,B]``: plain paths or ``file://`` ones (another scheme: refused)."""
    entries = []
    for item in value.strip().strip("[]").split(","):
        item = item.strip().strip("'\"")
        if not item:
            continue
        if "://" in item and not item.startswith("file://"):
            raise _Unknown(item)
        entries.append(Path(item.removeprefix("file://")).expanduser())
    return entries


def user_config_dirs(argv: Sequence[str]) -> List[Path]:
    """The folders of the user's own configs named on the command line, as Hydra reads them:
    ``--config-dir DIR`` (``-cd DIR``, ``--config-dir=DIR``) and ``hydra.searchpath=[file://DIR,...]``
    (relative to the current folder). Raises ``_Unknown`` for a source it cannot list (``pkg://``,
    ``--config-path``)."""
    dirs: List[Path] = []
    for arg in config_dirs_as_overrides(argv):
        flag, eq, inline = arg.partition("=")
        if flag in ("-cp", "--config-path"):
            raise _Unknown(arg)
        if flag.lstrip("+") == "hydra.searchpath" and eq:
            dirs.extend(_search_path_entries(inline))
    return [d if d.is_absolute() else Path(os.getcwd()) / d for d in dirs]


def config_dirs_as_overrides(argv: Sequence[str]) -> List[str]:
    """``argv`` with ``--config-dir DIR`` / ``-cd DIR`` / ``--config-dir=DIR`` turned into the override Hydra's
    compose API reads (``hydra.searchpath=[file://DIR]``): tools that compose without Hydra's command line
    (linrope sweeps, linrope study) find a user's configs as train.py does."""
    out: List[str] = []
    dirs: List[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        if flag in ("-cd", "--config-dir"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            dirs.append(str(Path(value).expanduser().resolve()))
            i += 1 if eq else 2
            continue
        out.append(args[i])
        i += 1
    if dirs:
        out.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]")
    return out


def compose_config(overrides: Sequence[str], conf_dir: Path = CONF_DIR, config_name: str = "train", hydra_config=False):
    """``conf/<config_name>.yaml`` composed with ``overrides``, outside any Hydra run (tools, checks, tests)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=hydra_config)
    finally:
        GlobalHydra.instance().clear()


def command_line_errors(argv: Sequence[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> List[str]:
    """``group=option`` overrides of the config groups in ``conf/`` (and in the user's config folders on the
    command line) whose option has no file there, and ``study=…`` of a training run (``conf/study`` is read by the
    report only). Sweeps (``model=a,b``) are checked item by item; values with
    Hydra functions, globs or interpolations, and Hydra's own groups (hydra/...), are left to Hydra."""
    errors: List[str] = []
    args = list(argv)
    try:
        extra = user_config_dirs(args)
    except _Unknown:
        return errors  # a config source only Hydra can list
    for folder in extra:  # Hydra searches linrope's configs first: a file of the same name there hides the user's
        for path in sorted(folder.rglob("*.yaml")) if folder.is_dir() else ():
            name = path.relative_to(folder).as_posix()
            if (conf_dir / name).is_file():
                errors.append(
                    f"{path}: hidden by linrope's conf/{name} (Hydra reads that one); give yours another name"
                )
    for arg in _overrides(args):
        if "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~").split("@", 1)[0]
        if key == "study" and config_name == "train":
            errors.append(
                f"{arg}: conf/study/ says what a study claims, read by linrope report, not an option of a run; run "
                f"the study's jobs with: python train.py -m experiment={value.strip() or '<name>'}"
            )
            continue
        if not key or key.startswith("hydra") or "." in key or not any((d / key).is_dir() for d in (conf_dir, *extra)):
            continue
        value = value.strip()
        if not value or any(c in value for c in "()[]{}*$'\"\\"):
            continue
        options = group_options(key, conf_dir, extra)
        for item in (v.strip() for v in value.split(",")):
            if item and item not in ("null", "None") and item not in options:
                where = ", ".join([f"conf/{key}/{item}.yaml", *(str(d / key / f"{item}.yaml") for d in extra)])
                errors.append(f"{key}={item}: no such option ({where}); choose from {', '.join(options)}")
            elif item and item not in ("null", "None"):
                errors.extend(preset_errors(key, item, conf_dir, extra))
    return errors


def yaml_problem(path: Path) -> Optional[str]:
    """Why Hydra cannot read ``path`` as a config (not YAML, or YAML that is not a mapping), or None."""
    import yaml

    try:
        from omegaconf._utils import get_yaml_loader  # the loader Hydra reads configs with

        loader = get_yaml_loader()
    except ImportError:  # pragma: no cover - an OmegaConf without it
        loader = yaml.SafeLoader
    try:
        with open(path, "rb") as f:
            content = yaml.load(f, Loader=loader)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        what = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        where = f" at byte {e.position}" if isinstance(getattr(e, "position", None), int) else ""
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else where
        return f"is not YAML: {what}{where}"
    if content is not None and not isinstance(content, dict):
        return f"is not a config: YAML of keys and values is expected, this file holds a {type(content).__name__}"
    return None


def _option_file(group: str, option: str, conf_dir: Path, extra: Sequence[Path]) -> Optional[Path]:
    """The file Hydra reads for ``group=option``: linrope's first, then the user's folders."""
    for root in (conf_dir, *extra):
        path = root / group / f"{option}.yaml"
        if path.is_file():
            return path
    return None


def preset_errors(
    group: str,
    option: str,
    conf_dir: Path = CONF_DIR,
    extra: Sequence[Path] = (),
    seen: Optional[set] = None,
    via: str = "",
) -> List[str]:
    """One line for the file of ``group=option`` — or of an option its defaults list chooses — that Hydra would
    stop on with a 70-line YAML traceback (a preset that is not YAML, or not a mapping), naming the file."""
    seen = set() if seen is None else seen
    path = _option_file(group, option, conf_dir, extra)
    if path is None or path in seen:
        return []
    seen.add(path)
    problem = yaml_problem(path)
    if problem:
        return [f"{via}{group}={option}: {path} {problem}"]
    import yaml

    try:
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except Exception:  # noqa: BLE001 - read above; anything odd is Hydra's to say
        return []
    errors: List[str] = []
    for entry in defaults if isinstance(defaults, list) else []:
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        ((key, value),) = entry.items()
        key = str(key).replace("override ", "").strip().split("@", 1)[0]
        if not isinstance(value, str) or key.startswith("hydra") or "${" in value:
            continue
        sub = key.lstrip("/") if key.startswith("/") else f"{group.rsplit('/', 1)[0]}/{key}" if "/" in group else key
        errors.extend(preset_errors(sub, value, conf_dir, extra, seen, via or f"{group}={option} chooses "))
    return errors


def _overrides(argv: Sequence[str]) -> List[str]:
    """The overrides of a command line (its flags and their values dropped), with the user's config folders
    as ``hydra.searchpath`` (``config_dirs_as_overrides``)."""
    out: List[str] = []
    skip_next = False
    for arg in config_dirs_as_overrides(argv):
        if skip_next:
            skip_next = False
        elif arg.startswith("-"):
            skip_next = arg in _FLAGS_WITH_VALUE
        else:
            out.append(arg)
    return out


@functools.lru_cache(maxsize=1)
def trainer_parameters() -> FrozenSet[str]:
    """The keyword arguments of Lightning's Trainer, read from its source (importing Lightning costs seconds, and
    this is a light path); empty where the source is not where it is expected."""
    spec = importlib.util.find_spec("lightning")  # a top-level package: found, not imported
    if spec is None or spec.origin is None:
        return frozenset()
    try:
        tree = ast.parse((Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return frozenset(a.arg for a in [*f.args.args, *f.args.kwonlyargs] if a.arg != "self")
    return frozenset()


def unknown_key_errors(argv: Sequence[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> List[str]:
    """Plain overrides (``key=value``: no ``+``, ``++`` or ``~``) of a key the composed config does not have
    (``trainer.max_step=10``), one line each naming the nearest key there is (Hydra's own message is six lines
    and names none). The config is composed from the command line's other overrides; a command line with a
    sweep among those, another primary config, or anything Hydra would refuse is left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from linrope.base.errors import UnknownOption

    try:
        extra = user_config_dirs(argv)
        parsed = OverridesParser.create().parse_overrides(_overrides(argv))
    except Exception:  # pkg:// or --config-path, or a line Hydra's parser refuses: Hydra says it
        return []
    plain, rest = [], []
    for o in parsed:
        key = o.key_or_group
        group = any((d / key).is_dir() for d in (conf_dir, *extra))
        is_plain = not (o.is_add() or o.is_force_add() or o.is_delete() or group or key.startswith("hydra"))
        (plain if is_plain else rest).append(o)
    if not plain or any(o.is_sweep_override() for o in rest):
        return []
    try:
        tree = OmegaConf.to_container(
            compose_config([o.input_line for o in rest], conf_dir, config_name), resolve=False
        )
    except Exception:  # noqa: BLE001 - Hydra says it
        return []
    errors = []
    for o in plain:
        node, parts = tree, o.key_or_group.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, dict):
                break  # below a value or a list: Hydra's to say
            if part not in node:
                line = str(UnknownOption(".".join(parts[: i + 1]), node))
                if parts[:-1] == ["trainer"] and part in trainer_parameters():  # the preset leaves it out
                    line = (
                        f"{o.key_or_group}: not in the composed config, but Lightning's Trainer takes it: add it "
                        f"with +{o.input_line}"
                    )
                elif i == len(parts) - 1 and "did you mean" not in line:  # perhaps an option its preset leaves out
                    line += f" (an option the composed config leaves out is added with +: +{o.input_line})"
                errors.append(line)
                break
            node = node[part]
    return errors


SLURM_COUNTS = ("nodes", "tasks_per_node", "gpus_per_node")  # conf/hydra/launcher/submitit_slurm.yaml: from trainer.*


def launcher_errors(argv: Sequence[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> List[str]:
    """With ``hydra/launcher=submitit_slurm``: the launcher's node, task and GPU counts (which follow
    ``trainer.num_nodes`` and ``trainer.devices``) must be numbers, e.g. not ``trainer.devices=auto`` (Hydra
    would refuse them at launch in several lines).  The config is composed from the command line's
    overrides that sweep nothing; anything else is left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    overrides = _overrides(argv)
    if not any(o.lstrip("+").startswith("hydra/launcher=") and "slurm" in o for o in overrides):
        return []
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Hydra's note on the plugin's schema: Hydra says it again at launch
            cfg = compose_config(fixed, conf_dir, config_name, hydra_config=True)
        launcher = cfg.hydra.launcher
    except Exception:  # noqa: BLE001 - a line Hydra refuses: Hydra says it
        return []
    raw = OmegaConf.to_container(launcher, resolve=False)
    bad: dict = {}  # (source key or None, value): the launcher's keys that take it
    for key in SLURM_COUNTS:
        text = str(raw.get(key))
        source = text[2:-1] if text.startswith("${") and text.endswith("}") else None
        value = OmegaConf.select(cfg, source) if source else raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            bad.setdefault((source, str(value)), []).append(key)
    return [
        f"hydra.launcher.{', '.join(keys)} follow{'s' * (len(keys) == 1)} {source}={value}: SLURM needs a number "
        f">= 1; pass {source}=<a number>"
        if source
        else f"hydra.launcher.{keys[0]}={value}: SLURM needs a number >= 1"
        for (source, value), keys in bad.items()
    ]


def encoding_errors(argv: Sequence[str]) -> List[str]:
    """Arguments that are not UTF-8 (``prompt=$'\\xff'``, text in another encoding): Python keeps such bytes as
    lone surrogates, on which Hydra's parser stops with a LexerNoViableAltException.  One line each, naming
    the key and the first byte that is not UTF-8."""
    errors = []
    for arg in argv:
        bad = next((i for i, c in enumerate(arg) if 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is None:
            continue
        key, eq, _ = arg.partition("=")
        start = len(key) + 1 if eq and len(key) < bad else 0
        name = key if start else "an argument"
        at = len(arg[start:bad].encode("utf-8", errors="surrogateescape"))
        value = ord(arg[bad]) - 0xDC00 if 0xDC80 <= ord(arg[bad]) <= 0xDCFF else None
        byte = f"byte 0x{value:02x}" if value is not None else "a character"
        errors.append(f"{name}: is not UTF-8 text ({byte} at byte {at} of the value); give it in UTF-8")
    return errors


def grammar_errors(argv: Sequence[str]) -> List[str]:
    """One line per override Hydra's grammar refuses (``'lengths=[64'``, an unquoted ``ckpt=a/epoch=1.ckpt``): its
    own message is several lines and names neither the cure nor, for ``=``, the cause."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    errors = []
    for arg in _overrides(argv):
        try:
            parser.parse_overrides([arg])
        except Exception as e:  # noqa: BLE001 - Hydra's OverrideParseException, or another refusal of the line
            key, _, value = arg.partition("=")
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            cure = (
                f"a value holding '=' is quoted: '{key}=\"{value}\"'"
                if "=" in value
                else "check its brackets and quotes (lists as [a,b]; a value with spaces or brackets quoted)"
            )
            errors.append(f"{arg}: Hydra cannot read it ({why}); {cure}")
    return errors


def check_command_line(
    argv: Optional[Sequence[str]] = None, conf_dir: Path = CONF_DIR, config_name: str = "train", prefix: str = "linrope"
) -> None:
    """Exit with one line per argument that is not UTF-8, unknown config-group option (``model=nope``) or unknown key
    (``trainer.max_step=10``) on the command line, or a SLURM launcher asked for a count that is no number
    (``launcher_errors``) — before Hydra, whose own messages are several lines."""
    argv = sys.argv[1:] if argv is None else argv
    errors = (
        encoding_errors(argv)
        or grammar_errors(argv)
        or command_line_errors(argv, conf_dir, config_name)
        or unknown_key_errors(argv, conf_dir, config_name)
        or launcher_errors(argv, conf_dir, config_name)
    )
    if errors:
        raise SystemExit("\n".join(f"{prefix}: {e}" for e in errors))


HELP_FLAGS = ("--help", "-h")


def template(config_name: str, conf_dir: Path = CONF_DIR) -> str:
    """The ``hydra.help.template`` of ``conf/<config_name>.yaml`` (for ``train``: of ``conf/hydra/default.yaml``)."""
    import yaml

    path = conf_dir / ("hydra/default.yaml" if config_name == "train" else f"{config_name}.yaml")
    node = yaml.safe_load(path.read_text()) or {}
    node = node if config_name == "train" else node.get("hydra") or {}
    return str((node.get("help") or {}).get("template") or "")


def config_groups(conf_dir: Path = CONF_DIR) -> str:
    """``group: option, option, ...`` per config group of ``conf_dir`` (Hydra's own groups and ``study`` left out)."""
    # conf/study is read by linrope report, never composed into a run (command_line_errors refuses study=)
    groups = sorted(p.name for p in conf_dir.iterdir() if p.is_dir() and p.name not in ("hydra", "study"))
    return "\n".join(f"{g}: {', '.join(group_options(g, conf_dir))}" for g in groups)


def command_help(config_name: str, conf_dir: Path = CONF_DIR) -> str:
    return template(config_name, conf_dir).replace("$APP_CONFIG_GROUPS", config_groups(conf_dir)).rstrip() + "\n"


def answer_help(config_name: str, argv: Optional[Sequence[str]] = None, conf_dir: Path = CONF_DIR) -> None:
    """With ``--help`` / ``-h`` on the command line: print the command's help and exit 0; otherwise nothing."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in HELP_FLAGS for a in argv):
        sys.stdout.write(command_help(config_name, conf_dir))
        raise SystemExit(0)


from linrope.base.naming import program  # noqa: E402,F401 - where the commands have long imported it from
