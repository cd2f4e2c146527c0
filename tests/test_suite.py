"""The suite's own rules (tests/README.md): its folders mirror linrope's packages, a test module imports helpers and
never another test module nor conftest, and a test sees the same signals and environment however the suite was
started (from another folder, as ``nohup pytest &`` with SIGINT ignored, under a shell with WANDB_*, a rank or
another checkout on PYTHONPATH)."""

import ast
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, TINY, rel, tiny

TESTS = ROOT / "tests"


def test_each_folder_is_a_package_of_linrope():
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in ("fixtures", "__pycache__"))
    packages = {p.parent.name for p in (ROOT / "linrope").glob("*/__init__.py")}
    strays = [f for f in folders if f not in packages]
    assert folders and not strays, f"tests/ folders that are no package of linrope: {strays}"
    assert all((TESTS / f / "__init__.py").is_file() for f in folders)  # tests.<package>.<module>: one name each


def test_no_module_of_the_suite_imports_a_test_module_or_conftest():
    """Shared code is in tests/helpers.py or a folder's helper module: importing a test module runs its
    collection-time code a second time and ties two tests' meanings together."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                last = name.split(".")[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, found


def test_tiny_replaces_a_key_it_sets_and_appends_the_rest():
    assert tiny() == list(TINY)
    got = tiny("logger=csv", "test=false", "+callbacks.x._target_=a.B", "data.batch_size=2")
    assert got[: len(TINY)] == [
        {"logger=none": "logger=csv", "data.batch_size=4": "data.batch_size=2"}.get(o, o) for o in TINY
    ]
    assert got[len(TINY) :] == ["test=false", "+callbacks.x._target_=a.B"]


def test_rel_is_measured_in_float64_and_nan_fails_it():
    """A half-precision reference of norm 128 000 (above float16's 65 504): the error is still 0.001, where the
    measurement in float16 gave 0 (a norm of inf below).  A zero reference: 0 for a zero result, huge otherwise."""
    b = torch.full((4096,), 2000.0, dtype=torch.float16)
    assert rel(b + 2, b) == pytest.approx(1e-3) and ((b + 2 - b).norm() / b.norm()).item() == 0
    zero = torch.zeros(3)
    assert rel(zero, zero) == 0 and rel(zero + 1, zero) > 1e200
    assert math.isnan(rel(torch.tensor([float("nan"), 1.0]), torch.ones(2)))  # fails every `rel(...) < tol`


PROBE = """
import os, signal, subprocess, sys

def test_the_launch_is_not_seen(tmp_path):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    child = subprocess.run([sys.executable, "-c", "import signal, importlib.util as u; print(signal.getsignal("
                            "signal.SIGINT) is signal.default_int_handler, u.find_spec('linrope').origin)"],
                           capture_output=True, text=True, cwd=tmp_path, check=True)
    assert child.stdout.split() == ["True", os.path.join(ROOT, "linrope", "__init__.py")]
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_SILENT"] == "true"
    assert not [k for k in os.environ if k.startswith(("WANDB_API", "SLURM_")) or k in ("RANK", "HYDRA_FULL_ERROR")]
"""


def test_a_launch_from_elsewhere_with_sigint_ignored_and_a_foreign_environment_is_not_seen(tmp_path):
    """The suite's conftest as a plugin, on one probing test, started as badly as we know: from another folder,
    SIGINT and SIGTERM ignored, an online wandb with a key, a SLURM task and a rank, Hydra's full errors, and
    another folder first on PYTHONPATH holding a linrope of its own."""
    decoy = tmp_path / "decoy"
    (decoy / "linrope").mkdir(parents=True)
    (decoy / "linrope" / "__init__.py").write_text("")
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "test_probe.py").write_text(f"ROOT = {str(ROOT)!r}\n{PROBE}")
    env = {
        **os.environ,
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "x" * 40,
        "SLURM_NTASKS": "2",
        "RANK": "1",
        "HYDRA_FULL_ERROR": "1",
        "PYTHONPATH": os.pathsep.join([str(decoy), str(ROOT)]),
    }

    def ignored():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path / "probe"),
            str(tmp_path / "probe"),
        ],
        cwd=tmp_path,
        env=env,
        preexec_fn=ignored,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
