"""A study in arms read from its config (conf/study/budget.yaml, linrope.analysis.arms): the headline claims at
each budget, paired over seeds, and the verdict the config names for what became of each with more budget (holds,
flips, budget artefact, emerges, undecided), from small hand-made run folders."""

import re

import pytest

from linrope.analysis import study_config
from linrope.analysis.arms import arms_table, outcome
from linrope.analysis.report.claims import claim_results
from linrope.analysis.runs import find_runs, group_runs
from linrope.analysis.stats import paired
from tests.analysis.helpers import write_budget, write_references

BUDGET = study_config.named("budget")
CLAIMS = BUDGET.claims


def test_each_claim_is_paired_per_budget_and_named_by_its_fate(tmp_path):
    write_budget(
        tmp_path,
        800,
        {"linear": [3.30, 3.32, 3.31], "linear_rope": [3.00, 3.03, 3.01], "softmax_rope": [3.00, 3.03, 3.01]},
    )
    write_budget(
        tmp_path,
        3200,
        {"linear": [3.10, 3.12, 3.11], "linear_rope": [3.20, 3.23, 3.22], "softmax_rope": [2.50, 2.52, 2.53]},
    )
    text = arms_table(tmp_path, BUDGET, reports=True)
    rope = next(c for c in CLAIMS if (c.a, c.b, c.metric) == ("linear_rope", "linear", "test/bpb"))
    r800 = claim_results(group_runs(find_runs(tmp_path / "steps800"))["bytes"], CLAIMS)[rope]
    expected = paired({1: 3.00, 2: 3.03, 3: 3.01}, {1: 3.30, 2: 3.32, 3: 3.31})
    assert r800.diff.mean == pytest.approx(expected.diff.mean) and r800.diff.hi == pytest.approx(expected.diff.hi)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert lines[rope.text].endswith("| flips |")  # -0.30 at 800, +0.11 at 3200, both resolved
    behind = next(c for c in CLAIMS if (c.a, c.b) == ("linear_rope", "softmax_rope"))
    assert lines[behind.text].endswith("| emerges |")  # identical at 800 (no spread, mean 0), +0.70 at 3200
    assert "| – |" in lines[next(c for c in CLAIMS if c.b == "linear_rope_both").text]  # never ran: incomplete
    per_run = text.split("## Per-run values")[1]  # every value behind the intervals, by configuration and seed
    assert "| linear_rope | 2 | 3.0300 | 3.2300 | 3.2300 | 3.4300 | – | – |" in per_run  # bpb@256 = test + 0.1·seed
    assert "| linear_rope_both |" not in per_run
    for arm in ("steps800", "steps3200"):  # each budget's own report beside its runs
        assert (tmp_path / arm / "report.md").is_file() and (tmp_path / arm / "runs.csv").is_file()
    assert (tmp_path / "budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the forest plot of the claims
    csv_text = (tmp_path / "budget.csv").read_text()
    assert csv_text.startswith("kind,claim,arm,verdict,task,metric,a,b,n,seeds,mean difference")
    assert (tmp_path / "budget.md").read_text() == text


def test_a_run_that_diverged_is_named_in_the_per_run_table(tmp_path):
    """The per-run table said "–" (captioned: not finished) for a run whose value was NaN; it says diverged."""
    values = {"linear": [3.30, 3.32, 3.31], "linear_rope": [3.00, float("nan"), 3.01], "softmax_rope": [3.0, 3.1, 3.0]}
    write_budget(tmp_path, 800, values)
    per_run = arms_table(tmp_path, BUDGET, reports=False, write=False).split("## Per-run values")[1]
    assert "| linear_rope | 2 | diverged |" in per_run and "diverged: its value is not a finite number" in per_run


def test_extrapolation_claims_read_the_table_as_trained():
    """bpb@L is the 'none' scaling row of extrapolation.csv at that length."""
    from types import SimpleNamespace

    from linrope.analysis.report.claims import value_of

    run = SimpleNamespace(
        extrapolation=[
            {"length": 256, "scaling": "pi", "bpb": 1.0, "status": "ok"},
            {"length": 256, "scaling": "none", "bpb": 2.0, "status": "ok"},
            {"length": 512, "scaling": "none", "bpb": None, "status": "n/a"},
        ]
    )
    assert value_of("bpb@256")(run) == 2.0 and value_of("bpb@512")(run) is None


class R:  # a report.claims.Corrected stand-in: resolved (after Holm) iff lo and hi share a sign
    def __init__(self, mean, lo, hi, n=3):
        self.diff = type(
            "D", (), {"mean": mean, "lo": lo, "hi": hi, "n": n, "excludes_zero": lambda s: lo > 0 or hi < 0}
        )()
        self.resolved = lo > 0 or hi < 0


@pytest.mark.parametrize(
    "results, expected",
    [
        ([R(-1, -2, -0.5), R(-1, -1.5, -0.2)], "holds"),
        ([R(-1, -2, -0.5), R(1, 0.5, 1.5)], "flips"),
        ([R(-1, -2, -0.5), R(-0.1, -0.5, 0.3)], "budget artefact"),
        ([R(0.1, -0.5, 0.6), R(1, 0.5, 1.5)], "emerges"),
        ([R(0.1, -0.5, 0.6), R(0.1, -0.5, 0.6)], "undecided"),
        ([R(-1, -2, -0.5), None], "incomplete"),
        ([R(-1, -2, -0.5), R(-1, -2, -0.5, n=1)], "incomplete"),
        ([R(-1, -2, -0.5)], "one budget so far"),
    ],
)
def test_the_verdict_is_the_configs_word_for_the_outcome(results, expected):
    assert BUDGET.verdict[outcome(results)][0] == expected


def test_the_forest_plot_is_not_drawn_without_an_interval(tmp_path):
    from linrope.analysis.arms.figures import plot_claims

    assert plot_claims(CLAIMS, [{c: None for c in CLAIMS}], ["800 steps"], tmp_path / "b.png", "t") is None
    assert not (tmp_path / "b.png").exists()


def test_a_difference_resolved_alone_is_not_resolved_after_holm(tmp_path, monkeypatch):
    """linear_rope − linear has raw p ≈ 0.03 at 800 steps (its 95% interval excludes 0) but is one of the table's
    comparisons with a test: Holm's p is above 0.05, so the cell is not bold and the claim stays undecided; the
    forest plot fills its dot exactly where the table is bold (it filled this one: raw interval)."""
    from linrope.analysis import arms
    from linrope.analysis.arms import figures as arm_figures

    drawn = []
    monkeypatch.setattr(arms, "plot_claims", lambda claims, per_arm, *a: drawn.append(per_arm))
    bpb = {"linear": [3.30, 3.32, 3.31], "linear_rope": [3.20, 3.27, 3.24], "softmax_rope": [2.50, 2.53, 2.51]}
    write_budget(tmp_path, 800, bpb)
    write_budget(tmp_path, 3200, bpb)
    text = arms_table(tmp_path, BUDGET, reports=False)
    filled = {(c.text, k) for per_arm in drawn for k, arm in enumerate(per_arm) for c, r in arm.items()
              if r is not None and arm_figures.resolved(r)}  # fmt: skip
    bold = {(c.text, k) for c in CLAIMS for line in text.splitlines() if line.startswith(f"| {c.text} |")
            for k, cell in enumerate(line.split(" | ")[3:5]) if cell.startswith("**")}  # fmt: skip
    assert drawn and filled == bold and bold
    rope = next(c for c in CLAIMS if (c.a, c.b, c.metric) == ("linear_rope", "linear", "test/bpb"))
    raw = paired(dict(enumerate(bpb["linear_rope"])), dict(enumerate(bpb["linear"])))
    assert raw.diff.excludes_zero() and 0.01 < raw.p < 0.05
    line = next(x for x in text.splitlines() if x.startswith(f"| {rope.text} |"))
    family = [float(p) for p in re.findall(r"Holm p ([0-9.e-]+)", text)]
    assert len(family) == int(text.split("Over the table's ")[1].split()[0])  # every tested cell shows its Holm p
    assert f"{raw.diff.mean:+.3f} [{raw.diff.lo:+.3f}, {raw.diff.hi:+.3f}] (n=3; Holm p" in line and "**" not in line
    assert line.endswith("| undecided |") and all(float(p) > 0.05 for p in re.findall(r"Holm p ([0-9.e-]+)", line))


def test_a_study_with_one_configuration_finished_says_nothing_is_compared_yet(tmp_path):
    """Mid-study (the headline's first runs): no claim has both its configurations, so the family is empty; the
    note under the table said "Over the table's 0 comparisons … at level 1 − 0.05/0"."""
    write_budget(tmp_path, 800, {"linear": [3.1, 3.2]})
    text = arms_table(tmp_path, BUDGET)
    assert "No comparison has its two configurations finished yet" in text and "0.05/0" not in text


def test_a_table_whose_figure_is_not_drawn_does_not_link_to_it(tmp_path):
    """With nothing paired, the forest plot is not drawn, so the table must not link to it (docs/results/headline
    linked to a headline.png that was never written: tests/test_links failed)."""
    write_budget(tmp_path, 800, {"linear": [3.1, 3.2]})
    text = arms_table(tmp_path, BUDGET)
    assert "](budget.png)" not in text and not (tmp_path / "budget.png").exists()
    write_budget(tmp_path, 800, {"linear_rope": [3.0, 3.05]})
    assert "](budget.png)" in arms_table(tmp_path, BUDGET) and (tmp_path / "budget.png").is_file()


def test_a_claim_at_a_row_where_a_seed_is_above_the_unigram_gets_no_verdict(tmp_path, monkeypatch):
    """The headline's table bolded linear_rope − linear at 16× (resolved after Holm) where every linear_rope seed
    scored above the unigram byte model: a gap between collapsed models, which the report's Evidence section
    already gave no verdict.  Now the table does too, for that arm and row only; the cell keeps its interval and its
    place in Holm's family, and the figure draws it as a cross, never filled."""
    from linrope.analysis import arms
    from linrope.analysis.arms import figures as arm_figures

    drawn = []
    monkeypatch.setattr(arms, "plot_claims", lambda claims, per_arm, *a: drawn.append(per_arm))
    bpb = {"linear": [3.30, 3.32, 3.31], "linear_rope": [3.00, 3.03, 3.01]}  # bpb@256: test + 0.1·seed
    write_budget(tmp_path, 800, bpb)
    write_budget(tmp_path, 3200, bpb)
    write_references(tmp_path / "steps800" / "references.csv", find_runs(tmp_path / "steps800"), {"unigram": 3.35})
    # linear's bpb@256 is 3.40, 3.52, 3.61 at 800 steps: all three above; linear_rope's 3.10, 3.23, 3.31
    text = arms_table(tmp_path, BUDGET, reports=False)
    at_2x = next(c for c in CLAIMS if (c.a, c.b, c.metric) == ("linear_rope", "linear", "bpb@256"))
    at_1x = next(c for c in CLAIMS if (c.a, c.b, c.metric) == ("linear_rope", "linear", "test/bpb"))
    cells = {c: next(x for x in text.splitlines() if x.startswith(f"| {c.text} |")).split(" | ")[3:5] for c in CLAIMS}
    assert "no verdict: above the unigram at this row (linear 3 of 3)" in cells[at_2x][0]
    assert not cells[at_2x][0].startswith("**") and "Holm p" in cells[at_2x][0]
    assert cells[at_2x][1].startswith("**") and "no verdict" not in cells[at_2x][1]  # 3200: no references there
    assert cells[at_1x][0].startswith("**") and "no verdict" not in cells[at_1x][0]  # the test row: below it
    assert "a row where a seed of A or B scores above the unigram byte model" in text
    withheld = {(c, k) for k, arm in enumerate(drawn[0]) for c, r in arm.items() if r is not None and r.withheld}
    assert withheld == {(at_2x, 0)} and not arm_figures.resolved(drawn[0][0][at_2x])
