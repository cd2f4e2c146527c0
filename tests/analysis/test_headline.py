"""The committed headline study (docs/results/headline/steps3200, issue 34) and its protocol on the second corpus
(docs/results/prose/steps3200, issue 55: experiment=prose) against the protocol they claim: a validation-only
tuning per configuration whose choice is interior, the main runs at the chosen rate on seeds 1-5 with the same
budget, and every run scoring the whole test split (bytes and documents checked against the split rebuilt from the
run's own data config), under both extrapolation protocols and the context-limited control.

The studies were committed as they ran (finished runs in compact form, linrope study --commit); both have
finished, so every configuration must hold its five seeds."""

from __future__ import annotations

import csv
import functools
import json
import platform
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from linrope.analysis.runs import compact_index

pytestmark = pytest.mark.results  # committed study data: CI's results stage (pytest -m results)

ROOT = Path(__file__).resolve().parents[2]
PART = ROOT / "docs" / "results" / "headline" / "steps3200"
PARTS = {"headline": PART, "prose": ROOT / "docs" / "results" / "prose" / "steps3200"}  # experiment=<name>
DOCUMENTS = {"headline": 33, "prose": 69}  # the whole test split each study's docs describe
SEEDS = {1, 2, 3, 4, 5}
STEPS = 3200
CONTROLS = ("linear_rope_decay", "linear_rope_norm")  # the two trained controls; the third is an evaluation row


def configurations(study: str = "headline") -> list:
    """The configurations the experiment sweeps (conf/experiment/<study>.yaml)."""
    sweep = OmegaConf.load(ROOT / "conf" / "experiment" / f"{study}.yaml").hydra.sweeper.params
    assert [int(s) for s in str(sweep.seed).split(",")] == sorted(SEEDS)
    return [m.strip() for m in str(sweep.model).split(",")]


def tuning(study: str = "headline") -> dict:
    return json.loads((PARTS[study] / "tuning.json").read_text())


def main_runs(study: str = "headline") -> list:
    return compact_index(PARTS[study]) if (PARTS[study] / "runs.json").is_file() else []


COSINE = ["linear_cosine", "linear_cosine_rope"]  # issue 55's arms, the cosine feature map, added last


def test_the_study_holds_the_nine_configurations_and_the_two_trained_controls():
    names = configurations()
    assert len(names) == 11 and set(CONTROLS) <= set(names) and names[-2:] == COSINE
    assert [c["configuration"] for c in tuning()["configurations"]] == names


def test_the_second_corpus_holds_the_seven_configurations_the_issue_names_and_linear_cosine():
    """experiment=prose (issue 55): at least seven configurations, those named, and linear_cosine, so that the
    cosine kernel's RoPE gain is measured on prose as on Python sources."""
    names = configurations("prose")
    named = ["linear", "linear_rope", "linear_rope_both", "linear_cosine_rope", "linear_rope_decay", "softmax_rope"]
    assert set(named + ["softmax_alibi", "linear_cosine"]) == set(names) and len(names) == 8
    assert [c["configuration"] for c in tuning("prose")["configurations"]] == names


