"""README's two scheme tables and docs/schemes.md agree with the registry (``contract.readme_problems``,
``contract.schemes_md_problems`` say what is compared): a registered scheme missing from them, a row of an unknown
one, a kind or a pairing the tables misstate, fails here in one line naming it."""

from linrope.positions import REGISTRY
from tests.helpers import ROOT
from tests.positions.contract import readme_problems, schemes_md_problems

README = (ROOT / "README.md").read_text()
SCHEMES = (ROOT / "docs" / "schemes.md").read_text()


def test_readme_tables_agree_with_the_registry():
    assert readme_problems(README) == []


def test_schemes_md_agrees_with_the_registry():
    assert schemes_md_problems(SCHEMES) == []


def test_a_drift_is_named():
    """The comparisons can fail: a row removed, a pairing misstated, a section missing, an unknown row."""
    name = max(n for n, c in REGISTRY.items() if c.shares and not c.linear_ok)
    row = next(line for line in README.splitlines() if line.startswith(f"| `{name}` |"))
    assert any(f"`{name}`" in p for p in readme_problems(README.replace(row + "\n", "")))
    linear = next(n for n, c in sorted(REGISTRY.items()) if c.linear_ok and c.kind == "relative")
    pair = next(line for line in README.splitlines() if line.startswith(f"| `{linear}` | ✓"))
    flipped = pair[: pair.rindex("| ✓")] + "| ✗ not taken |"
    assert any("linear_ok is True" in p for p in readme_problems(README.replace(pair, flipped)))
    assert readme_problems(README.replace(row, row.replace(f"`{name}`", "`nosuch`", 1)))[0].startswith(
        "README's scheme table: `nosuch` is no registered scheme"
    )
    assert schemes_md_problems(SCHEMES.replace(f"\n### `{name}`\n", "\n### gone\n")) == [
        f"docs/schemes.md: no section ### `{name}`"
    ]
    sharing = next(line for line in SCHEMES.splitlines() if line.startswith(f"| `{name}` |"))
    assert schemes_md_problems(SCHEMES.replace(sharing + "\n", ""))[0].startswith(
        f"docs/schemes.md's sharing table: no row for `{name}`"
    )
