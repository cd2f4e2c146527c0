"""What a report says beside its numbers (linrope.analysis.report.caveats), on small hand-made logs: failed runs are named and
leave ``n``, configurations still improving are marked, parameter counts and how far learned position
parameters moved are printed; and the training run writes the record the last two are read from
(linrope.training.movement)."""

import csv
import json
import math

import pytest
import torch

from linrope.analysis.report import build_report
from tests.analysis.helpers import HEADER, lm_rows, table_row, write_run


def set_metric(run_folder, metric, value):
    """Overwrite ``metric`` in a run's metrics.csv (what a diverged run leaves: nan, inf) or drop it ("")."""
    path = run_folder / "csv" / "metrics.csv"
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        if r.get(metric):
            r[metric] = value
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)


@pytest.fixture
def three_models(tmp_path):
    s = tmp_path / "sweep"
    folders = {}
    for seed, (lr, ln) in enumerate([(3.0, 3.1), (3.2, 3.4), (3.1, 3.25)], start=1):
        for name, position, v in (
            ("linear_rope", "rope", lr),
            ("linear", "none", ln),
            ("linear_rope_both", "rope", 3.1),
        ):
            folders[(name, seed)] = s / f"{name}-{seed}"
            write_run(
                folders[(name, seed)],
                name=name,
                kind="linear",
                position=position,
                seed=seed,
                rows=lm_rows([3.5, v - 0.05], v, (1000, 1000)),
                n_params=428544,
                extra_model="    placement: both\n" if name == "linear_rope_both" else "",
            )
    return s, folders


def test_a_clean_sweep_names_no_failed_run(three_models, tmp_path):
    sweep, _ = three_models
    text = build_report([sweep], tmp_path / "out")
    assert "failed run" not in text and table_row(text, "linear_rope").startswith(
        "| linear_rope | linear | rope | 3 (1,2,3) |"
    )
    assert "**linear_rope − linear** (test/bpb, 3 matching seeds)" in text


