"""Run folders written by hand, as linrope writes them, for the tests of tests/analysis (report, budget, recall,
provenance): a run's config, metrics.csv and extrapolation.csv, its rows, a budget's and a width's runs."""

import csv
import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from linrope.analysis import compact
from linrope.run import provenance as P

HEADER = [
    "epoch",
    "step",
    "train/loss",
    "train/tokens_per_sec",
    "val/bpb",
    "val/loss",
    "val/acc",
    "test/bpb",
    "test/loss",
    "test/acc",
]


def write_run(
    folder: Path,
    *,
    name,
    kind,
    position,
    seed,
    rows,
    task="bytes",
    extra_model="",
    extra_position="",
    extrapolation=None,
    context=64,
    test_factor=1,
    n_params=None,
    max_steps=200,
    d_model=64,
    task_name="pe_compare",
):
    (folder / ".hydra").mkdir(parents=True)
    (folder / "csv").mkdir()
    if n_params is not None:  # what the loggers get (training.log_config)
        (folder / "csv" / "hparams.yaml").write_text(f"model:\n  name: {name}\nn_params: {n_params}\nseed: {seed}\n")
    (folder / ".hydra" / "config.yaml").write_text(
        f"task_name: {task_name}\nseed: {seed}\ncontext: {context}\n"
        f"model:\n  name: {name}\n  d_model: {d_model}\n  attention:\n    kind: {kind}\n{extra_model}"
        f"  position:\n    name: {position}\n{extra_position}"
        f"data:\n  task: {task}\n  context: ${{context}}\n  seed: ${{seed}}\n  test_factor: {test_factor}\n"
        f"paths:\n  output_dir: ${{hydra:runtime.output_dir}}\ntrainer:\n  max_steps: {max_steps}\n"
    )
    fields = list(dict.fromkeys([*HEADER, *(k for r in rows for k in r)]))  # and any other metric a row logs
    with open(folder / "csv" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    if extrapolation:
        metric = "bpb" if task == "bytes" else "acc"
        with open(folder / "extrapolation.csv", "w", newline="") as f:
            w = csv.DictWriter(
                f, fieldnames=["length", "factor", "scaling", "loss", "bpb", "acc", "examples", "scored", "status"]
            )
            w.writeheader()
            for length, scaling, value in extrapolation:
                ok = value is not None
                w.writerow(
                    {
                        "length": length,
                        "factor": length / context,
                        "scaling": scaling,
                        "loss": 1.0 if ok else "",
                        metric: value if ok else "",
                        "examples": 8 if ok else 0,
                        "scored": 512 if ok else 0,
                        "status": "ok" if ok else "n/a (position table has 64 rows)",
                    }
                )


def lm_rows(val, test, tps):
    """train rows with throughput, validation at steps 99 and 199, one test row."""
    rows = [
        {"epoch": 0, "step": 49, "train/loss": 3.0, "train/tokens_per_sec": tps[0]},
        {"epoch": 0, "step": 99, "val/bpb": val[0], "val/loss": val[0] * math.log(2)},
        {"epoch": 0, "step": 149, "train/loss": 2.0, "train/tokens_per_sec": tps[1]},
        {"epoch": 0, "step": 199, "val/bpb": val[1], "val/loss": val[1] * math.log(2)},
    ]
    return rows + [{"epoch": 0, "step": 200, "test/bpb": test, "test/loss": test * math.log(2)}]


def table_row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |"))


KINDS = {"linear": ("linear", "none"), "linear_rope": ("linear", "rope"), "softmax_rope": ("softmax", "rope")}


def write_budget(folder: Path, steps: int, values):
    """values: name -> [test bpb per seed]; bpb@256 is test + 0.1·(index of the seed)."""
    for name, tests in values.items():
        kind, position = KINDS[name]
        for seed, test in enumerate(tests, 1):
            write_run(
                folder / f"steps{steps}" / f"{name}-seed{seed}",
                name=name,
                kind=kind,
                position=position,
                seed=seed,
                rows=lm_rows((test + 0.2, test + 0.1), test, (1000, 1000)),
                context=128,
                max_steps=steps,
                task_name="budget",
                extrapolation=[(128, "none", test), (256, "none", test + 0.1 * seed)],
            )


def acc_rows(acc, orders=()):
    """Validation at steps 99 and 199, one test row; ``orders``: the test accuracy of each query order."""
    by_order = {f"test/acc_q{k}": a for k, a in enumerate(orders, 1)}
    return [
        {"epoch": 0, "step": 99, "val/loss": 1.0, "val/acc": acc - 0.05, "train/tokens_per_sec": 1000},
        {"epoch": 0, "step": 199, "val/loss": 0.8, "val/acc": acc},
        {"epoch": 0, "step": 200, "test/loss": 0.8, "test/acc": acc, **by_order},
    ]


def write_width(folder: Path, width: int, values, task_name="recall"):
    """values: name -> [test accuracy per seed], or [(test accuracy, [accuracy per query order]) per seed]."""
    for name, accs in values.items():
        kind, position = KINDS[name]
        for seed, acc in enumerate(accs, 1):
            acc, orders = acc if isinstance(acc, tuple) else (acc, ())
            write_run(
                folder / f"width{width}" / f"{name}-seed{seed}",
                name=name,
                kind=kind,
                position=position,
                seed=seed,
                task="mqar",
                rows=acc_rows(acc, orders),
                d_model=width,
                task_name=task_name,
            )


def recorded(commit: str, torch: str = "2.13.0+cpu", code=None) -> dict:
    """A run's provenance; ``code`` None: recorded before runs named their code (the commit then decides)."""
    p = P.collect(precision="32-true", seed=1, argv=["train.py"])
    return {
        **p,
        "linrope": {**p["linrope"], "commit": commit, "dirty": False, "diff_hash": None, "code": code},
        "versions": {**p["versions"], "torch": torch},
        "machine": {**p["machine"], "cpu": "Test CPU", "threads": 2},
    }


EXTRAPOLATION = "length,factor,scaling,loss,bpb,acc,examples,scored,stride,scored_hash,seconds,status\n"


def fake_run(folder, model, seed, finished=True, lr=3e-3, parameters=True, extrapolation=True):
    """A run folder as train.py and linrope study leave it (the files find_runs reads)."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / "csv").mkdir()
    OmegaConf.save(
        OmegaConf.create(
            {
                "seed": seed,
                "data": {"task": "bytes", "seed": "${seed}"},
                "optim": {"lr": lr, "betas": [0.9, 0.95]},
                "model": {
                    "name": model,
                    "attention": {"kind": "linear"},
                    "position": {"name": "rope", "base": 10000.0},
                },
                "callbacks": {"m": {"_target_": "linrope.training.movement.PositionMovement"}},
                "trainer": {"max_steps": 4},
            }
        ),
        folder / ".hydra" / "config.yaml",
    )
    (folder / "csv" / "hparams.yaml").write_text(f"model:\n  name: {model}_logged\nn_params: 1234\n")
    base = 3.0 + seed / 10 + (model == "b")
    (folder / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,val/bpb,test/bpb\n"
        f"0,1,{base + 0.5},,\n0,1,,{base + 0.25},\n0,3,{base + 0.125},,\n0,3,,{base},\n0,3,,,{base - 0.0625}\n"
    )
    if extrapolation:
        (folder / "extrapolation.csv").write_text(
            EXTRAPOLATION + f"8,1.0,none,2.0,{base},,10,80,,abc,0.5,ok\n16,2.0,none,2.5,{base + 1},,5,80,8,abc,0.5,ok\n"
            f"16,2.0,pi,2.4,{base + 0.5},,5,80,8,abc,0.5,ok\n32,4.0,none,,,,0,0,,,0.0,too long\n"
        )
    if parameters:
        (folder / "parameters.json").write_text(
            json.dumps({"n_params": 999, "step": 4, "position": {"slopes": {"moved": 0.5}}})
        )
    (folder / "provenance.json").write_text(
        json.dumps(
            {
                "linrope": {"commit": "c" * 40, "code": "abcdefabcdef", "dirty": False},
                "versions": {"torch": "2.13.0"},
                "machine": {"cpu": "AMD EPYC", "threads": 1},
                "precision": "32-true",
                "overrides": [f"model={model}"],
            }
        )
    )
    if finished:
        (folder / compact.STUDY_RECORD).write_text(
            json.dumps(
                {
                    "job": [f"model={model}", f"seed={seed}"],
                    "test": {"test/bpb": base - 0.0625},
                    "wall_s": 6.0,
                    "threads": 1,
                    "finished": "2026-11-26T15:00:00+0000",
                }
            )
        )


def write_references(path: Path, runs, values) -> Path:
    """``path`` (a references.csv) with a row per model row of ``runs`` (linrope.analysis.evidence.needed_keys: the
    test's windows, then each extrapolation row's); ``values``: {model: bpb, or a function of the row's key}."""
    from linrope.analysis.evidence import needed_keys
    from linrope.evaluation.references import COLUMNS

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for key in needed_keys({"": list(runs)}):
            for model, value in values.items():
                bpb = value(key) if callable(value) else value
                protocol, length, stride, window = key
                w.writerow(dict(model=model, split="test", protocol=protocol, length=length, stride=stride,
                                window=window or "", document="", bytes=1000, nats=bpb * 1000 * math.log(2),
                                bpb=bpb))  # fmt: skip
    return path
