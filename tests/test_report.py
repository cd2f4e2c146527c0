"""linrope.report on fabricated run folders: the table holds the hand-computed mean ± std over seeds."""
import csv
import math
from pathlib import Path

import pytest

from linrope.report import build_report, group_runs, find_runs, main, mean_std

HEADER = ["epoch", "step", "train/loss", "train/tokens_per_sec", "val/bpb", "val/loss", "val/acc", "test/bpb",
          "test/loss", "test/acc"]


def write_run(folder: Path, *, name, kind, position, seed, rows, task="bytes", extra_model="", extrapolation=None):
    (folder / ".hydra").mkdir(parents=True)
    (folder / "csv").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(
        f"task_name: pe_compare\nseed: {seed}\ncontext: 64\n"
        f"model:\n  name: {name}\n  d_model: 64\n  attention:\n    kind: {kind}\n{extra_model}"
        f"  position:\n    name: {position}\n"
        f"data:\n  task: {task}\n  context: ${{context}}\n  seed: ${{seed}}\n"
        f"paths:\n  output_dir: ${{hydra:runtime.output_dir}}\ntrainer:\n  max_steps: 200\n")
    with open(folder / "csv" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in HEADER})
    if extrapolation:
        with open(folder / "extrapolation.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["length", "factor", "scaling", "loss", "bpb", "acc", "examples",
                                              "scored", "status"])
            w.writeheader()
            for length, scaling, bpb in extrapolation:
                ok = bpb is not None
                w.writerow({"length": length, "factor": length / 64, "scaling": scaling,
                            "loss": bpb * math.log(2) if ok else "", "bpb": bpb if ok else "", "acc": "",
                            "examples": 8 if ok else 0, "scored": 512 if ok else 0,
                            "status": "ok" if ok else "n/a (position table has 64 rows)"})


def lm_rows(val, test, tps):
    """train rows with throughput, validation at steps 99 and 199, one test row."""
    rows = [{"epoch": 0, "step": 49, "train/loss": 3.0, "train/tokens_per_sec": tps[0]},
            {"epoch": 0, "step": 99, "val/bpb": val[0], "val/loss": val[0] * math.log(2)},
            {"epoch": 0, "step": 149, "train/loss": 2.0, "train/tokens_per_sec": tps[1]},
            {"epoch": 0, "step": 199, "val/bpb": val[1], "val/loss": val[1] * math.log(2)}]
    return rows + [{"epoch": 0, "step": 200, "test/bpb": test, "test/loss": test * math.log(2)}]


@pytest.fixture
def sweep(tmp_path):
    s = tmp_path / "multirun"
    write_run(s / "0", name="softmax_rope", kind="softmax", position="rope", seed=1,
              rows=lm_rows([3.0, 2.0], 2.1, [1000, 1200]),
              extrapolation=[(64, "none", 2.0), (128, "none", 2.5), (128, "pi", 2.2)])
    write_run(s / "1", name="softmax_rope", kind="softmax", position="rope", seed=2,
              rows=lm_rows([2.8, 2.4], 2.5, [900, 1100]),
              extrapolation=[(64, "none", 2.4), (128, "none", 2.9), (128, "pi", 2.6)])
    write_run(s / "2", name="linear_rope", kind="linear", position="rope", seed=1,
              rows=lm_rows([3.5, 3.1], 3.2, [2000, 2000]))
    write_run(s / "3", name="softmax_learned", kind="softmax", position="learned", seed=1,
              rows=lm_rows([3.3, 3.0], 3.05, [1000, 1000]),
              extrapolation=[(64, "none", 3.0), (128, "none", None)])
    return s


def test_mean_and_sample_std():
    assert mean_std([2.0, 2.4]) == (pytest.approx(2.2), pytest.approx(math.sqrt(0.08)), 2)
    assert mean_std([3.1]) == (3.1, None, 1)
    assert mean_std([None, 1.0, float("nan")]) == (1.0, None, 1)
    assert mean_std([]) == (None, None, 0)