def test_nan_infinite_and_missing_runs_are_named_and_leave_n(three_models, tmp_path):
    """The bug of issue 22: one run's test/bpb set to NaN still gave `n (seeds) 2 (1,2)` and a paired
    difference over one seed fewer, without a word."""
    sweep, folders = three_models
    set_metric(folders[("linear_rope", 2)], "test/bpb", "nan")
    set_metric(folders[("linear", 3)], "test/bpb", "inf")
    set_metric(folders[("linear_rope_both", 1)], "test/bpb", "")
    out = tmp_path / "out"
    text = build_report([sweep], out)
    section = text.split("## Task: bytes")[1]
    note_at, table_at = section.index("**3 failed runs**"), section.index("| configuration |")
    assert note_at < table_at  # said above the table
    assert f"- linear_rope: seed 2 (test/bpb NaN, `{folders[('linear_rope', 2)]}`)" in section
    assert f"- linear: seed 3 (test/bpb infinite, `{folders[('linear', 3)]}`)" in section
    assert f"- linear_rope_both: seed 1 (test/bpb missing, `{folders[('linear_rope_both', 1)]}`)" in section
    # n counts the runs behind the headline: linear_rope 3.0 and 3.1 -> 3.050 ± 12.706 · 0.0707 / √2 = 0.635;
    # its best val/bpb is behind all three seeds, so that cell says n=3
    assert table_row(text, "linear_rope") == (
        "| linear_rope | linear | rope | 2 (1,3) | 428 544 | yes (-0.450) | "
        "3.050 ± 0.635 | 3.050 ± 0.248 (n=3) | 1000 ± 0 (n=3) |"
    )
    assert table_row(text, "linear").startswith("| linear | linear | none | 2 (1,2) |")
    # linear_rope has seeds 1, 3 and linear seeds 1, 2: one seed in common, no interval
    assert "**linear_rope − linear** (test/bpb, 1 matching seed): no interval from fewer than 2 seeds." in text
    rows = {r["configuration"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert (rows["linear_rope"]["n"], rows["linear_rope"]["seeds"], rows["linear_rope"]["failed seeds"]) == (
        "2",
        "1 3",
        "2",
    )
    assert rows["linear_rope_both"]["failed seeds"] == "1" and rows["linear_rope_both"]["n"] == "2"
    assert float(rows["linear_rope"]["test/bpb mean"]) == pytest.approx(3.05)
    # runs.csv still lists every run, the failed ones with what they logged
    runs = [r for r in csv.DictReader(open(out / "runs.csv")) if r["configuration"] == "linear_rope"]
    assert [r["seed"] for r in runs] == ["1", "2", "3"] and math.isnan(float(runs[1]["test/bpb"]))


def val_rows(values, test):
    return [
        {"epoch": 0, "step": 100 * (i + 1), "val/bpb": v, "val/loss": v * math.log(2)} for i, v in enumerate(values)
    ] + [{"epoch": 0, "step": 100 * len(values), "test/bpb": test}]


def test_still_improving_is_the_last_evaluations_drop_against_the_spread_across_seeds(tmp_path):
    s = tmp_path / "sweep"
    curves = {  # per configuration, per seed: validation bpb at steps 100..400
        "falling": [[4.0, 3.5, 3.2, 3.0], [4.1, 3.6, 3.3, 3.1]],  # drop 0.5, 0.5; final spread 0.071: still improving
        "noisy": [[4.0, 3.0, 2.99, 2.98], [4.0, 3.3, 3.29, 3.28]],  # drop 0.02 < spread 0.212: no
        "flat": [[3.0, 3.0, 3.01, 3.01]],  # one seed, no longer falling: no
    }
    for name, seeds in curves.items():
        for seed, values in enumerate(seeds, start=1):
            write_run(
                s / f"{name}-{seed}",
                name=name,
                kind="softmax",
                position="rope",
                seed=seed,
                rows=val_rows(values, values[-1]),
            )
    text = build_report([s], tmp_path / "out")
    section = text.split("## Task: bytes")[1]
    assert section.index("**Still improving at the end of training: 1 of 3 configurations.**") < section.index(
        "| configuration |"
    )
    assert "- falling: fell 0.500 from step 200 to 400 (mean over 2 seeds; spread across seeds 0.071)" in section
    assert "- noisy:" not in section and "- flat:" not in section
    assert "| still improving (val/bpb) |" in section
    assert "| falling | softmax | rope | 2 (1,2) | ? | yes (-0.500) |" in section
    assert "| noisy | softmax | rope | 2 (1,2) | ? | no (-0.020) |" in section
    assert "| flat | softmax | rope | 1 (1) | ? | no (+0.010) |" in section
    rows = {r["configuration"]: r for r in csv.DictReader(open(tmp_path / "out" / "summary.csv"))}
    assert [rows[n]["still improving"] for n in ("falling", "noisy", "flat")] == ["True", "False", "False"]


def test_parameter_counts_and_how_far_position_parameters_moved(tmp_path):
    s = tmp_path / "sweep"
    records = [  # softmax_t5's β in two seeds: range at init and at the end, norms of the change
        dict(init_min=-0.1, init_max=0.1, min=-0.8, max=0.9, init_norm=0.5, norm=2.1, change_norm=2.0, change_max=0.85),
        dict(init_min=-0.1, init_max=0.1, min=-0.6, max=0.7, init_norm=0.5, norm=1.1, change_norm=1.0, change_max=0.65),
    ]
    for seed, rec in enumerate(records, start=1):
        folder = s / f"t5-{seed}"
        write_run(
            folder,
            name="softmax_t5",
            kind="softmax",
            position="t5",
            seed=seed,
            rows=lm_rows([3.0, 2.9], 2.9, (1000, 1000)),
            n_params=1,
        )  # parameters.json wins over hparams.yaml
        (folder / "parameters.json").write_text(
            json.dumps({"n_params": 428800, "position": {"pos_shared.bias": {"shape": [32, 2], **rec}}})
        )
    write_run(
        s / "rope",
        name="softmax_rope",
        kind="softmax",
        position="rope",
        seed=1,
        rows=lm_rows([3.0, 2.9], 2.8, (1000, 1000)),
        n_params=428544,
    )
    write_run(
        s / "rope-2",
        name="softmax_rope",
        kind="softmax",
        position="rope",
        seed=2,
        rows=lm_rows([3.0, 2.9], 2.8, (1000, 1000)),
        n_params=428545,
    )  # two counts in one configuration
    text = build_report([s], tmp_path / "out")
    assert table_row(text, "softmax_t5").startswith("| softmax_t5 | softmax | t5 | 2 (1,2) | 428 800 |")
    assert table_row(text, "softmax_rope").startswith("| softmax_rope | softmax | rope | 2 (1,2) | 428 544 / 428 545 |")
    movement = text.split("### Learned position parameters: how far they moved (bytes)")[1]
    # means over the seeds: end range [-0.7, +0.8], ‖Δ‖ 1.5, ‖Δ‖/‖init‖ (4 + 2) / 2 = 3, max |Δ| 0.75
    assert (
        "| softmax_t5 | `pos_shared.bias` | 32×2 | 2 | [-0.100, +0.100] (0.200) | [-0.700, +0.800] (1.500) | "
        "1.500 | 3.000 | 0.750 |"
    ) in movement
    assert "softmax_rope" not in movement.split("![")[0]  # nothing learned to move
    header = next(line for line in movement.splitlines() if line.startswith("| configuration |"))
    assert header.replace("\\|", "").count("|") == 10  # nine columns: no bare "|" inside a header


def test_no_movement_section_without_records(tmp_path):
    write_run(
        tmp_path / "s" / "0",
        name="linear",
        kind="linear",
        position="none",
        seed=1,
        rows=lm_rows([3.0, 2.9], 2.9, (1000, 1000)),
    )
    assert "how far they moved" not in build_report([tmp_path / "s"], tmp_path / "out")


# ---- what the training run records (linrope.training.movement) -------------------------------------------------------------
def model(compose, preset):
    from omegaconf import OmegaConf

    from linrope.models.model import TransformerLM

    return TransformerLM(OmegaConf.to_container(compose(f"model={preset}", "size=tiny").model, resolve=True))


def test_the_position_parameters_of_a_model(compose):
    from linrope.training.movement import position_parameters

    assert list(position_parameters(model(compose, "softmax_t5"))) == ["pos_shared.bias"]
    assert list(position_parameters(model(compose, "softmax_rope"))) == []
    assert sorted(position_parameters(model(compose, "softmax_xl"))) == sorted(
        f"blocks.{i}.attn.pos.{a}" for i in range(2) for a in ("w_r", "u", "v")
    )
    assert list(position_parameters(model(compose, "softmax_learned"))) == ["pos.table"]


def test_movement_in_float64():
    from linrope.training.movement import movement

    init = {"b": torch.tensor([[0.0, 1.0], [2.0, 3.0]])}
    final = {"b": torch.tensor([[0.0, 1.0], [2.0, 7.0]]), "new": torch.tensor([1.0, -1.0])}
    rec = movement(final, init)
    assert rec["b"] == {
        "shape": [2, 2],
        "min": 0.0,
        "max": 7.0,
        "norm": pytest.approx(math.sqrt(54)),
        "init_min": 0.0,
        "init_max": 3.0,
        "init_norm": pytest.approx(math.sqrt(14)),
        "change_norm": 4.0,
        "change_max": 4.0,
    }
    assert rec["new"]["change_norm"] is None and rec["new"]["max"] == 1.0  # no initial values: unknown


def test_a_training_run_records_its_parameter_count_and_movement(compose, small_corpus, tmp_path):
    import train
    from linrope.models.model import TransformerLM

    cfg = compose(
        "model=softmax_t5",
        "size=tiny",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        f"data.path={small_corpus}",
        "data.val_windows=2",
        "data.test_windows=2",
        "data.batch_size=4",
        "data.eval_batch_size=4",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "optim.warmup_steps=1",
        "trainer.log_every_n_steps=1",
    )
    train.main(cfg)
    run = tmp_path  # paths.output_dir
    record = json.loads((run / "parameters.json").read_text())
    from omegaconf import OmegaConf

    assert record["n_params"] == TransformerLM(OmegaConf.to_container(cfg.model, resolve=True)).num_params()
    init = torch.load(run / "position_init.pt", weights_only=True)
    beta = record["position"]["pos_shared.bias"]
    assert beta["shape"] == [32, 4] and list(init) == ["pos_shared.bias"]
    assert beta["init_min"] == pytest.approx(init["pos_shared.bias"].double().min().item())
    assert 0.0 < beta["change_max"] < 4 * 2e-3 * 1.01  # AdamW moves an entry by about lr per step at most
    text = build_report([run], tmp_path / "report")
    assert "| `pos_shared.bias` | 32×4 | 1 |" in text  # (no .hydra/config.yaml here: the run is named by its folder)
    assert f"| {record['n_params']:,} |".replace(",", " ") in text.split("| configuration |")[1]


def test_a_resumed_run_measures_from_its_own_start(compose, tmp_path):
    """The initial values are kept in the run folder at step 0; a resumed run (a new process, a later step)
    reads them back, so the change is measured from the start of the run, not from the resume."""
    from types import SimpleNamespace

    from linrope.training.movement import PositionMovement

    module = SimpleNamespace(model=model(compose, "softmax_t5"))
    beta = module.model.pos_shared.bias
    start = beta.detach().clone()
    PositionMovement(str(tmp_path)).on_train_start(SimpleNamespace(global_step=0, is_global_zero=True), module)
    with torch.no_grad():
        beta.add_(0.25)  # "training"
    resumed = PositionMovement(str(tmp_path))
    resumed.on_train_start(SimpleNamespace(global_step=30, is_global_zero=True), module)
    with torch.no_grad():
        beta[0, 0] += 1.0
    resumed.on_train_end(SimpleNamespace(global_step=60, is_global_zero=True), module)
    rec = json.loads((tmp_path / "parameters.json").read_text())
    assert rec["step"] == 60 and rec["n_params"] == module.model.num_params()
    b = rec["position"]["pos_shared.bias"]
    assert b["change_max"] == pytest.approx(1.25) and b["init_min"] == pytest.approx(start.double().min().item())
    d = torch.full_like(start, 0.25, dtype=torch.float64)
    d[0, 0] += 1.0
    assert b["change_norm"] == pytest.approx(d.norm().item(), rel=1e-6)
    # resumed elsewhere (no initial values in the folder): the change is unknown, not measured from the resume
    other = PositionMovement(str(tmp_path / "elsewhere"))
    other.on_train_start(SimpleNamespace(global_step=30, is_global_zero=True), module)
    other.on_train_end(SimpleNamespace(global_step=60, is_global_zero=True), module)
    rec = json.loads((tmp_path / "elsewhere" / "parameters.json").read_text())
    assert rec["position"]["pos_shared.bias"]["change_norm"] is None


def test_curves_drawn_alike_are_told_apart():
    """Configurations that differ only in what the style does not see (a learning rate, a precision) get their
    own markers and shades; the first keeps its style, and curves drawn differently are left as they are."""
    from linrope.base.plots import Curve, distinct_styles

    same = {"color": "red", "linestyle": "-", "marker": "o"}
    curves = [
        Curve("a lr=1", {1: [1.0]}, dict(same)),
        Curve("a lr=2", {1: [2.0]}, dict(same)),
        Curve("b", {1: [3.0]}, {"color": "blue", "linestyle": "-", "marker": "o"}),
        Curve("a lr=3", {1: [4.0]}, dict(same)),
    ]
    out = distinct_styles(curves)
    assert [c.label for c in out] == ["a lr=1", "a lr=2", "b", "a lr=3"]
    assert out[0].style == same and out[2].style == curves[2].style
    markers = [c.style["marker"] for c in (out[0], out[1], out[3])]
    assert len(set(markers)) == 3 and out[1].style["alpha"] > out[3].style["alpha"]
