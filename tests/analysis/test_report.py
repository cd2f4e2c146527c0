"""linrope report on fabricated run folders, and the statistics under it (linrope.analysis.stats, Student's t from
scipy): t quantiles and p-values against table values and closed forms, intervals and paired differences against
numbers computed by hand and Student's sleep data as R's t.test prints it."""

import csv
import math
import random
from pathlib import Path

import pytest

from linrope.analysis.report import build_report
from linrope.analysis.report.command import main
from linrope.analysis.runs import find_runs, group_runs
from linrope.analysis.stats import mean_ci, paired, t_quantile, t_two_sided
from tests.analysis.helpers import lm_rows, table_row, write_run


# ---- the t distribution ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "df,table",
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (9, 2.262), (10, 2.228), (30, 2.042), (100, 1.984)],
)
def test_t_quantile_matches_the_printed_table(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-t_quantile(0.975, df), rel=1e-13)


def test_t_distribution_closed_forms():
    """The quantile and the two-sided p at 1, 2 and 4 degrees of freedom, where they have closed forms: the
    arguments reach scipy in its order (df first) and the p counts both tails."""
    rng = random.Random(0)
    for _ in range(200):
        t, p = rng.uniform(-40, 40), rng.uniform(0.001, 0.999)
        u = abs(t)
        assert t_two_sided(t, 1) == pytest.approx(1 - 2 * math.atan(u) / math.pi, rel=1e-12, abs=1e-15)  # Cauchy
        assert t_two_sided(t, 2) == pytest.approx(1 - u / math.sqrt(2 + u * u), rel=1e-12, abs=1e-15)
        # df = 4: P(|T| >= t) = 1 - t/√(t²+4) · (1 + 2/(t²+4))
        assert t_two_sided(t, 4) == pytest.approx(1 - u / math.sqrt(u * u + 4) * (1 + 2 / (u * u + 4)), rel=1e-12)
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12, abs=1e-14)
    assert t_two_sided(1.5, 4) == pytest.approx(0.208, rel=1e-13)
    assert t_two_sided(0.0, 7) == 1.0 and t_two_sided(math.inf, 3) == 0.0 and t_two_sided(-math.inf, 3) == 0.0
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)  # the normal limit


def test_t_refuses_what_has_no_answer():
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom must be > 0"):
        t_two_sided(1.0, 0)


# ---- intervals ---------------------------------------------------------------------------------------------------
def test_mean_ci_hand_computed():
    # [2.0, 2.4]: mean 2.2, s = √0.08, half-width t_{.975,1} · s / √2 = 12.7062 · 0.2 = 2.54124
    iv = mean_ci([2.0, 2.4])
    assert (iv.n, iv.mean, iv.std) == (2, pytest.approx(2.2), pytest.approx(math.sqrt(0.08)))
    assert iv.half_width == pytest.approx(2.5412409, abs=1e-6) and iv.lo == pytest.approx(2.2 - 2.5412409, abs=1e-6)
    # 1..5: mean 3, s = √2.5, half-width 2.776445 · √2.5 / √5 = 1.963243
    iv = mean_ci([1, 2, 3, 4, 5])
    assert (iv.lo, iv.hi) == (pytest.approx(3 - 1.9632432, abs=1e-6), pytest.approx(3 + 1.9632432, abs=1e-6))
    assert iv.excludes_zero() and not mean_ci([-1.0, 0.5, 2.0]).excludes_zero()
    one = mean_ci([None, 3.1, float("nan")])
    assert (one.n, one.mean, one.lo, one.half_width) == (1, 3.1, None, None)
    assert mean_ci([]).mean is None


def test_paired_difference_hand_computed():
    a = {1: 3.0, 2: 3.2, 3: 3.1, 4: 3.3, 5: 3.0, 6: 9.9}  # seed 6 has no partner: left out
    b = {1: 3.1, 2: 3.35, 3: 3.2, 4: 3.35, 5: 3.15, 7: 0.0}
    r = paired(a, b)
    # differences -0.1, -0.15, -0.1, -0.05, -0.15: mean -0.11, s = √(0.007/4) = 0.0418330,
    # t = -0.11 / (s/√5) = -5.879747, half-width 2.776445 · s / √5 = 0.0519425, p (df 4) = 0.0041811
    assert r.seeds == (1, 2, 3, 4, 5) and r.diff.n == 5
    assert r.diff.mean == pytest.approx(-0.11) and r.diff.std == pytest.approx(0.0418330013, rel=1e-9)
    assert r.t == pytest.approx(-5.879747322, rel=1e-9)
    assert r.diff.half_width == pytest.approx(0.0519425317, rel=1e-9)
    assert r.p == pytest.approx(0.00418107213564, rel=1e-9)
    assert r.diff.excludes_zero()
    same = paired({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0})
    assert (same.t, same.p) == (0.0, 1.0) and not same.diff.excludes_zero()
    shifted = paired({1: 1.5, 2: 2.5}, {1: 1.0, 2: 2.0})  # every seed moved by 0.5: no spread
    assert shifted.p == 0.0 and shifted.diff.mean == pytest.approx(0.5)
    lone = paired({1: 1.0}, {1: 2.0})
    assert lone.diff.n == 1 and lone.p is None


