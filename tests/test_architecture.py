"""The shape of the codebase: rules a reader can rely on (see docs/architecture.md).

- the import graph of ``linrope/`` (module-level and function-level imports alike) has no cycle, and
  every import goes to a module of the same layer or a lower one (``LAYERS``, as docs/architecture.md
  draws them);
- no module of ``linrope/`` is longer than 400 lines;
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
MAX_LINES = 400


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
    assert "linrope.model" in graph["linrope.lit"]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


# docs/architecture.md's layers, lowest first; a module may import its own layer and the layers below
LAYERS = [
    ("foundation", ("errors", "atomic", "rope", "memory", "compiling", "naming", "plots", "schema", "stats",
                    "tables", "provenance", "resume_diff")),
    ("operators and positions", ("ops", "positions")),
    ("model and data", ("attention", "spec", "model", "optim", "data")),
    ("files and config", ("checkpoint", "config", "command_line", "after_training")),
    ("run-time services", ("run",)),
    ("Lightning", ("lit", "movement")),
    ("evaluation", ("extrapolation", "evaluate", "generate")),
    ("orchestration", ("training", "train")),
    ("tools", ("runs", "caveats", "report", "report_provenance", "report_files", "figures", "dashboard", "sweeps",
               "study", "study_jobs", "budget", "recall")),
]


def layer_of(module: str) -> int:
    name = module.removeprefix("linrope.").split(".")[0]
    for i, (_, members) in enumerate(LAYERS):
        if name in members:
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS (tests/test_architecture.py, docs/architecture.md)")


def test_every_import_goes_to_the_same_or_a_lower_layer():
    graph = import_graph()
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in sorted(graph.items()) if m != "linrope" for t in sorted(targets)
              if t != "linrope" and layer_of(t) > layer_of(m)]
    assert upward == []


def test_no_module_longer_than_the_limit():
    long = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert {m: n for m, n in long.items() if n > MAX_LINES} == {}


def test_no_class_recognised_by_its_name_string():
    pattern = re.compile(r"\)\.__name__\s*(==|!=|\bin\b)")  # type(x).__name__ == "Name"
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in modules().values()
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
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
    """``import linrope.ops`` / ``linrope.attention`` / ``linrope.positions`` is what a user's own code does to use
    the kernels and layers: it loads none of the framework around them (issue 26)."""
    code = ("import sys, linrope.ops, linrope.attention, linrope.positions; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'lightning', 'pytorch_lightning', 'lightning_fabric', 'hydra', 'wandb'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