@pytest.mark.parametrize("study", PARTS)
def test_tuning_is_on_validation_only_with_one_grid_and_budget_and_every_choice_is_interior(study):
    """The protocol recorded in tuning.json, each tuning run's own saved config, and each choice: the best
    validation score among the values tried, not at an edge of them."""
    t = tuning(study)
    assert (t["metric"], t["mode"], t["key"]) == ("val/bpb", "min", "optim.lr")
    protocol = t["protocol"]
    assert (protocol["test"], protocol["extrapolation"], protocol["max_steps"]) == (False, False, STEPS)
    scored = {}
    for record in compact_index(PARTS[study] / "tuning"):
        config = record["config"]
        assert config["test"] is False and config["extrapolation"]["enabled"] is False, record["run"]
        assert (config["seed"], config["trainer"]["max_steps"]) == (protocol["seed"], STEPS), record["run"]
        scored[f"tuning/{record['run']}"] = record["study"]["tuning"]["score"]
    chosen = 0
    for c in t["configurations"]:
        values = [x["value"] for x in c["tried"]]
        assert values[: len(protocol["grid"])] == protocol["grid"] or sorted(values) == sorted(set(values)), c
        assert c["max_steps"] == STEPS
        for x in c["tried"]:
            if x["score"] is not None and x["run"].startswith("tuning/"):  # (the re-tuning's: the test below)
                assert x["score"] == pytest.approx(scored[x["run"]]), x["run"]
        if c["chosen"] is None:
            continue
        chosen += 1
        assert c["chosen"] == best_value(c, protocol), c["configuration"]
        assert c["interior"] is True and min(values) < c["chosen"] < max(values), c["configuration"]
    assert chosen or not (PARTS[study] / "runs.json").is_file()  # main runs start only after a choice


def best_value(c: dict, protocol: dict) -> float:
    """The value a configuration's record must have chosen: the best score at the protocol's seed, or, where it was
    tuned again on more seeds (``seeds``: each seed's runs at the same values), the best mean over them all."""
    if not c.get("seeds"):
        return min(c["tried"], key=lambda x: x["score"])["value"]
    runs = {str(protocol["seed"]): c["tried"], **c["seeds"]}
    values = [x["value"] for x in c["tried"]]
    assert all([x["value"] for x in tried] == values for tried in runs.values()), c["configuration"]
    return min(values, key=lambda v: sum(x["score"] for t in runs.values() for x in t if x["value"] == v))


