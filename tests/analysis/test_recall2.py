"""The recall study of issue 34 (conf/study/recall2.yaml, linrope.analysis.arms.by_order): found from its runs'
task_name, it tables the accuracy of each query order per configuration and width, the seeds that fail counted
(a control below its bar, another configuration collapsed), never averaged, from small hand-made run folders."""

import statistics

from linrope.analysis.report.command import main
from tests.analysis.helpers import table_row, write_width

# (test accuracy, accuracy of query 1 … 4) per seed
LINEAR = [(0.40, [0.20, 0.30, 0.40, 0.70]), (0.42, [0.22, 0.32, 0.42, 0.72]), (0.38, [0.18, 0.28, 0.38, 0.68])]
LINEAR_ROPE = [(0.60, [0.50, 0.55, 0.60, 0.75]), (0.054, [0.02, 0.03, 0.06, 0.11]), (0.64, [0.54, 0.59, 0.64, 0.79])]
CONTROL = [(0.99, [0.98, 0.99, 0.99, 1.0]), (1.0, [1.0, 1.0, 1.0, 1.0]), (0.97, [0.95, 0.96, 0.97, 1.0])]


def test_accuracy_by_query_order_with_failed_seeds_counted(tmp_path):
    study = tmp_path / "len64"
    write_width(study, 64, {"linear": LINEAR, "linear_rope": LINEAR_ROPE, "softmax_rope": CONTROL}, "recall2")
    missed = [(0.99, [0.98, 0.99, 0.99, 1.0]), (0.90, [0.85, 0.88, 0.90, 0.97]), (1.0, [1.0] * 4)]
    write_width(study, 128, {"linear_rope": LINEAR_ROPE[:1], "softmax_rope": missed}, "recall2")
    assert main([str(study)]) == 0
    text = (study / "recall2.md").read_text()
    at64, at128 = text.split("### width 64")[1].split("### width 128")
    # linear_rope: seed 2 collapsed, counted and left out of every order's mean
    row = table_row(at64, "linear_rope")
    kept = [LINEAR_ROPE[0][1], LINEAR_ROPE[2][1]]
    means = " | ".join(f"{statistics.fmean(v[k] for v in kept):.3f}" for k in range(4))
    assert row.startswith("| linear_rope | 1 of 3 (seed 2: collapses (0.054 < 0.1)) | 1 of 3 seeds collapses (< 0.1)")
    assert row.endswith(f"| {means} |")
    # nothing failed: the mean ± t of the metric, every seed in the order means
    row = table_row(at64, "linear")
    assert row.startswith("| linear | 0 of 3 | 0.400 ± ") and row.endswith("| 0.200 | 0.300 | 0.400 | 0.700 |")
    # the control below its bar at width 128 fails there, and the control's line says so per width
    assert table_row(at128, "softmax_rope").startswith("| softmax_rope | 1 of 3 (seed 2: falls short (0.9 < 0.95))")
    assert (
        "Positive control NOT met: softmax_rope must reach 0.95 test accuracy in every seed; it does not at "
        "width 128 (lowest seed 0.900). Positive control: softmax_rope reached 0.95 test accuracy in every seed "
        "at width 64 (lowest seed 0.970)." in text
    )
    assert "| configuration | failed seeds | test/acc | q1 | q2 | q3 | q4 |" in at64
    csv_text = (study / "recall2.csv").read_text()
    assert csv_text.count("\norder,") == 4 * (9 + 4)  # every run's every order (the 13 runs)


def test_a_study_without_query_orders_shows_no_order_columns(tmp_path):
    write_width(tmp_path, 64, {"linear": [0.4, 0.5], "softmax_rope": [0.99, 1.0]}, "recall2")
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "recall2.md").read_text()
    assert "| configuration | failed seeds | test/acc |\n" in text and "| q1 |" not in text


def test_an_arm_with_only_its_tuning_stage_is_named_and_its_tuning_shown_not_tabled(tmp_path):
    """A width whose tuning stage has run but none of its main runs (a study part under way) is said in one line
    and its tuning table is shown; the tables hold the widths with main runs only (the report of a tuning-only
    arm alone says so; tested in test_study_tuning)."""
    import json

    from linrope.analysis.tuning import FORMAT, RECORD

    study = tmp_path / "len64"
    write_width(study, 128, {"linear": LINEAR, "softmax_rope": CONTROL}, "recall2")
    waiting = study / "width64"
    waiting.mkdir(parents=True)
    tried = [{"value": 0.001, "run": "tuning/linear-lr0.001", "score": 0.5, "best_step": 9, "last_step": 9}]
    record = {"format": FORMAT, "key": "optim.lr", "metric": "val/loss", "mode": "min", "protocol": {"grid": [0.001]}}
    record["configurations"] = [{"configuration": "linear", "tried": tried, "chosen": 0.001, "interior": False}]
    (waiting / RECORD).write_text(json.dumps(record))
    assert main([str(study)]) == 0
    text = (study / "recall2.md").read_text()
    assert "Not in the tables yet: width 64 (only its tuning stage has run: 0 tuning runs, below)." in text
    assert "### width 64" not in text and "### width 128" in text  # tabled: the width with main runs
    assert "## Tuning (validation only): width 64" in text and "| linear | 0.001 | **0.5000** |" in text
    assert not (waiting / "report.md").exists()  # no report of an arm without main runs


def test_a_width_whose_control_missed_its_bar_gets_no_verdict_but_stays_in_the_family(tmp_path):
    """The same clear difference at two widths: bold where the control passed; where it missed its bar the
    cell says no verdict and is never bold, yet still counts in Holm's family (m = 4: two claims at two widths)."""
    study = tmp_path / "len64"
    linear, rope = [0.40, 0.42, 0.38], [0.90, 0.93, 0.88]
    write_width(study, 64, {"linear": linear, "linear_rope": rope, "softmax_rope": [0.99, 1.0, 0.97]}, "recall2")
    write_width(study, 128, {"linear": linear, "linear_rope": rope, "softmax_rope": [0.99, 0.60, 1.0]}, "recall2")
    assert main([str(study)]) == 0
    text = (study / "recall2.md").read_text()
    row = table_row(text, "linear_rope − linear")
    at64, at128 = row.rstrip(" |").split(" | ")[1:3]
    assert at64.startswith("**+0.503 [") and "no verdict" not in at64
    assert at128.startswith("+0.503 [") and at128.endswith("no verdict: softmax_rope (the control) missed its bar)")
    assert "Over the table's 4 comparisons with a test" in text and "*No verdict*: an arm whose positive" in text


def test_a_control_seed_that_diverged_misses_its_bar(tmp_path):
    """A control seed whose accuracy is NaN (diverged) is not dropped from the control's check as the tables' means
    drop it: the bar is missed at that width, and its comparisons get no verdict (one seed fine elsewhere)."""
    study = tmp_path / "len64"
    linear, rope = [0.40, 0.42, 0.38], [0.90, 0.93, 0.88]
    control = [0.99, float("nan"), 1.0]
    write_width(study, 64, {"linear": linear, "linear_rope": rope, "softmax_rope": control}, "recall2")
    assert main([str(study)]) == 0
    text = (study / "recall2.md").read_text()
    assert "in every seed; it does not at width 64 (a seed diverged: nan)." in text
    assert "Positive control: softmax_rope reached" not in text
    row = table_row(text, "linear_rope − linear")
    assert "no verdict: softmax_rope (the control) missed its bar" in row and "**" not in row
