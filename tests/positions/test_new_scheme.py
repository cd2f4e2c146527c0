"""CONTRIBUTING.md's worked example, run.  Its scheme module, config file and formula test are read from the guide's
blocks; the scheme is registered in a temporary registry entry (the registry is restored afterwards); its config
composes from a folder on Hydra's search path and passes the config check; every check of the contract suite
(``contract.CONTRACT``) and the formula test run on it; README's tables and docs/schemes.md name it once the guide's
rows and section are added, and not before.  Nothing else is edited: four files and a docs section."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from linrope.models.spec import ModelConfig, pair_label
from linrope.positions import REGISTRY
from tests.helpers import ROOT, model_config, no_graph_breaks
from tests.positions import contract as c

GUIDE = (ROOT / "CONTRIBUTING.md").read_text()
EXAMPLE = GUIDE[GUIDE.index("### A worked example") : GUIDE.index("## A new linear-attention variant")]
NAME = "log_distance"


def pieces() -> dict:
    """{target: text} of the worked example's blocks: a code block follows a line naming its file (```path`:``); the
    markdown block is cut at its ``<!-- target -->`` lines."""
    found = {}
    for path, lang, body in re.findall(r"(?:`([^`]+)`:\n\n)?```(\w+)\n(.*?)```", EXAMPLE, re.S):
        if lang == "markdown":
            for target, text in re.findall(r"<!-- (.+?) -->\n(.*?)(?=<!--|\Z)", body, re.S):
                found[target] = text
        else:
            found[path] = body
    return found


PIECES = pieces()
MODULE, CONFIG, TEST = (f"linrope/positions/{NAME}.py", f"conf/position/{NAME}.yaml", f"tests/positions/test_{NAME}.py")


def test_the_example_touches_four_files_and_its_docs_section():
    files = {target.split(":")[0] for target in PIECES}
    assert files == {MODULE, CONFIG, TEST, "README.md", "docs/schemes.md"}
    assert len(files - {"docs/schemes.md"}) <= 4
    assert not any((ROOT / f).exists() for f in (MODULE, CONFIG, TEST))  # a throwaway: never committed


def load(path, name, monkeypatch):
    """The module at ``path``, imported as ``name`` (in sys.modules while the test runs: torch.compile imports the
    module of what it traces)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The example's scheme registered (a temporary registry entry) and its config in a folder on Hydra's search
    path: the overrides that compose it."""
    saved = dict(REGISTRY)
    (tmp_path / "scheme.py").write_text(PIECES[MODULE])
    (tmp_path / "conf" / "position").mkdir(parents=True)
    (tmp_path / CONFIG).write_text(PIECES[CONFIG])
    try:
        load(tmp_path / "scheme.py", "contributing_example_scheme", monkeypatch)
        assert NAME in REGISTRY
        yield [f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)


def test_the_contract_runs_on_the_example(example, tmp_path, monkeypatch):
    ran = c.run_contract(c.cases({NAME: REGISTRY[NAME]}))
    checks = {r.split("[")[0] for r in ran}
    # what its traits claim: every check but linear attention's training and an absolute scheme's offset; sharing's
    # only where it shares
    assert checks == set(c.CONTRACT) - {
        "linear_lm_trains",  # it is no scheme linear attention takes
        "absolute_sees_offset",
        "shared_counted_once",
        "every_layer_uses_the_shared_module",
        "sharing_is_tied_copies",
        "position_terms_once_per_forward",
    }
    assert "shift_invariance[log_distance-bidirectional]" in ran
    cfg = model_config(*example, "attention=softmax", f"position={NAME}", "size=tiny", "model.n_layers=1")
    assert cfg["position"] == {"name": NAME, "init": 0.5}
    assert ModelConfig.from_dict(cfg).label(("softmax", NAME), ("linear", "rope")) == pair_label("softmax", NAME)
    assert pair_label("softmax", NAME) == f"softmax_{NAME}"  # no preset needed
    for bf16 in (False, True):
        c.check_three_steps(
            model_config(*example, "attention=softmax", f"position={NAME}", "size=tiny", "model.n_layers=1",
                         f"context={c.CONTEXT}"),
            bf16,
        )  # fmt: skip
    no_graph_breaks(cfg)
    (tmp_path / "test_formula.py").write_text(PIECES[TEST])
    formula = load(tmp_path / "test_formula.py", "contributing_example_test", monkeypatch)
    tests = [getattr(formula, n) for n in dir(formula) if n.startswith("test_")]
    assert tests
    for test in tests:
        test()


def test_the_example_passes_the_config_check(example, compose):
    from linrope.config.checks import validate

    validate(compose(*example, "attention=softmax", f"position={NAME}", "size=tiny"))


def insert_row(text: str, header: str, row: str) -> str:
    """``text`` with ``row`` after the last row of the table whose header line starts with ``header``."""
    lines = text.splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.startswith(header)) + 2
    while i < len(lines) and lines[i].startswith("|"):
        i += 1
    return "".join(lines[:i] + [row.strip() + "\n"] + lines[i:])


def test_the_docs_name_the_example_once_its_rows_and_section_are_added(example):
    readme, schemes = (ROOT / "README.md").read_text(), (ROOT / "docs" / "schemes.md").read_text()
    assert any(f"`{NAME}`" in p for p in c.readme_problems(readme))  # the docs are part of adding a scheme
    assert c.schemes_md_problems(schemes) == [f"docs/schemes.md: no section ### `{NAME}`"]
    readme = insert_row(readme, "| scheme | kind | paper |", PIECES["README.md: the scheme table"])
    readme = insert_row(readme, "| scheme | softmax | linear |", PIECES["README.md: the softmax | linear table"])
    assert c.readme_problems(readme) == []
    assert c.schemes_md_problems(schemes + "\n" + PIECES["docs/schemes.md"]) == []
