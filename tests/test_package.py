"""linrope beyond its checkout (issue 26): the wheel carries the configs (written once, in conf/) and its
commands; a user's own config folder adds presets, checked as the built-in ones.

The slow test builds the wheel, installs it (no dependencies: they come from this environment through a .pth
line, so nothing is downloaded and the checkout is not on sys.path) and runs every command from an empty folder."""

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import CONF, ROOT

SCRIPTS = {
    f"linrope-{name}": f"linrope.__main__:{name}"
    for name in ("train", "evaluate", "generate", "passkey", "tokenize", "report", "dashboard")
}
PRESET = "# @package _global_\ndefaults:\n  - override /attention: linear\n  - override /position: rope\nmodel:\n  name: {name}\n"


def pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_commands_are_declared_and_defined():
    """Each console script is a command of ``python -m linrope`` (linrope/__main__.py), and each command of its table
    names a function its module defines."""
    from linrope import __main__ as entry

    assert pyproject()["project"]["scripts"] == SCRIPTS
    for target in SCRIPTS.values():
        module, function = target.split(":")
        assert module == "linrope.__main__" and function in entry.COMMANDS and callable(getattr(entry, function))
    for name, command in entry.COMMANDS.items():
        module, function = command.target.split(":")
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name


def _names(requirements):
    import re

    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}


def test_extras_every_user_installs_pin_nothing_torch_pins():
    """README's install (`.[dev]` beside `torch==X`) must resolve with the CUDA build of torch, which pins its own
    triton and nvidia-* wheels, and on a Mac, where triton has no wheels: the extras a user installs beside any torch
    name none of those. The interpreter's triton pin lives in `interp`, for the CPU build only (tools/resolve.sh,
    docs/compat.md)."""
    extras = pyproject()["project"]["optional-dependencies"]
    pinned_by_torch = lambda name: name in {"torch", "triton"} or name.startswith("nvidia-")  # noqa: E731
    for extra in ("dev", "cluster", "sweep", "dashboards"):
        assert not [n for n in _names(extras[extra]) if pinned_by_torch(n)], extra
    # gpu: fla-core and the torch floor fla-core declares, no triton (the CUDA build brings its own)
    assert _names(extras["gpu"]) == {"fla-core", "torch"}
    assert "torch>=2.7" in extras["gpu"]
    assert "triton==3.9.0" in extras["interp"] and "fla-core==0.6.0" in extras["interp"]


def test_the_wheel_holds_every_package_and_the_configs():
    """pyproject.toml lists the packages (a mapped package cannot be found by setuptools' find): every folder of
    linrope/ with an __init__.py, and linrope.conf built from the top-level conf/."""
    tool = pyproject()["tool"]["setuptools"]
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "linrope").rglob("__init__.py")}
    assert set(tool["packages"]) == packages | {"linrope.conf"}
    assert tool["package-dir"] == {"linrope.conf": "conf"}
    assert tool["package-data"] == {
        "linrope.conf": ["**/*.yaml"],
        "linrope.ops.linear_attn": ["csrc/*.cpp", "csrc/*.h"],
    }


def test_git_holds_one_copy_of_the_configs():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    entries = [line.split(maxsplit=3) for line in tracked.splitlines()]
    assert not [p for mode, _, _, p in entries if mode == "120000"], "a symlink in git"
    # besides conf/, only the committed studies' run records (docs/results/), the harness task example (lm-eval's
    # task YAML, docs/examples/my_tasks/) and pre-commit's own settings
    others = ("docs/results/", "docs/examples/my_tasks/")
    yamls = [
        p
        for *_, p in entries
        if p.endswith((".yaml", ".yml")) and not p.startswith(others) and p != ".pre-commit-config.yaml"
    ]
    assert yamls and all(p.startswith("conf/") for p in yamls), [p for p in yamls if not p.startswith("conf/")]
    assert not (ROOT / "linrope" / "conf").exists()  # the build maps conf/ there, in the wheel only


def test_the_checkout_finds_its_configs():
    from linrope.config.command_line import CONF_DIR

    assert CONF_DIR == CONF