@pytest.mark.parametrize("study", PARTS)
def test_a_configuration_tuned_on_more_seeds_records_each_seeds_runs(study):
    """linear_rope_both (issue 55): its seed-0 scores did not move with the rate (on Python sources 4e-3 diverged at
    step 999; on prose they were non-monotone), so it was tuned again on seeds 6 and 7 (on Python sources also at
    1e-3 on all three); those runs are in ../rope-both-retuning/, validation only, at the record's seeds and
    values, with the scores the record holds (each run's best val/bpb); the note says so."""
    t = tuning(study)
    again = [c for c in t["configurations"] if c.get("seeds")]
    assert [c["configuration"] for c in again] == ["linear_rope_both"]
    folder = PARTS[study].parent / "rope-both-retuning"
    records = {r["run"]: r for r in compact_index(folder)}
    curves = {}
    with open(folder / "curves.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("val/bpb"):
                curves.setdefault(row["run"], []).append(float(row["val/bpb"]))
    for c in again:
        assert "tuned again on seeds 0, 6 and 7" in c["note"]
        runs = [(seed, x) for seed, tried in c["seeds"].items() for x in tried]
        runs += [("0", x) for x in c["tried"] if not x["run"].startswith("tuning/")]
        assert len(runs) == len(records)
        for seed, x in runs:
            record = records[x["run"].removeprefix("../rope-both-retuning/")]
            config = record["config"]
            assert config["test"] is False and config["extrapolation"]["enabled"] is False, x["run"]
            assert config["seed"] == int(seed) and config["optim"]["lr"] == pytest.approx(x["value"]), x["run"]
            assert config["trainer"]["max_steps"] == STEPS and x["last_step"] == STEPS - 1, x["run"]
            assert x["score"] == pytest.approx(min(curves[record["run"]])), x["run"]


def test_proses_rope_both_retuning_means_are_the_ones_the_docs_quote():
    """experiment=prose, linear_rope_both (issue 55): the mean of seeds 0, 6 and 7's best val/bpb at each rate, as
    docs/results.md ("Prose") quotes them, chose 2e-3.  (The runs behind each score, their protocol and the choice
    rule: test_a_configuration_tuned_on_more_seeds_records_each_seeds_runs and the tuning test above.)"""
    (c,) = [c for c in tuning("prose")["configurations"] if c["configuration"] == "linear_rope_both"]
    runs = [c["tried"], *c["seeds"].values()]
    assert sorted(c["seeds"]) == ["6", "7"]
    rates = [x["value"] for x in c["tried"]]
    mean = [sum(x["score"] for tried in runs for x in tried if x["value"] == r) / len(runs) for r in rates]
    assert [round(m, 3) for m in mean] == [2.869, 2.627, 2.229, 3.102, 2.941]
    assert c["chosen"] == pytest.approx(2e-3)


@pytest.mark.parametrize("study", PARTS)
def test_every_main_run_trains_at_its_configurations_chosen_rate_with_the_same_budget(study):
    chosen = {c["configuration"]: c["chosen"] for c in tuning(study)["configurations"]}
    seeds = {}
    for record in main_runs(study):
        config, model = record["config"], record["model_name"]
        assert config["optim"]["lr"] == pytest.approx(chosen[model]), record["run"]
        assert config["trainer"]["max_steps"] == STEPS and config["seed"] in SEEDS, record["run"]
        seeds.setdefault(model, set()).add(config["seed"])
    assert seeds == {name: SEEDS for name in configurations(study)}  # every configuration has finished: 5 seeds each


@functools.cache
def whole_test_split(data: str) -> tuple:
    """(bytes scored, documents) of the whole test split, rebuilt from a run's resolved data config (JSON)."""
    from linrope.data.modules import ByteDataModule

    kwargs = {k: v for k, v in json.loads(data).items() if k not in ("_target_", "task")}
    dm = ByteDataModule(**kwargs)
    return len(dm.splits["test"]) - 1, len(dm.documents["test"])  # every byte but the first is a target


def finished_main_runs() -> list:
    return [pytest.param(study, r, id=f"{study}/{r['run']}") for study in PARTS for r in main_runs(study)]


@pytest.mark.parametrize("study, record", finished_main_runs())
def test_every_main_run_scores_the_whole_test_split_under_both_protocols_and_the_control(study, record):
    """test/bytes and test/documents against the test split itself; the extrapolation table scores those same
    bytes at every length (1, 2, 16x) under sliding and non-overlapping windows, and beyond 1x the
    context-limited control (attention to the last `context` keys)."""
    from linrope.analysis.runs import find_runs
    from linrope.data import corpora

    config = OmegaConf.create(record["config"])
    recorded = record["provenance"]["versions"].get("python")
    if corpora.named(config.data.path) is None and recorded != platform.python_version():
        pytest.skip(f"the test split is this Python's stdlib ({platform.python_version()}); the run read {recorded}'s")
    missing = corpora.check(config.data.path)  # (CI's results stage installs the `prose` extra: it runs there)
    if missing:
        pytest.skip(missing)
    data = OmegaConf.to_container(config.data, resolve=True)
    n_bytes, n_docs = whole_test_split(json.dumps(data, sort_keys=True))
    assert n_docs == DOCUMENTS[study] and n_bytes > 200_000  # the split the study's docs describe
    (run,) = [r for r in find_runs(PARTS[study]) if r.path.name == record["run"]]
    assert (run.value("test/bytes", "last"), run.value("test/documents", "last")) == (n_bytes, n_docs), record["run"]
    context, rows = config.context, [r for r in record["extrapolation"] if r["status"] == "ok"]
    seen = {(r["factor"], r.get("protocol") or "sliding", r.get("window")) for r in rows}
    for factor in (1, 2, 16):
        assert {(factor, "sliding", None), (factor, "windows", None)} <= seen, (record["run"], factor)
        if factor > 1:  # the context-limited control
            assert any(f == factor and w == context for f, _, w in seen), (record["run"], factor)
    assert {int(r["bytes"]) for r in rows} == {n_bytes}, record["run"]  # the same bytes at every length
