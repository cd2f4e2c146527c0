"""linrope's commands: ``python -m linrope <command> [args ...]``; ``python -m linrope`` lists them.

Each console script of pyproject.toml (``linrope-train``, ``linrope-evaluate``, …) is one function below, the same
as ``python -m linrope <command>``.  The work lives in the layers; this table only names, for each command, the
function it runs and, for a Hydra command, the config whose ``--help`` is answered here.  Nothing but the standard
library is imported before a command is chosen: the list, an unknown command's one line and a Hydra command's
``--help`` come before Hydra, torch or Lightning is loaded.

A command sees its own arguments only (``sys.argv`` without the command word: Hydra and argparse read it), with
``sys.argv[0]`` naming it as typed (``python -m linrope train``: provenance.json's command, argparse's usage).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Dict, NamedTuple, Optional, Sequence


class Command(NamedTuple):
    target: str  # "module:function", called with no arguments once sys.argv holds the command's own
    config: Optional[str]  # a Hydra command's config (conf/<config>.yaml): its --help answered before the import
    about: str  # the line python -m linrope gives it


COMMANDS: Dict[str, Command] = {
    "train": Command("linrope.studies.train:run", "train", "train and test one model (conf/train.yaml; -m: a sweep)"),
    "evaluate": Command("linrope.evaluation.evaluate:run", "evaluate", "length extrapolation of a checkpoint"),
    "generate": Command("linrope.evaluation.generate:run", "generate", "sample text from a checkpoint"),
    "passkey": Command("linrope.evaluation.passkey:run", "passkey", "the pass-key probe of a checkpoint, 1-16x"),
    "report": Command("linrope.analysis.report.command:main", None, "a sweep's or a study's tables and figures"),
    "dashboard": Command("linrope.analysis.dashboard:main", None, "a sweep's wandb workspace and report, as code"),
    "sweeps": Command("linrope.studies.sweeps:main", None, "list and check the jobs of an experiment"),
    "study": Command("linrope.studies.study:main", None, "run a study job by job, across sessions"),
    "tokenize": Command("linrope.data.tokenize_command:main", None, "a byte-level BPE, token shards for data=text"),
}
HELP = ("-h", "--help", "help")


def listing() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {c.about}" for name, c in COMMANDS.items()]
    scripts = ", ".join(f"linrope-{name}" for name in SCRIPTS)
    return (
        "usage: python -m linrope <command> [args ...]\n\ncommands:\n" + "\n".join(lines) + "\n\n"
        "python -m linrope <command> --help: the command's options.  Installed, the console scripts are the same\n"
        f"commands: {scripts}.\n"
    )


def unknown(word: str) -> str:
    near = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]}?" if near else f"choose from {', '.join(COMMANDS)}"
    return f"linrope: {word}: no such command; {hint} (python -m linrope lists them)"


def run(name: str, args: Sequence[str], program: Optional[str] = None) -> int:
    """Run the command ``name`` with its arguments ``args``; its exit status.  ``program``: the name ``sys.argv[0]``
    holds while it runs (default: ``python -m linrope <name>``)."""
    command = COMMANDS[name]
    sys.argv = [program or f"python -m linrope {name}", *args]
    if command.config is not None:
        from linrope.config.command_line import answer_help  # standard library and PyYAML

        answer_help(command.config)  # --help: printed, exit 0, before the command's module loads torch
    module_name, function = command.target.split(":")
    module = importlib.import_module(module_name)
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__file__", None) == __file__:  # started as python -m linrope
        # as if started as `python -m <the command's module>`: Lightning's trainer=ddp starts each further process as
        # `python -m <__main__.__spec__.name>` with sys.argv[1:], and multiprocessing's spawn imports that module in
        # its processes; this table would read the first override as a command (linrope.studies.train runs as one)
        main.__spec__ = module.__spec__
    status = getattr(module, function)()
    return status if isinstance(status, int) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m linrope <command> [args ...]``: the command's exit status; the list of commands (exit 0) without a
    command or with --help; an unknown command: one line naming the nearest (exit 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in HELP:
        sys.stdout.write(listing())
        return 0
    if argv[0] not in COMMANDS:
        print(unknown(argv[0]), file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


def _script(name: str):
    """The console script ``linrope-<name>``: the command with the script's arguments, ``sys.argv[0]`` kept (its
    name is how provenance.json and argparse's usage line name it)."""

    def script() -> int:
        return run(name, sys.argv[1:], program=sys.argv[0])

    script.__name__ = script.__qualname__ = name
    script.__doc__ = f"``linrope-{name}``: the same as ``python -m linrope {name}``."
    return script


SCRIPTS = ("train", "evaluate", "generate", "passkey", "report", "dashboard", "tokenize")  # linrope-<name>
train, evaluate, generate, passkey, report, dashboard, tokenize = map(_script, SCRIPTS)

if __name__ == "__main__":
    sys.exit(main())
