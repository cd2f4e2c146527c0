"""What produced a number: the code, the libraries, the machine and the run's own settings (docs/usage.md,
"Provenance").

``collect(...)`` gathers, once per run: ``linrope`` (version, ``commit``, ``dirty``, ``diff_hash`` and ``code``, 12
hex digits naming the committed trees of ``linrope/`` and ``conf/`` with their uncommitted changes, so commits that
change only results, docs or tests share it), ``versions``, ``machine``, ``precision``, ``seed``, ``command``,
``overrides`` and ``started``.  ``write`` puts it in ``<run folder>/provenance.json``; it is also in every checkpoint
under ``PROVENANCE_KEY`` (plain values: it loads with ``weights_only=True``), the wandb config and hparams.yaml.

Foundation layer: no Lightning, no linrope import; torch only inside ``collect`` (it is loaded by then)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

PROVENANCE_KEY = "linrope_provenance"  # top-level key of every checkpoint linrope writes
CONFIG_KEY = "linrope_config"  # the run's whole resolved config, beside it (what a resume compares against)
FILE_NAME = "provenance.json"
NOT_GIT = "not a git checkout"
PACKAGES = ("torch", "lightning", "hydra-core", "wandb", "einops", "fla")
# the distribution that provides the module ``fla`` (flash-linear-attention, or fla-core)
_DISTRIBUTIONS = {"fla": ("flash-linear-attention", "fla-core")}
SOURCE = Path(__file__).resolve().parents[1]  # linrope/: git is asked about the checkout holding it
GIT_TIMEOUT_S = 5.0
CODE_PATHS = ("linrope", "conf")  # what a run executes (``code``)


def _git(args: Sequence[str], cwd: Path, env: Optional[Mapping[str, str]] = None) -> Optional[bytes]:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _working_trees(root: Path) -> Dict[str, Optional[bytes]]:
    """{path: the git tree id of ``path``'s tracked files as they are on disk} for CODE_PATHS, through a
    throwaway index (the checkout's own index is not touched): what a commit of the local changes would hold, so
    the same code has the same hash whichever commit it sits on, clean or not."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}

        def run(*args: str) -> Optional[bytes]:
            return _git(args, root, env)

        if run("read-tree", "HEAD") is None:
            return {path: None for path in CODE_PATHS}
        trees: Dict[str, Optional[bytes]] = {}
        for path in CODE_PATHS:  # one at a time: a path the commit lacks fails its own add, and is None
            if run("rev-parse", f"HEAD:{path}") is None:
                trees[path] = None
            elif run("add", "-u", "--", path) is None:  # the changes could not be read: no code
                return {p: None for p in CODE_PATHS}
            else:
                trees[path] = run("write-tree", f"--prefix={path}/")
        return trees


@lru_cache(maxsize=8)
def git_state(folder: Path = SOURCE) -> Dict[str, Any]:
    """``{"commit", "dirty", "diff_hash"}`` of the git checkout holding ``folder``; commit ``NOT_GIT`` when
    there is none (an installed wheel) or git is missing."""
    top = _git(["rev-parse", "--show-toplevel"], folder)
    commit = _git(["rev-parse", "HEAD"], folder)
    if top is None or commit is None or not (Path(top.decode().strip()) / "linrope").is_dir():
        return {"commit": NOT_GIT, "dirty": None, "diff_hash": None, "code": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], folder)
    dirty = bool(status and status.strip())
    diff = _git(["diff", "HEAD", "--binary"], folder) if dirty else None
    root = Path(top.decode().strip())
    code = hashlib.sha256()
    trees = _working_trees(root) if dirty else None
    for path in CODE_PATHS:
        tree = trees.get(path) if trees is not None else _git(["rev-parse", f"HEAD:{path}"], root)
        code.update(path.encode() + b"=" + (tree or b"-").strip() + b"\n")
    return {
        "commit": commit.decode().strip(),
        "dirty": dirty,
        "diff_hash": hashlib.sha256(diff).hexdigest()[:12] if diff is not None else None,
        "code": code.hexdigest()[:12],
    }


def version_of(package: str) -> Optional[str]:
    from importlib import metadata

    for dist in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name, with its family and model numbers where the name (a virtual machine's, often) carries none:
    "AMD EPYC" is Zen 4 at family 25, Zen 5 at 26, and the two run AVX-512 products at different rates."""
    fields: Dict[str, str] = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if not key:
                    break  # the first processor's block is enough
                fields.setdefault(key, value.strip())
    except OSError:
        pass
    name = next((fields[k] for k in ("model name", "hardware", "cpu model") if fields.get(k)), None)
    if name is None:
        return platform.processor() or platform.machine() or "unknown"
    if not any(c.isdigit() for c in name) and "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def gpu() -> Dict[str, Any]:
    """GPU model and driver when CUDA is available (torch is imported by the time a run collects this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {"gpu": None, "gpu_driver": None, "cuda": None}
    driver = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            text=True,
            check=False,
        ).stdout.strip()
        driver = out.splitlines()[0] if out else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"gpu": torch.cuda.get_device_name(0), "gpu_driver": driver, "cuda": torch.version.cuda}


def collect(
    *,
    precision: Any = None,
    seed: Any = None,
    argv: Optional[Sequence[str]] = None,
    overrides: Optional[Sequence[str]] = None,
    started: Optional[str] = None,
) -> Dict[str, Any]:
    """The provenance of a run started now (see the module docstring): a dict of plain values."""
    torch = sys.modules.get("torch")
    versions = {"python": platform.python_version(), **{p: version_of(p) for p in PACKAGES}}
    if torch is not None:  # the build too: PyPI's CUDA wheels are "2.4.0" to pip and "2.4.0+cu121" to torch
        versions["torch"] = str(torch.__version__)  # a plain str: TorchVersion is no weights_only global
    machine = {
        "cpu": cpu_model(),
        "threads": int(torch.get_num_threads()) if torch is not None else None,
        "cores": os.cpu_count(),
        "host": platform.node(),
        **gpu(),
    }
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].startswith("python -m "):  # python -m linrope <command>: linrope/__main__.py names it so
        argv = [*argv[0].split(), *argv[1:]]
    elif argv and argv[0].endswith(".py"):
        argv = ["python", *argv]
    elif argv and Path(argv[0]).name.startswith("linrope-"):  # a console script: its name, as it is typed
        argv = [Path(argv[0]).name, *argv[1:]]
    return {
        "linrope": {"version": version_of("linrope"), **git_state()},
        "versions": versions,
        "machine": machine,
        "precision": None if precision is None else str(precision),
        "seed": seed,
        "command": " ".join(shlex.quote(a) for a in argv),
        "overrides": None if overrides is None else [str(o) for o in overrides],
        "started": started or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write(folder: Path, provenance: Mapping[str, Any], name: str = FILE_NAME) -> Path:
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(provenance, indent=2, default=str, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def read(folder: Path, name: str = FILE_NAME) -> Optional[Dict[str, Any]]:
    """``<folder>/provenance.json``, or None when absent or unreadable."""
    try:
        value = json.loads((Path(folder) / name).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def commit_text(provenance: Optional[Mapping[str, Any]]) -> str:
    """``abc1234`` / ``abc1234+dirty(diff 0123456789ab)`` / ``not a git checkout`` / ``unknown``."""
    lr = (provenance or {}).get("linrope") or {}
    commit = lr.get("commit")
    if not commit:
        return "unknown"
    if commit == NOT_GIT:
        return f"{NOT_GIT} (linrope {lr.get('version')})"
    short = str(commit)[:10]
    return f"{short}+dirty (diff {lr.get('diff_hash')})" if lr.get("dirty") else short


def code_text(provenance: Optional[Mapping[str, Any]]) -> str:
    """``code 0123456789ab`` when the run recorded its code, else ``commit_text`` (older runs, wheels)."""
    code = ((provenance or {}).get("linrope") or {}).get("code")
    return f"code {code}" if code else commit_text(provenance)


def machine_line() -> str:
    """One line for a benchmark's header, so that its numbers name what produced them: the commit, torch,
    the CPU (or GPU) and the threads."""
    p = collect()
    m = p["machine"]
    return (
        f"commit {commit_text(p)}, torch {p['versions']['torch']}, {m.get('gpu') or m['cpu']}, {m['threads']} threads"
    )
