"""Studies are data (issue 32): a study's pairs, claims, verdicts and control live in ``conf/study/<experiment>.yaml``,
read by one generic path (linrope.analysis.study_config, linrope.analysis.arms), never written in the analysis
code; a bad key, metric or pair in such a file is one line naming the file and the key."""

import re
from pathlib import Path

import pytest
import yaml

from linrope.analysis import study_config
from linrope.analysis.report.command import main
from linrope.base.errors import ConfigError
from tests.analysis.helpers import lm_rows, write_run

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted((ROOT / "conf" / "study").glob("*.yaml"))
ANALYSIS = sorted((ROOT / "linrope" / "analysis").rglob("*.py"))
TUNING = "tuning: {key: optim.lr, grid: [1.0e-3], metric: val/bpb"  # a tuning section that loads, less its "}"


def what_the_studies_say():
    """(study names, the texts they word, the configuration names and single-word verdicts they use)."""
    names = [p.stem for p in STUDIES if p.stem != study_config.DEFAULT]
    texts, words = set(), set()
    for p in STUDIES:
        study = study_config.load(p)
        texts |= {c.text for c in study.claims}
        texts |= {v for k, v in study.table.items() if isinstance(v, str) and " " in v}
        for outcome, said in (study.verdict or {}).items():
            for text in [said] if outcome == "column" else said:
                (texts if " " in text else words).add(text)
        words |= {x for pair in study.compared for x in pair}
        words |= {study.control["configuration"]} if study.control else set()
    return names, texts, words


def findings(source: str, names, texts, words):
    """Where ``source`` names a study or words one of its claims."""
    found = [t for t in texts if t in source]
    found += [w for w in words if re.search(rf"[\"']{re.escape(w)}[\"']", source)]  # as a string of the code
    for n in names:  # as a string, a path or an identifier; plain prose ("a longer budget") is no study's name
        if re.search(rf"[\"'/=]{n}\b|\bexperiment\.{n}\b|\banalysis\.{n}\b|\b{n}[\"'_(]|_{n}\b", source):
            found.append(n)
    return found


def test_no_study_name_or_claim_is_written_in_the_analysis_code():
    names, texts, words = what_the_studies_say()
    assert {"budget", "recall", "rope_study"} <= set(names) and len(texts) > 15 and "linear_rope" in words
    assert sorted(findings('PAIRS = (("linear_rope", "linear"),)', names, texts, words)) == ["linear", "linear_rope"]
    found = {p.name: f for p in ANALYSIS if (f := findings(p.read_text(), names, texts, words))}
    assert not found, f"study names or claims in linrope/analysis: {found}"


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_study_config_loads_and_its_experiment_names_it(path):
    study = study_config.load(path)
    assert study.compared
    if path.stem != study_config.DEFAULT:
        experiment = (ROOT / "conf" / "experiment" / f"{path.stem}.yaml").read_text()
        assert f"task_name: {path.stem}\n" in experiment  # how the report finds it from the runs
        assert f"conf/study/{path.stem}.yaml" in experiment


def test_the_study_is_found_from_the_runs_and_named_in_one_line():
    def runs(*names):
        return [{"task_name": n} for n in names]

    assert study_config.for_runs(runs("budget", "budget")).name == "budget"
    assert study_config.for_runs(runs("pe_compare")).name == study_config.DEFAULT  # no study file of its own
    assert study_config.for_runs([]).name == study_config.DEFAULT
    with pytest.raises(ConfigError, match=r"2 experiments \(budget, recall\), each with its own claims: .*--study"):
        study_config.for_runs(runs("budget", "recall"))
    with pytest.raises(ConfigError, match=r"--study budgt: no .*budgt.yaml; did you mean budget\?"):
        study_config.named("budgt")


