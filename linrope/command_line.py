"""The command line, checked before Hydra composes anything: an unknown option of a config group
(``model=nope``) is one line that lists the options there are (Hydra's own message is several lines)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Sequence

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
_FLAGS_WITH_VALUE = {"-c", "--cfg", "-p", "--package", "--info", "-cp", "--config-path", "-cn", "--config-name",
                     "-cd", "--config-dir", "--experimental-rerun"}


def group_options(group: str, conf_dir: Path = CONF_DIR) -> List[str]:
    folder = conf_dir / group
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))


def command_line_errors(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> List[str]:
    """``group=option`` overrides of the config groups in ``conf/`` whose option has no file there.
    Sweeps (``model=a,b``) are checked item by item; values with Hydra functions, globs or
    interpolations, and Hydra's own groups (hydra/...), are left to Hydra."""
    errors: List[str] = []
    args = list(argv)
    if any(a.startswith(("hydra.searchpath", "+hydra.searchpath")) for a in args):
        return errors  # other config folders: Hydra knows more options than conf/ holds
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg.startswith("-"):
            skip_next = arg in _FLAGS_WITH_VALUE
            continue
        if "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~").split("@", 1)[0]
        if not key or key.startswith("hydra") or "." in key or not (conf_dir / key).is_dir():
            continue
        value = value.strip()
        if not value or any(c in value for c in "()[]{}*$'\"\\"):
            continue
        options = group_options(key, conf_dir)
        for item in (v.strip() for v in value.split(",")):
            if item and item not in ("null", "None") and item not in options:
                errors.append(f"{key}={item}: no such option (conf/{key}/{item}.yaml); choose from {', '.join(options)}")
    return errors


def check_command_line(argv: Optional[Sequence[str]] = None, conf_dir: Path = CONF_DIR) -> None:
    """Exit with one line per unknown config-group option on the command line (``model=nope``) — before
    Hydra, whose own message for it is several lines long."""
    errors = command_line_errors(sys.argv[1:] if argv is None else argv, conf_dir)
    if errors:
        raise SystemExit("\n".join("linrope: " + e for e in errors))
