"""Every dotted ``linrope.`` name a reader meets resolves: in the docstrings and comments of ``linrope/``,
``tests/``, ``benchmarks/`` and ``train.py``, in ``conf/``'s YAML and in README.md and ``docs/*.md``.

A name resolves when its longest importable prefix is a module of that very name and the rest are attributes
of it (``linrope.run.exit.one_line_errors``).  ``docs/results/`` is not read: its saved targets are checked by
tests/test_migrate_runs.py."""

import ast
import functools
import importlib
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![\w./-])(?<!\$\{)linrope(?:\.[A-Za-z_]\w*)+")  # ${linrope.x:…}: an OmegaConf resolver


PACKAGE_DIR = re.compile(r"^package-dir\s*=\s*\{(.*)\}", re.M)


def built_packages() -> set:
    """Packages the build makes from folders outside linrope/ (pyproject.toml's ``package-dir``: ``linrope.conf``
    from ``conf/``; read as text, as Python 3.10 has no tomllib)."""
    found = PACKAGE_DIR.search((ROOT / "pyproject.toml").read_text())
    return set(re.findall(r'"([\w.]+)"\s*=', found.group(1))) if found else set()


@functools.lru_cache(maxsize=None)
def problem(dotted: str):
    """Why ``dotted`` does not resolve, or None when it does."""
    if any(dotted == p or dotted.startswith(p + ".") for p in built_packages()):
        return None
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and not module.startswith(e.name):
                return f"importing {module} fails: {e}"
            continue
        break
    for attr in parts[i:]:
        if not hasattr(obj, attr):
            fields = {a for c in getattr(obj, "__mro__", ()) for a in vars(c).get("__annotations__", {})}
            if attr in fields:  # a dataclass field without a default: declared, set on each instance
                return None
            return f"{'.'.join(parts[:i])} has no {attr}"
        obj, i = getattr(obj, attr), i + 1
    return None


def python_text(source: str):
    """(line, text) of the comments and docstrings (any string that stands as a statement) of ``source``."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def names(path: Path):
    """(line, dotted name) of every ``linrope.`` name in the reader's text of ``path``."""
    text = path.read_text()
    lines = python_text(text) if path.suffix == ".py" else enumerate(text.splitlines(), 1)
    for n, line in lines:
        for m in NAME.finditer(line):
            yield n, m.group()


def files():
    python = [ROOT / "train.py", *(p for d in ("linrope", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py"))]
    return (
        sorted(python)
        + sorted((ROOT / "conf").rglob("*.yaml"))
        + [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    )


def stale_names(paths) -> list:
    found = []
    for path in paths:
        where = path.relative_to(ROOT).as_posix()
        for n, name in names(path):
            why = problem(name)
            if why:
                found.append(f"{where}:{n}: {name}: {why}")
    return found


def test_every_dotted_linrope_name_resolves():
    assert stale_names(files()) == []


def test_a_stale_or_old_name_is_found_and_a_current_one_is_not(tmp_path):
    assert problem("linrope.models.spec.check_identity") is None
    assert problem("linrope.models.spec.ModelConfig.position") is None  # a dataclass field
    assert problem("linrope.conf") is None  # built from conf/
    assert problem("linrope.run.checkpoint.check_identity") == "linrope.run.checkpoint has no check_identity"
    assert problem("linrope.checkpoint.check_identity") == "linrope has no checkpoint"  # a path from before the layers
    assert problem("linrope.nowhere.thing") == "linrope has no nowhere"
    source = (
        '"""Reported by linrope.run.exit.one_line_errors."""\n'
        'x = "linrope.in.code"  # see linrope.base.nested.get; ${linrope.evaluate_dir:x}\n'
    )
    assert [name for _, name in names(_write(tmp_path / "m.py", source))] == [
        "linrope.base.nested.get",
        "linrope.run.exit.one_line_errors",
    ]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