@pytest.mark.parametrize(
    "text, message",
    [
        ("pairs: [[linear_rope]]", "pairs[0]: ['linear_rope']: a pair is two different configuration names, [A, B]"),
        ("pairs: [[linear, linear]]", "pairs[0]: ['linear', 'linear']: a pair is two different configuration names"),
        ("tables: {}", "tables: unknown key; did you mean table?"),
        ("claims: [{a: x, b: y, metrc: test/bpb}]", "claims[0].metrc: unknown key; did you mean metric?"),
        ("claims: [{a: x, b: y, metric: tst/bpb}]", "claims[0].metric: 'tst/bpb': a metric is test/<name>, val/<name>"),
        ("claims: [{a: x, b: y}]", "claims[0]: needs a metric (or the study's metric)"),
        ("metric: test/acc\ncontrol: {configuration: x}", "control: needs one bar, at_least or at_most"),
        ("metric: test/acc\ncontrol: {configuration: x, at_least: high}", "control.at_least=high: expected a number"),
        ("arms: {folder: steps, key: trainer.max_steps}", "arms: needs task"),
        ("verdict: {column: c}", "verdict: needs same, opposite, first_only"),
        ("table: {figure: pie}", "table.figure=pie: expected one of claims, by_arm"),
        ("table: {configurations: true}", "table: its configurations, by_order and the by_arm figure need the study"),
        ("metric: test/acc\ntable: {by_order: acc_q}", "table.by_order=acc_q: expected a string (a logged metric"),
        ("tuning: {key: optim.lr, grd: [1.0e-3], metric: val/bpb}", "tuning.grd: unknown key; did you mean grid?"),
        ("tuning: {key: optim.lr, grid: [1.0e-3]}", "tuning: needs metric"),
        ("tuning: {key: optim.lr, grid: [1.0e-3], metric: test/bpb}", "tuning.metric: 'test/bpb': validation only"),
        ("tuning: {key: optim.lr, grid: [1e-3], metric: val/bpb}", "(YAML reads 1e-3 as text: write it with a point"),
        ("tuning: {key: optim.lr, grid: [1.0e-3, 1.0e-3], metric: val/bpb}", "a list of distinct positive numbers"),
        (TUNING + ", factor: 1}", "tuning.factor=1: expected a number > 1"),
        (TUNING + ", mode: low}", "tuning.mode=low: expected one of min, max"),
        (TUNING + ", seed: -1}", "tuning.seed=-1: expected an integer >= 0"),
        (
            "tuning: {key: 'optim lr', grid: [1.0e-3], metric: val/bpb}",
            "tuning.key=optim lr: expected a string (a setting as on",
        ),
        ("- a\n- b", "the file: a mapping of pairs, metric"),
        ("pairs: [a", "not YAML text"),
        ("!!python/object/apply:os.system ['touch pwned']", "not YAML text"),  # safe_load builds nothing
    ],
)
def test_a_bad_study_config_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        study_config.load(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_the_tuning_stage_of_a_study_is_read_with_its_defaults(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("tuning: {key: optim.lr, grid: [4.0e-3, 1.0e-3], metric: val/acc, mode: max}\n")
    t = study_config.load(path).tuning
    assert (t.key, t.grid, t.factor, t.max_extensions, t.seed, t.metric, t.mode, t.leaf) == (
        "optim.lr",
        (1e-3, 4e-3),
        2.0,
        3,
        0,
        "val/acc",
        "max",
        "lr",
    )
    assert study_config.named("budget").tuning.metric == "val/bpb" and study_config.named("recall").tuning.factor == 3
    path.write_text("pairs: [[a, b]]\n")
    assert study_config.load(path).tuning is None  # a study without one runs as before


def test_a_committed_study_naming_a_model_its_experiment_does_not_run_is_one_line(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "study").mkdir(parents=True)
    (conf / "experiment").mkdir()
    (conf / "experiment" / "mine.yaml").write_text("hydra:\n  sweeper:\n    params:\n      model: linear,linear_rope\n")
    (conf / "study" / "mine.yaml").write_text(
        "pairs: [[linear_rope, linear]]\nmetric: test/bpb\nclaims: [{a: linear_rope, b: linera}]\n"
    )
    monkeypatch.setattr(study_config, "CONF_DIR", conf)
    with pytest.raises(
        ConfigError,
        match=r"mine.yaml: claims\[0\].b: 'linera' is no model experiment=mine runs; "
        r"did you mean linear\?",
    ):
        study_config.named("mine")


def test_a_bad_study_on_the_command_line_is_one_line(tmp_path):
    write_run(
        tmp_path / "sweep" / "0",
        name="linear_rope",
        kind="linear",
        position="rope",
        seed=1,
        rows=lm_rows((3.0, 2.5), 2.4, (1000, 1000)),
    )
    (tmp_path / "mine.yaml").write_text("pairs: [[linear_rope, linear]]\ncliams: []\n")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "sweep"), "--study", str(tmp_path / "mine.yaml")])
    assert str(e.value) == f"linrope report: {tmp_path / 'mine.yaml'}: cliams: unknown key; did you mean claims?"


