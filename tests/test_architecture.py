"""The shape of the codebase: rules a reader can rely on (see docs/architecture.md).

- the import graph of ``linrope/`` (module-level and function-level imports alike) has no cycle, and
  every import goes to a lower layer or to its own package (the layers are the packages: each names its
  layer in the first line of its docstring; ``linrope/__main__.py``, the table of the commands, is above them all);
- no module of ``linrope/`` is longer than 550 lines (as ruff formats it: one argument a line where a call wraps);
- no object is recognised by the string of its class name (``type(x).__name__ == ...``);
- the repository explains itself: no tracked file cites a design note it does not contain.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "linrope"
MAX_LINES = 550  # lines as ruff formats them (one argument a line where a call wraps); 400 before the formatter


def modules():
    """{dotted name: path} of every module of the package."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imported(name: str, path: Path, known) -> set:
    """The linrope modules that ``name`` imports anywhere in its file (the longest known prefix of each)."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + int(is_package)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in known:
                c = c.rpartition(".")[0]
            if c.startswith("linrope") and c != name:
                targets.add(c)
    return targets


def import_graph():
    known = modules()
    return {m: imported(m, p, known) for m, p in known.items()}


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "linrope.positions.base" in graph["linrope.positions.t5"]  # from .base import ...
    assert "linrope.models.model" in graph["linrope.training.lit"]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


LAYER_LINE = re.compile(r"^Layer (\d+), ([^:(]+)")


def layers() -> dict:
    """{package: (layer number, name)}, read from the first line of each package's docstring ("Layer N, name: ...").
    linrope/__main__.py, the commands, is above every package."""
    out = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        match = LAYER_LINE.match(doc)
        assert match, f"{init.relative_to(ROOT)}: its docstring must start 'Layer N, name: ...' (docs/architecture.md)"
        out[init.parent.name] = (int(match.group(1)), match.group(2).strip())
    return out


def layer_of(module: str, table: dict) -> tuple:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in table:
        return table[parts[1]]
    return (max(n for n, _ in table.values()) + 1, "commands")


def test_layers_come_from_the_folders():
    table = layers()
    assert table["base"][0] == 0 and table["ops"][0] < table["positions"][0] < table["models"][0]
    assert layer_of("linrope.positions.t5", table) == table["positions"]
    assert layer_of("linrope.__main__", table)[1] == "commands"


def test_the_top_level_holds_only_the_commands():
    """Besides the packages, linrope/ holds __init__ and __main__ (the commands: ``python -m linrope <command>``, one
    table); the work lives in the layers."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def upward_imports(graph, table) -> list:
    """Imports that go to a higher layer, or sideways to another package of the same layer."""
    bad = []
    for m, targets in sorted(graph.items()):
        if m == "linrope":
            continue
        lm = layer_of(m, table)
        for t in sorted(targets):
            lt = layer_of(t, table)
            same_package = m.split(".")[:2] == t.split(".")[:2]
            if t != "linrope" and (lt[0] > lm[0] or (lt[0] == lm[0] and not same_package and lm[1] != "commands")):
                bad.append(f"{m} ({lm[1]}) imports {t} ({lt[1]})")
    return bad


def test_the_layer_check_finds_an_upward_import():
    table = {"base": (0, "foundation"), "ops": (1, "operators"), "data": (1, "data")}
    graph = {
        "linrope.base.errors": {"linrope.ops.rope"},
        "linrope.ops.rope": {"linrope.data.bytes"},
        "linrope.data.bytes": {"linrope.base.errors"},
        "linrope.__main__": {"linrope.data.bytes"},
    }
    assert upward_imports(graph, table) == [
        "linrope.base.errors (foundation) imports linrope.ops.rope (operators)",
        "linrope.ops.rope (operators) imports linrope.data.bytes (data)",
    ]


def test_every_import_goes_to_a_lower_layer_or_its_own_package():
    assert upward_imports(import_graph(), layers()) == []


def test_no_module_longer_than_the_limit():
    long = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert {m: n for m, n in long.items() if n > MAX_LINES} == {}


def test_no_class_recognised_by_its_name_string():
    pattern = re.compile(r"\)\.__name__\s*(==|!=|\bin\b)")  # type(x).__name__ == "Name"
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in modules().values()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out.split()]


def test_no_file_cites_a_design_note_outside_the_repository():
    hits = []
    for f in tracked_files():
        if f.suffix in {".png", ".pdf"} or not f.is_file():
            continue
        if "DESIGN" + ".md" in f.read_text(errors="ignore"):
            hits.append(str(f.relative_to(ROOT)))
    assert hits == []


def test_the_library_imports_neither_lightning_hydra_nor_wandb():
    """``import linrope.ops`` / ``linrope.models.attention`` / ``linrope.positions`` is what a user's own code does to use
    the kernels and layers: it loads none of the framework around them (issue 26)."""
    code = (
        "import sys, linrope.ops, linrope.models.attention, linrope.positions; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'lightning', 'pytorch_lightning', 'lightning_fabric', 'hydra', 'wandb'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
