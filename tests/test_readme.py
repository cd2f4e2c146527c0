"""README's code cannot drift from the code: its Python example runs and prints what its comments say, every command
line in its ``bash`` blocks (and in those of the docs that README's commands moved to, issue 51) names options and
keys that exist (the checks linrope runs before Hydra, without running the command), the flags of its argparse
commands exist, the cheap ones run, and the configuration table names every option of the groups it lists."""

import importlib
import importlib.util
import re
import shlex
import subprocess
import sys

import pytest

from linrope.config.command_line import check_command_line, group_options
from tests.helpers import CONF, ROOT

README = (ROOT / "README.md").read_text()
# the docs that hold the commands README's sections moved to (issue 51): checked as README's own
COMMAND_DOCS = ("README.md", "docs/usage.md", "docs/package.md")
HYDRA = {"train.py": "train", "linrope-train": "train", "linrope-evaluate": "evaluate"}
# `python -m <program>`: a command of linrope (`linrope evaluate`) or a module with a command line of its own
HYDRA_MODULES = {"linrope evaluate": "evaluate", "linrope generate": "generate", "linrope passkey": "passkey",
                 "linrope sweeps": "train", "linrope train": "train"}  # fmt: skip
ARGPARSE = {"linrope tokenize": "linrope.data.tokenize_command", "linrope report": "linrope.analysis.report.command",
            "linrope.evaluation.harness": "linrope.evaluation.harness",
            "linrope.evaluation.references": "linrope.evaluation.references"}  # fmt: skip


def program(args):
    """(``python -m``'s program, the rest of the arguments): ``linrope report`` for ``python -m linrope report``."""
    if args[2:3] == ["linrope"] and len(args) > 3:
        return f"linrope {args[3]}", args[4:]
    return args[2], args[3:]


def commands(doc: str = "README.md"):
    """Each command of a doc's bash blocks as its arguments (a ``&&`` chain split; a line ending in ``\\`` joined
    to the next; comments, placeholders ``<...>`` and the ``...`` that stands for more arguments handled)."""
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / doc).read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in filter(None, (p.strip() for p in line.split("&&"))):
                args = [a for a in shlex.split(re.sub(r"<[^>]+>", "x", part)) if a != "..."]
                if args:
                    yield part, args


CASES = [case for doc in COMMAND_DOCS for case in commands(doc)]
README_CASES = list(commands())


def python_blocks():
    """README's ``python`` blocks: the example of the API a newcomer copies."""
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_a_python_example_of_linear_attention_and_a_position_scheme():
    blocks = python_blocks()
    assert blocks, "README lost its Python example"
    code = "\n".join(blocks)
    assert "linear_attention(" in code and 'rope="numerator"' in code and "build_position(" in code


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.splitlines()[0][:40])
def test_the_readme_python_example_runs_and_prints_what_it_says(block):
    """The block runs as a user would paste it (a fresh interpreter), and each ``print(...)  # text`` line prints
    ``text``: the shapes, chunked against naive, the refused pairing."""
    expected = [m.group(1) for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+#[ \t]*(.+?)[ \t]*$", block, re.M)]
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert expected and r.stdout.splitlines() == expected, r.stdout


def test_the_readme_has_the_commands_this_test_reads():
    programs = {f"python -m {program(args)[0]}" if args[:2] == ["python", "-m"] else args[0] for _, args in CASES}
    assert {"python -m linrope evaluate", "python -m linrope report", "linrope-train"} <= programs
    assert sum(1 for _, a in CASES if a[:2] == ["python", "train.py"]) >= 15
    readme = {" ".join(args[:3]) for _, args in README_CASES}
    assert {"python3 -m venv", "python train.py model=linear_rope", "python -m pytest"} <= readme  # the quick start


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/submitit_\w+' is validated")  # as linrope.run.tidy filters it
@pytest.mark.parametrize("line,args", CASES, ids=[c[0][:60] for c in CASES])
def test_every_readme_command_names_options_that_exist(line, args):
    if args[:2] == ["python", "train.py"] or args[0] in HYDRA:
        name, rest = HYDRA.get(args[0]) or "train", args[1:] if args[0] in HYDRA else args[2:]
    elif args[:2] == ["python", "-m"] and program(args)[0] in HYDRA_MODULES:
        name, rest = HYDRA_MODULES[program(args)[0]], program(args)[1]
    elif args[:2] == ["python", "-m"] and program(args)[0] in ARGPARSE:
        return  # its flags: test_the_flags_readme_gives_an_argparse_command_exist
    else:
        if (line, args) in README_CASES:  # README's own: the install lines and pytest, nothing else
            assert args[0] in ("python3", "pip", ".", "python"), line
        if args[:3] == ["python", "-m", "linrope"]:
            from linrope.__main__ import COMMANDS

            assert args[3:4] and args[3] in COMMANDS, line
        elif args[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(args[2]) is not None, line
        return
    if "--config-dir" in rest:  # the user's own folder of presets: not in this checkout
        return
    check_command_line(rest, config_name=name, prefix=f"README: {line}")  # SystemExit, one line per problem


@pytest.mark.parametrize("command", ARGPARSE)
def test_the_flags_readme_gives_an_argparse_command_exist(command, capsys):
    used = {
        a.split("=")[0]
        for line, args in CASES
        if args[:2] == ["python", "-m"] and program(args)[0] == command
        for a in args
        if a.startswith("--")
    }
    main = importlib.import_module(ARGPARSE[command]).main
    shown = ""
    for words in ([], ["train"], ["shards"]) if command == "linrope tokenize" else ([],):
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        shown += capsys.readouterr().out
    assert {f for f in used if f not in shown} == set(), command


def test_train_help_as_readme_gives_it_runs_and_lists_the_groups():
    r = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "model: linear, linear_alibi," in r.stdout


def test_the_configuration_table_names_every_option_of_the_groups_it_lists():
    table = README.split("## Configuration")[1].split("Examples:")[0]
    for group in ("attention", "size", "data", "trainer", "callbacks", "logger", "experiment", "hparams_search"):
        row = next(line for line in table.splitlines() if line.startswith(f"| `{group}` |"))
        cell = row.split("|")[2]
        assert {o for o in group_options(group, CONF) if f"`{o}`" not in cell} == set(), group


CHEAP = [
    args
    for _, args in CASES
    if args[:2] == ["python", "train.py"]
    and "size=tiny" in args
    and "-m" not in args
    and "experiment=scale" not in args  # its stand-in data (data=text, a corpus folder) is the user's
    and any(a.startswith("trainer.max_steps=") and int(a.split("=")[1]) <= 100 for a in args)
]


@pytest.mark.slow  # a real training run each (about a minute)
@pytest.mark.parametrize("args", CHEAP, ids=[" ".join(a[2:])[:60] for a in CHEAP])
def test_the_cheap_readme_training_commands_run_and_say_where_their_run_is(args, tmp_path):
    """README's short training commands (size=tiny, at most 100 steps) run as written (logs under a temporary folder,
    CSV only), and the run ends by naming its folder and the report command (issue 54)."""
    extra = [f"paths.log_dir={tmp_path}", "logger=csv", "trainer.enable_progress_bar=false"]
    r = subprocess.run([sys.executable, *args[1:], *extra], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert str(tmp_path) in r.stdout and "python -m linrope report" in r.stdout, r.stdout[-2000:]


def test_the_readme_has_a_cheap_training_command_to_run():
    assert CHEAP, "README lost its size=tiny training example"