# ---- a user's own config folder -----------------------------------------------------------------------------
@pytest.fixture
def my_conf(tmp_path):
    conf = tmp_path / "my_conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "my_preset.yaml").write_text(PRESET.format(name="my_preset") + "  n_layers: 1\n")
    (conf / "model" / "typo.yaml").write_text(PRESET.format(name="typo") + "  n_layrs: 1\n")
    (conf / "dataset").mkdir()
    (conf / "dataset" / "mine.yaml").write_text("x: 1\n")
    return conf


def test_the_command_line_check_reads_the_users_config_folders(my_conf, monkeypatch):
    from linrope.config.command_line import command_line_errors

    errors = command_line_errors(["model=my_preset"])
    assert len(errors) == 1 and errors[0].startswith("model=my_preset: no such option")
    for flags in (
        ["-cd", str(my_conf)],
        ["--config-dir", str(my_conf)],
        [f"--config-dir={my_conf}"],
        [f"hydra.searchpath=[file://{my_conf}]"],
        [f"+hydra.searchpath=[file://{my_conf},pkg://other]"],
    ):
        assert command_line_errors([*flags, "model=my_preset", "dataset=mine", "size=tiny"]) == [], flags
    monkeypatch.chdir(my_conf.parent)  # relative to the folder the command is typed in, as for Hydra
    assert command_line_errors(["-cd", "my_conf", "model=my_preset,linear_rope"]) == []
    errors = command_line_errors(["-cd", "my_conf", "model=my_prest", "dataset=their"])
    assert [e.split(":")[0] for e in errors] == ["model=my_prest", "dataset=their"]
    assert f"{my_conf}/model/my_prest.yaml" in errors[0] and "my_preset" in errors[0] and "linear_rope" in errors[0]
    assert command_line_errors(["-cp", "elsewhere", "model=nope"]) == []  # another primary config: Hydra's to say


def test_a_users_file_named_like_a_built_in_one_is_refused(my_conf):
    """Hydra searches linrope's conf/ before the user's folders: my_conf/model/linear_rope.yaml would be ignored."""
    from linrope.config.command_line import command_line_errors

    (my_conf / "model" / "linear_rope.yaml").write_text(PRESET.format(name="linear_rope"))
    errors = command_line_errors(["-cd", str(my_conf), "model=my_preset"])
    assert errors == [
        f"{my_conf}/model/linear_rope.yaml: hidden by linrope's conf/model/linear_rope.yaml "
        "(Hydra reads that one); give yours another name"
    ]


def compose_with(my_conf, *overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(
                config_name="train",
                overrides=[
                    f"hydra.searchpath=[file://{my_conf}]",
                    "size=tiny",
                    f"paths.output_dir={my_conf.parent}",
                    *overrides,
                ],
            )
    finally:
        GlobalHydra.instance().clear()


def test_a_users_preset_is_found_and_checked_strictly(my_conf):
    from linrope.config.checks import ConfigError, validate

    cfg = compose_with(my_conf, "model=my_preset")
    validate(cfg)
    assert cfg.model.name == "my_preset" and cfg.model.n_layers == 1
    with pytest.raises(ConfigError) as e:
        validate(compose_with(my_conf, "model=typo"))
    assert str(e.value) == "model.n_layrs: unknown option; did you mean n_layers?"


@pytest.mark.slow  # (the installed command is tested the same way in the wheel test)
def test_train_py_refuses_a_typo_in_a_users_preset_in_one_line(my_conf, tmp_path):
    run = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--config-dir",
            "my_conf",
            "model=typo",
            "size=tiny",
            "logger=none",
            f"hydra.run.dir={run}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert [l for l in r.stderr.splitlines() if l.startswith("linrope:")] == [
        "linrope: model.n_layrs: unknown option; did you mean n_layers?"
    ], r.stderr[-2000:]
    assert not run.exists()


# ---- the wheel, installed, from an empty folder ----------------------------------------------------------------
def build_wheel(out: Path) -> Path:
    """The wheel of the files git tracks or would (a clean copy: no stale build/ folder can add a deleted file)."""
    src = out / "src"
    if (ROOT / ".git").exists():
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        for name in filter(None, files.stdout.split("\0")):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
    else:
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "logs", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            str(src),
            "-w",
            str(out / "dist"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return next((out / "dist").glob("linrope-*.whl"))


def outside_env() -> dict:
    """This environment without the variables that would put the checkout on sys.path (a checkout there also
    looks installed to pip)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def install(wheel: Path, venv: Path) -> None:
    """A fresh venv holding the wheel; the rest of the dependencies from this environment's site-packages, added
    by a .pth line after the wheel is installed (pip never sees the editable checkout; .pth files there are not
    run, so the checkout stays off sys.path)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=outside_env(),
    )
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "_linrope_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