def test_report_table_holds_mean_and_std_over_seeds(sweep, tmp_path):
    out = tmp_path / "out"
    text = build_report([sweep], out)
    # best val/bpb: 2.0 and 2.4 -> 2.200 ± 0.283; test 2.1 and 2.5 -> 2.300 ± 0.283;
    # tokens/s: means 1100 and 1000 -> 1050 ± 71
    assert "| softmax_rope | softmax | rope | 2 (1,2) | 2.200 ± 0.283 | 2.300 ± 0.283 | 1050 ± 71 |" in text
    assert "| linear_rope | linear | rope | 1 (1) | 3.100 | 3.200 | 2000 |" in text
    table = text.split("## Task: bytes")[1].split("##")[0]
    order = [line.split("|")[1].strip() for line in table.splitlines()[3:] if line.startswith("| ")]
    assert order == ["softmax_rope", "softmax_learned", "linear_rope"]  # sorted by best val/bpb (2.2, 3.0, 3.1)
    # extrapolation: mean over seeds by length, n/a where the table ends
    assert "| softmax_rope | as trained | bpb | 2.200 | 2.700 |" in text
    assert "| softmax_rope | pi | bpb | – |" not in text and "| softmax_rope | pi | bpb | n/a | 2.400 |" in text
    assert "| softmax_learned | as trained | bpb | 3.000 | n/a |" in text
    assert (out / "report.md").read_text() == text
    for png in ("val_curves.png", "extrapolation.png"):
        assert (out / png).stat().st_size > 1000
    rows = {r["configuration"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert float(rows["softmax_rope"]["best val/bpb mean"]) == pytest.approx(2.2)
    assert float(rows["softmax_rope"]["best val/bpb std"]) == pytest.approx(math.sqrt(0.08))
    assert rows["linear_rope"]["best val/bpb std"] == ""


def test_runs_of_one_model_are_told_apart_by_what_differs(tmp_path):
    s = tmp_path / "ablation"
    for i, (placement, seed) in enumerate([("numerator", 1), ("numerator", 2), ("both", 1)]):
        write_run(s / str(i), name="linear_rope", kind="linear", position="rope", seed=seed,
                  extra_model=f"    placement: {placement}\n", rows=lm_rows([3.0, 2.0 + i / 10], 2.5, [10, 10]))
    groups = group_runs(find_runs(s))
    assert sorted(groups) == ["linear_rope placement=both", "linear_rope placement=numerator"]
    assert len(groups["linear_rope placement=numerator"]) == 2


def test_task_runs_report_loss_and_accuracy(tmp_path, capsys):
    s = tmp_path / "tasks"
    for seed, accs in ((1, (0.5, 0.9)), (2, (0.6, 0.7))):
        rows = [{"epoch": 0, "step": 99, "val/loss": 1.0, "val/acc": accs[0]},
                {"epoch": 0, "step": 199, "val/loss": 0.5, "val/acc": accs[1]},
                {"epoch": 0, "step": 200, "test/loss": 0.6, "test/acc": 0.8}]
        write_run(s / str(seed), name="softmax_rope", kind="softmax", position="rope", seed=seed, rows=rows,
                  task="mqar")
    assert main([str(s)]) == 0
    text = capsys.readouterr().out
    assert "## Task: mqar" in text
    # best val/acc: 0.9 and 0.7 -> 0.800 ± 0.141
    assert ("| softmax_rope | softmax | rope | 2 (1,2) | 0.500 ± 0.000 | 0.800 ± 0.141 | 0.600 ± 0.000 "
            "| 0.800 ± 0.000 | – |") in text
    assert (s / "report.md").exists() and (s / "val_curves.png").exists()


def test_report_cli_help_and_empty_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "metrics.csv" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no runs"):
        main([str(tmp_path)])
