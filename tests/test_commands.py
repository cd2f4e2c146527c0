"""One command entry (linrope/__main__.py): ``python -m linrope <command>`` runs every command, lists them, names
the nearest to an unknown one, answers a Hydra command's ``--help`` before torch or Lightning loads, and gives each
command its own arguments (the console scripts of pyproject.toml are the same functions: tests/test_package.py)."""

import subprocess
import sys
import types

import pytest

from linrope import __main__ as entry
from tests.helpers import ROOT


def linrope(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "linrope", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_python_m_linrope_lists_every_command_one_line_each(args):
    r = linrope(*args)
    assert r.returncode == 0 and r.stderr == ""
    lines = [line.split() for line in r.stdout.splitlines() if line.startswith("  ")]
    assert [words[0] for words in lines] == list(entry.COMMANDS)


def test_an_unknown_command_is_one_line_naming_the_nearest():
    r = linrope("trian", "model=linear_rope")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "linrope: trian: no such command; did you mean train? (python -m linrope lists them)"
    ]
    r = linrope("xyzzy")
    assert r.returncode == 2 and r.stderr.startswith("linrope: xyzzy: no such command; choose from train, evaluate,")


def test_the_list_and_a_hydra_commands_help_load_neither_hydra_torch_nor_lightning():
    code = (
        "import sys\n"
        "from linrope.__main__ import main\n"
        "main([])\n"
        "listed = sorted({m.split('.')[0] for m in sys.modules} & {'hydra', 'torch', 'lightning'})\n"
        "for name in ('evaluate', 'generate', 'passkey'):\n"
        "    try:\n"
        "        main([name, '--help'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "print(listed, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning'}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "[] []"
    assert "linrope-passkey ckpt=PATH" in r.stdout


@pytest.mark.parametrize("name", list(entry.COMMANDS))
def test_every_command_answers_help(name):
    r = linrope(name, "--help", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.strip()


def test_a_command_sees_its_own_arguments_and_restarts_as_its_own_module(monkeypatch, capsys):
    """``sys.argv`` without the command word, named as typed; and ``__main__`` taken for the command's module, which
    Lightning's trainer=ddp restarts with ``python -m`` (tests/run/test_slow_reliability.py runs it)."""
    started = types.ModuleType("__main__")
    started.__file__, started.__spec__ = entry.__file__, entry.__spec__  # python -m linrope
    monkeypatch.setitem(sys.modules, "__main__", started)
    monkeypatch.setattr(sys, "argv", [entry.__file__, "sweeps", "--help"])
    assert entry.main() == 0
    assert sys.argv == ["python -m linrope sweeps", "--help"]
    assert started.__spec__.name == "linrope.studies.sweeps"
    assert "Dry run of a sweep" in capsys.readouterr().out


def test_a_console_script_keeps_its_name(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/linrope-report", "--help"])
    with pytest.raises(SystemExit) as e:
        entry.report()
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: linrope-report ")


def test_a_run_started_as_python_m_linrope_records_it_as_typed():
    from linrope.run.provenance import collect

    command = collect(argv=["python -m linrope train", "size=tiny", "optim.lr=3e-4"])["command"]
    assert command == "python -m linrope train size=tiny optim.lr=3e-4"