def test_paired_on_students_sleep_data():
    """Student (1908), Cushny and Peebles' hours of extra sleep under two drugs in 10 patients, the paired t-test
    of R's ``t.test(extra ~ group, data = sleep, paired = TRUE)``: mean difference -1.58, t = -4.0621, df = 9,
    p-value = 0.002833, 95 percent confidence interval -2.4598858 -0.7001142 (R's printed digits)."""
    drug1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
    drug2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
    r = paired(dict(enumerate(drug1, 1)), dict(enumerate(drug2, 1)))
    assert r.diff.n == 10 and r.diff.mean == pytest.approx(-1.58)
    assert r.t == pytest.approx(-4.0621, abs=5e-5) and r.p == pytest.approx(0.002833, abs=5e-7)
    assert (r.diff.lo, r.diff.hi) == (pytest.approx(-2.4598858, abs=5e-8), pytest.approx(-0.7001142, abs=5e-8))


# ---- the report --------------------------------------------------------------------------------------------------
@pytest.fixture
def sweep(tmp_path):
    s = tmp_path / "multirun"
    i = 0

    def run(name, kind, position, seed, val, test, tps=(1000, 1000), **kw):
        nonlocal i
        n_params = {"softmax_learned": 444928, "linear_rope_both": None}.get(name, 428544)
        write_run(
            s / str(i),
            name=name,
            kind=kind,
            position=position,
            seed=seed,
            rows=lm_rows(val, test, tps),
            n_params=n_params,
            **kw,
        )
        i += 1

    run(
        "softmax_rope",
        "softmax",
        "rope",
        1,
        [3.0, 2.0],
        2.1,
        (1000, 1200),
        extrapolation=[(64, "none", 2.0), (128, "none", 2.5), (128, "pi", 2.2)],
    )
    run(
        "softmax_rope",
        "softmax",
        "rope",
        2,
        [2.8, 2.4],
        2.5,
        (900, 1100),
        extrapolation=[(64, "none", 2.4), (128, "none", 2.9), (128, "pi", 2.6)],
    )
    # linear_rope and linear: seeds 1-3; linear_rope lower by 0.1, 0.2, 0.15 (resolved)
    for seed, (lr, ln) in enumerate([(3.0, 3.1), (3.2, 3.4), (3.1, 3.25)], start=1):
        run(
            "linear_rope",
            "linear",
            "rope",
            seed,
            [3.5, lr - 0.05],
            lr,
            extrapolation=[(64, "none", lr), (128, "none", lr + 0.1)],
        )
        run(
            "linear",
            "linear",
            "none",
            seed,
            [3.5, ln - 0.05],
            ln,
            extrapolation=[(64, "none", ln), (128, "none", ln + 0.2)],
        )
    # linear_rope_both: differs from linear_rope by -0.1, +0.1, 0.0 (not resolved)
    for seed, v in enumerate([3.1, 3.1, 3.1], start=1):
        run("linear_rope_both", "linear", "rope", seed, [3.5, v], v, extra_model="    placement: both\n")
    run(
        "softmax_learned",
        "softmax",
        "learned",
        1,
        [3.3, 3.0],
        3.05,
        extrapolation=[(64, "none", 3.0), (128, "none", None)],
    )
    return s