def test_a_study_of_your_own_is_tabled_with_its_own_words(tmp_path, capsys):
    """Arms, claims, verdicts and a control that no committed study uses (context<N>/, a bar on bpb from above):
    the table says what the config says, through the one generic path."""
    study = {
        "pairs": [["linear_rope", "linear"]],
        "metric": "test/bpb",
        "arms": {"folder": "context", "key": "context", "label": "{n} bytes", "task": "bytes"},
        "control": {"configuration": "softmax_rope", "at_most": 2.5, "what": "test bpb"},
        "claims": [{"text": "RoPE pays off", "a": "linear_rope", "b": "linear"}],
        "verdict": {
            "column": "longer context",
            "same": ["stands", "one sign"],
            "opposite": ["turns", "x"],
            "first_only": ["fades", "only at {first}"],
            "last_only": ["appears", "only at {last}"],
            "none": ["open", "never"],
            "unpaired": ["partial", "x"],
            "single": ["early", "x"],
        },
        "table": {
            "file": "context",
            "title": "By context",
            "intro": "Mine. {verdicts}",
            "configurations": True,
            "figure": "by_arm",
            "caption": "bpb by context",
        },
    }
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(study))
    values = {"linear": (3.3, 3.32, 3.31), "linear_rope": (3.0, 3.03, 3.01), "softmax_rope": (2.4, 2.6, 2.45)}
    kinds = {"linear": ("linear", "none"), "linear_rope": ("linear", "rope"), "softmax_rope": ("softmax", "rope")}
    for context, shift in ((64, 0.0), (128, 0.5)):
        for name, tests in values.items():
            for seed, test in enumerate(tests, 1):
                write_run(
                    tmp_path / "study" / f"context{context}" / f"{name}-{seed}",
                    name=name,
                    kind=kinds[name][0],
                    position=kinds[name][1],
                    seed=seed,
                    context=context,
                    rows=lm_rows((test + 0.2, test + 0.1), test + shift * (name == "linear_rope"), (1000, 1000)),
                )
    assert main([str(tmp_path / "study"), "--study", str(tmp_path / "mine.yaml"), "--no-reports"]) == 0
    text = (tmp_path / "study" / "context.md").read_text()
    assert (
        text.startswith("# By context\n")
        and "Mine. 'longer context': stands (one sign), turns (x), fades "
        "(only at 64 bytes), appears (only at 128 bytes), open (never), partial (x).  Written by"
        in text
    )
    assert "| claim | A − B | metric | 64 bytes | 128 bytes | longer context |" in text
    withheld = "; no verdict: softmax_rope (the control) missed its bar)"
    assert (
        "| RoPE pays off | linear_rope − linear | test/bpb | -0.297 [-0.311, -0.282] (n=3; Holm p < 0.001; "
        f"simultaneous [-0.317, -0.276]{withheld} | +0.203 [+0.189, +0.218] (n=3; Holm p < 0.001; simultaneous "
        f"[+0.183, +0.224]{withheld} | open |"
    ) in text  # resolved at both after Holm's correction (p 0.00025, 0.00027: printed to the floor), but the control
    # missed its bar at both: no verdict
    assert "Over the table's 2 comparisons with a test (every claim at every arm)" in text
    assert (
        "Positive control NOT met: softmax_rope must stay at or below 2.5 test bpb in every seed; it does not at "
        "64 bytes (highest seed 2.600), 128 bytes (highest seed 2.600)." in text
    )
    assert text.index("| softmax_rope |") < text.index("| linear_rope |")  # lower bpb first
    assert (tmp_path / "study" / "context.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "study" / "context64" / "report.md").exists()  # --no-reports
