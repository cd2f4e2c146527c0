"""A study in arms read from its config (conf/study/recall.yaml, linrope.analysis.arms): test accuracy per
configuration and width, the positive control's bar, and the paired differences per width, from small hand-made
run folders."""

from pathlib import Path

import pytest

from linrope.analysis import study_config
from linrope.analysis.arms import arms_table
from linrope.analysis.stats import mean_ci, paired
from tests.analysis.helpers import write_width


def recall_table(folder: Path) -> str:
    return arms_table(folder, study_config.named("recall"))


def test_accuracy_by_width_the_control_and_the_pairs(tmp_path):
    write_width(
        tmp_path,
        64,
        {"linear": [0.30, 0.35, 0.32], "linear_rope": [0.50, 0.52, 0.49], "softmax_rope": [0.99, 0.97, 1.00]},
    )
    write_width(
        tmp_path,
        128,
        {"linear": [0.60, 0.62, 0.61], "linear_rope": [0.70, 0.75, 0.72], "softmax_rope": [1.00, 0.99, 0.96]},
    )
    text = recall_table(tmp_path)
    assert (
        "Positive control: softmax_rope reached 0.95 test accuracy in every seed at width 64 (lowest seed "
        "0.970), width 128 (lowest seed 0.960)."
        in text
        and "NOT" not in text
    )
    iv = mean_ci([0.50, 0.52, 0.49])
    assert f"| linear_rope | {iv.mean:.3f} ± {iv.half_width:.3f} (min 0.490, n=3) |" in text
    d = paired({1: 0.70, 2: 0.75, 3: 0.72}, {1: 0.60, 2: 0.62, 3: 0.61}).diff
    cells = text.split("| linear_rope − linear |")[1].split("\n")[0]
    assert f"**{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]** (n=3; Holm p " in cells  # resolved after Holm
    assert text.index("| softmax_rope |") < text.index("| linear_rope |") < text.index("| linear |")  # best first
    for w in ("width64", "width128"):
        assert (tmp_path / w / "report.md").is_file()
    assert (tmp_path / "recall.csv").read_text().count("\nrun,") == 18
    assert (tmp_path / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # accuracy against width
    assert "![test accuracy against model width](recall.png)" in text


def test_a_control_that_misses_the_bar_or_has_not_run_is_said(tmp_path):
    write_width(tmp_path, 64, {"softmax_rope": [0.99, 0.90, 1.00], "linear": [0.3, 0.3, 0.3]})
    write_width(tmp_path, 128, {"linear": [0.5, 0.6]})  # a width still running
    text = recall_table(tmp_path)
    assert (
        "Positive control NOT met: softmax_rope must reach 0.95 test accuracy in every seed; it does not at "
        "width 64 (lowest seed 0.900). softmax_rope has not run yet at width 128." in text
    )


def test_no_width_folder_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"no arm folders \(width<N>/\) in .*recall.yaml declares"):
        recall_table(tmp_path)