def test_report_table_holds_test_mean_and_t_interval(sweep, tmp_path):
    out = tmp_path / "out"
    text = build_report([sweep], out)
    # softmax_rope test 2.1, 2.5: mean 2.3, half-width 12.7062 · √0.08 / √2 = 2.541; best val 2.0, 2.4 -> 2.2
    # tokens/s: run means 1100, 1000 -> 1050 ± 12.7062 · 70.71 / √2 = 635; val/bpb fell 1.0 and 0.4 over the
    # last evaluations (mean 0.7), more than the final values 2.0, 2.4 spread (s = 0.283): still improving
    assert (
        table_row(text, "softmax_rope")
        == "| softmax_rope | softmax | rope | 2 (1,2) | 428 544 | yes (-0.700) | 2.300 ± 2.541 | 2.200 ± 2.541 | 1050 ± 635 |"
    )
    # linear_rope test 3.0, 3.2, 3.1: mean 3.1, s = 0.1, half-width 4.3027 · 0.1 / √3 = 0.248
    assert (
        table_row(text, "linear_rope")
        == "| linear_rope | linear | rope | 3 (1,2,3) | 428 544 | yes (-0.450) | 3.100 ± 0.248 | 3.050 ± 0.248 | 1000 ± 0 |"
    )
    assert (
        table_row(text, "softmax_learned")
        == "| softmax_learned | softmax | learned | 1 (1) | 444 928 | yes (-0.300) | 3.050 | 3.000 | 1000 |"
    )
    assert "| linear_rope_both | linear | rope | 3 (1,2,3) | ? |" in text  # no parameter count recorded
    assert "best val/bpb (selection metric)" in text
    table = text.split("## Task: bytes")[1].split("##")[0]
    order = [
        line.split("|")[1].strip()
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| configuration")
    ]
    assert order == ["softmax_rope", "softmax_learned", "linear_rope", "linear_rope_both", "linear"]  # by test/bpb
    assert (out / "report.md").read_text() == text
    for png in ("val_curves.png", "extrapolation.png"):
        assert (out / png).stat().st_size > 1000
    rows = {r["configuration"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert float(rows["linear_rope"]["test/bpb mean"]) == pytest.approx(3.1)
    assert float(rows["linear_rope"]["test/bpb lo"]) == pytest.approx(3.1 - 4.30265273 * 0.1 / math.sqrt(3))
    assert float(rows["linear_rope"]["test/bpb std"]) == pytest.approx(0.1)
    assert rows["softmax_learned"]["test/bpb lo"] == ""
    # every run's own values, from which the intervals above can be recomputed by hand
    runs = [r for r in csv.DictReader(open(out / "runs.csv")) if r["configuration"] == "linear_rope"]
    assert [(r["seed"], float(r["test/bpb"]), float(r["best val/bpb (selection metric)"])) for r in runs] == [
        ("1", 3.0, pytest.approx(2.95)),
        ("2", 3.2, pytest.approx(3.15)),
        ("3", 3.1, pytest.approx(3.05)),
    ]
    assert all(Path(r["run"]).parent == sweep for r in runs)


def test_report_states_which_paired_differences_are_resolved(sweep, tmp_path):
    text = build_report([sweep], tmp_path)
    # linear_rope - linear: -0.1, -0.2, -0.15 -> mean -0.15, s 0.05, half-width 4.3027 · 0.05/√3 = 0.124,
    # t = -5.196, p = 0.0351
    assert (
        "- **linear_rope − linear** (test/bpb, 3 matching seeds): -0.150 [-0.274, -0.026], p = 0.035 — "
        "**resolved**: linear_rope is lower (better) than linear."
    ) in text
    # linear_rope - linear_rope_both: -0.1, +0.1, 0 -> mean 0, s 0.1
    assert (
        "- **linear_rope − linear_rope_both** (test/bpb, 3 matching seeds): +0.000 [-0.248, +0.248], p = 1.000 "
        "— **not resolved**: the 95% interval includes 0."
    ) in text
    # softmax_rope ran seeds 1, 2: two pairs with linear_rope (3.0 - 2.1, 3.2 - 2.5) = 0.9, 0.7
    assert "**linear_rope − softmax_rope** (test/bpb, 2 matching seeds): +0.800 [-0.471, +2.071]" in text
    assert "linear_cosine_rope − linear_cosine" not in text  # not in this sweep
    pairs = {(r["a"], r["b"], r["metric"]): r for r in csv.DictReader(open(tmp_path / "pairs.csv"))}
    r = pairs[("linear_rope", "linear", "test/bpb")]
    assert float(r["p"]) == pytest.approx(0.035098, abs=1e-5) and r["resolved"] == "True"
    assert float(r["ci high"]) == pytest.approx(-0.15 + 4.30265273 * 0.05 / math.sqrt(3))
    # extrapolation pairs at each length: at 128 the differences are -0.2, -0.3, -0.25 (bold: resolved)
    assert "| linear_rope − linear | **-0.150 ± 0.124, p = 0.035** | **-0.250 ± 0.124, p = 0.013** |" in text


def test_extrapolation_table_has_intervals_and_na(sweep, tmp_path):
    text = build_report([sweep], tmp_path)
    assert "| configuration | scaling | 64 (1×) | 128 (2×) |" in text
    assert "| softmax_rope | as trained | 2.200 ± 2.541 | 2.700 ± 2.541 |" in text
    assert "| softmax_rope | pi | n/a | 2.400 ± 2.541 |" in text
    assert "| softmax_learned | as trained | 3.000 | n/a |" in text


def test_a_seed_that_diverged_at_one_length_is_counted_not_dropped(tmp_path):
    """linear_rope's seed 2 is NaN at 2× (fine at 1×): the cell says so (mean over the other two, collapsed), the
    paired difference at 2× uses the two shared finite seeds, and neither is silently an n=2 "over seeds"."""
    for name, kind, position, shift in (("linear", "linear", "none", 0.3), ("linear_rope", "linear", "rope", 0.0)):
        for seed, (test, at2) in enumerate([(2.0, 2.5), (2.1, math.nan), (2.05, 2.6)], 1):
            at2 = 2.9 if math.isnan(at2) and name == "linear" else at2 + shift
            write_run(tmp_path / f"{name}-seed{seed}", name=name, kind=kind, position=position, seed=seed,
                      rows=lm_rows((test + 0.2, test + 0.1), test, (1000, 1000)), context=128,
                      extrapolation=[(128, "none", test), (256, "none", at2)])  # fmt: skip
    text = build_report([tmp_path], tmp_path / "out", pairs=[("linear_rope", "linear")])
    row = next(line for line in text.splitlines() if line.startswith("| linear_rope | as trained |"))
    assert row.endswith("| 2.550 ± 0.635 (collapsed: 1 of 3 seeds diverged, left out) |")
    assert "| linear_rope − linear | +0.000 ± 0.000, p = 1.000 | **-0.300 ± 0.000, p < 0.001** |" in text


def test_pair_flag_adds_a_pair_and_refuses_unknown_names(sweep, tmp_path, capsys):
    assert main([str(sweep), "--out", str(tmp_path), "--pair", "linear_rope_both:linear"]) == 0
    assert "**linear_rope_both − linear** (test/bpb, 3 matching seeds)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"no configuration named 'linear_rop' \(have: linear, linear_rope"):
        main([str(sweep), "--out", str(tmp_path), "--pair", "linear_rop:linear"])
    with pytest.raises(SystemExit) as e:
        main([str(sweep), "--pair", "linear_rope"])
    assert e.value.code == 2 and "a pair is two configuration names, A:B" in capsys.readouterr().err


def test_runs_of_one_model_are_told_apart_by_what_differs(tmp_path):
    s = tmp_path / "ablation"
    for i, (placement, seed) in enumerate([("numerator", 1), ("numerator", 2), ("both", 1)]):
        write_run(
            s / str(i),
            name="linear_rope",
            kind="linear",
            position="rope",
            seed=seed,
            extra_model=f"    placement: {placement}\n",
            rows=lm_rows([3.0, 2.0 + i / 10], 2.5, [10, 10]),
        )
    groups = group_runs(find_runs(s))["bytes"]
    assert sorted(groups) == ["linear_rope placement=both", "linear_rope placement=numerator"]
    assert len(groups["linear_rope placement=numerator"]) == 2


def test_probe_tasks_report_accuracy_at_each_length(tmp_path, capsys):
    """A probes sweep: two tasks, the same model names in each (no '(2)' suffixes), accuracy at 1× and 4×."""
    s = tmp_path / "probes"
    i = 0
    for task, factor in (("offset_copy", 4), ("mqar", 1)):
        for name, kind, position in (("linear_rope", "linear", "rope"), ("linear", "linear", "none")):
            for seed, acc in ((1, 0.9), (2, 0.7), (3, 0.8)):
                acc = acc if name == "linear_rope" else acc - 0.5
                rows = [
                    {"epoch": 0, "step": 99, "val/loss": 1.0, "val/acc": acc - 0.2},
                    {"epoch": 0, "step": 199, "val/loss": 0.5, "val/acc": acc},
                    {"epoch": 0, "step": 200, "test/loss": 0.6, "test/acc": acc - 0.1},
                ]
                ext = [(64, "none", acc), (256, "none", acc / 2)] if task == "offset_copy" else None
                write_run(
                    s / str(i),
                    name=name,
                    kind=kind,
                    position=position,
                    seed=seed,
                    rows=rows,
                    task=task,
                    extrapolation=ext,
                    test_factor=factor,
                )
                i += 1
    assert main([str(s)]) == 0
    text = capsys.readouterr().out
    assert "## Task: offset_copy" in text and "## Task: mqar" in text and "(2)" not in text
    # test/acc 0.8, 0.6, 0.7: mean 0.7, s 0.1, half-width 0.248; test/loss 0.6 each: ± 0.000
    assert (
        table_row(text.split("## Task: mqar")[1], "linear_rope")
        == "| linear_rope | linear | rope | 3 (1,2,3) | ? | yes (-0.500) | 0.700 ± 0.248 | 0.600 ± 0.000 | 0.500 ± 0.000 | – |"
    )
    offset = text.split("## Task: offset_copy")[1].split("## Task: mqar")[0]
    assert "Test sequences are 4 × the training context" in offset
    assert "| configuration | scaling | 64 (1×) | 256 (4×) |" in offset and "pi" not in offset
    assert "| linear_rope | as trained | 0.800 ± 0.248 | 0.400 ± 0.124 |" in offset  # acc at 64 and 256
    assert "resolved**: linear_rope is higher (better) than linear" in offset  # accuracy: higher is better
    for png in ("val_curves_offset_copy.png", "val_curves_mqar.png", "extrapolation_offset_copy.png"):
        assert (s / png).stat().st_size > 1000
    assert not (s / "extrapolation_mqar.png").exists()


def test_report_cli_help_and_empty_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--pair" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no linrope runs"):
        main([str(tmp_path)])


def test_figures_name_only_what_ran_in_the_shared_encoding(sweep, tmp_path, monkeypatch):
    import linrope.analysis.report as report
    import linrope.analysis.report.lengths as lengths

    calls = []
    for module in (report, lengths):  # the validation curves, the extrapolation figure
        monkeypatch.setattr(module, "plot_curves", lambda panels, path, **kw: calls.append((path.name, panels, kw)))
    build_report([sweep], tmp_path)
    (val_name, val_panels, val_kw), (ext_name, ext_panels, ext_kw) = calls
    assert val_name == "val_curves.png" and ext_name == "extrapolation.png"
    assert val_kw["title"] == "bytes: validation val/bpb, 5 configurations, seeds 1,2,3"
    curves = {c.label: c for c in val_panels[0].curves}
    # the legend reads in the order the lines end (lowest final mean first for bits per byte)
    assert [c.label for c in val_panels[0].curves][0] == "softmax_rope"
    assert curves["linear_rope"].points[199] == pytest.approx(
        [2.95, 3.15, 3.05]
    )  # every seed, for the mean and the band
    assert curves["linear_rope"].style["color"] == curves["softmax_rope"].style["color"]
    assert curves["linear_rope"].style["linestyle"] != curves["softmax_rope"].style["linestyle"]
    assert [p.title for p in ext_panels] == [
        "as trained",
        "RoPE models: as trained (solid), pi (dashed), ntk (dotted), yarn (dash-dots), dynamic (sparse dots)",
    ]
    assert {c.label for c in ext_panels[1].curves} == {"softmax_rope as trained", "softmax_rope pi"}
    assert ext_kw["vlines"] == [64] and ext_kw["log2_x"]


def test_the_report_claims_a_validation_choice_only_for_runs_that_validated(tmp_path):
    """A run too short for its validation interval logged no val/ value: its test scored its last weights, and the
    report says so instead of calling the headline the checkpoint chosen on validation."""
    chosen = "The headline is the test score of the checkpoint chosen on validation"
    unvalidated = [r for r in lm_rows([3.0, 2.5], 2.4, [900, 1000]) if "val/bpb" not in r]
    write_run(tmp_path / "a" / "0", name="linear_rope", kind="linear", position="rope", seed=1, rows=unvalidated)
    text = build_report([tmp_path / "a"], tmp_path / "a")
    assert chosen not in text
    assert (
        "No run logged a validation value (each stopped before its first validation): the headline is the test" in text
    )
    write_run(tmp_path / "b" / "0", name="linear_rope", kind="linear", position="rope", seed=1, rows=unvalidated)
    write_run(
        tmp_path / "b" / "1",
        name="linear_rope",
        kind="linear",
        position="rope",
        seed=2,
        rows=lm_rows([3.0, 2.5], 2.4, [900, 1000]),
    )
    text = build_report([tmp_path / "b"], tmp_path / "b")
    assert (
        f"{chosen}; the best validation value is the selection metric, shown for reference only; but 1 of the 2 runs logged no validation value (0): their test score is of their last weights;"
        in text
    )