@pytest.mark.slow
def test_the_installed_wheel_trains_and_evaluates_from_an_empty_folder(tmp_path):
    import zipfile

    wheel = build_wheel(tmp_path / "build")
    names = zipfile.ZipFile(wheel).namelist()
    packaged = sorted(n.removeprefix("linrope/conf/") for n in names if n.startswith("linrope/conf/"))
    assert packaged == sorted(p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml"))
    csrc = ROOT / "linrope/ops/linear_attn/csrc"  # the native kernels' C++
    assert {p.relative_to(ROOT).as_posix() for p in csrc.iterdir()} <= set(names)
    venv = tmp_path / "venv"
    install(wheel, venv)
    work = tmp_path / "empty"
    work.mkdir()
    env = outside_env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")

    def run(command, *args):
        r = subprocess.run(
            [str(venv / "bin" / command), *args], capture_output=True, text=True, cwd=work, env=env, timeout=600
        )
        return r

    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import linrope, linrope.config.command_line as c; print(linrope.__file__); print(c.CONF_DIR)",
        ],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the installed copy, not the checkout

    for command in SCRIPTS:
        r = run(command, "--help")
        assert r.returncode == 0 and "Traceback" not in r.stderr, (command, r.stderr[-2000:])
        assert ("usage: " + command) in r.stdout or r.stdout.startswith(command + " "), command
    assert "model: linear," in run("linrope-train", "--help").stdout
    r = run("python", "-m", "linrope")
    assert r.returncode == 0 and "  evaluate " in r.stdout and "  study " in r.stdout, r.stderr[-2000:]

    r = run("linrope-train", "model=linear_rope", "size=tiny", "trainer.max_steps=2", "data.max_bytes=400000")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((work / "logs" / "train" / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "checkpoints" / "last.ckpt").is_file()
    assert (runs[0] / "csv" / "metrics.csv").is_file() and (runs[0] / "provenance.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["logs"]
    assert '"command": "linrope-train model=linear_rope' in (runs[0] / "provenance.json").read_text()

    r = run(
        "linrope-evaluate",
        f"ckpt={runs[0] / 'checkpoints' / 'last.ckpt'}",
        "lengths=[64]",
        "scored_bytes=4096",
        "scalings=[]",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    table = (runs[0] / "evaluate" / "evaluate.csv").read_text().splitlines()
    assert table[0].startswith("length") and table[1].startswith("64,"), table

    mine = work / "my_conf" / "model"
    mine.mkdir(parents=True)
    (mine / "my_preset.yaml").write_text(PRESET.format(name="my_preset") + "  n_layers: 1\n")
    r = run("linrope-train", "--config-dir", "my_conf", "model=my_preset", "size=tiny", "--cfg", "job")
    assert r.returncode == 0 and "name: my_preset" in r.stdout and "n_layers: 1" in r.stdout, r.stderr[-2000:]
    r = run("linrope-train", "model=my_preset", "size=tiny")  # without the folder: one line naming the options
    assert r.returncode == 1 and r.stderr.strip().startswith("linrope: model=my_preset: no such option"), r.stderr
    (mine / "my_preset.yaml").write_text(PRESET.format(name="my_preset") + "  n_layrs: 1\n")
    r = run("linrope-train", "-cd", "my_conf", "model=my_preset", "size=tiny", "trainer.max_steps=2")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert [l for l in r.stderr.splitlines() if l.startswith("linrope:")] == [
        "linrope: model.n_layrs: unknown option; did you mean n_layers?"
    ], r.stderr[-2000:]
    assert len(list((work / "logs" / "train" / "runs").iterdir())) == 1  # no folder for the refused run


def test_a_run_started_by_a_command_records_it_as_typed():
    from linrope.run.provenance import collect

    assert collect(argv=["/home/me/.venv/bin/linrope-train", "size=tiny"])["command"] == "linrope-train size=tiny"
    assert collect(argv=["train.py", "size=tiny"])["command"] == "python train.py size=tiny"
