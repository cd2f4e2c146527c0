"""``--help`` of the Hydra commands, answered before Hydra, torch or Lightning is imported: what the command does,
its main options and an example, read from the ``hydra.help.template`` of its config (``conf/train.yaml``'s is in
``conf/hydra/default.yaml``), with ``$APP_CONFIG_GROUPS`` filled in from the config folders.  Hydra's own
``--help`` prints the same template (with no config dump in it); ``--cfg job`` prints every key and its value.

Standard library and PyYAML only: ``python -m linrope evaluate --help`` (linrope/__main__.py) answers as fast as
an argparse command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from linrope.config.command_line import CONF_DIR, group_options

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
    # conf/study is read by linrope report, never composed into a run (linrope.config.command_line refuses study=)
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
