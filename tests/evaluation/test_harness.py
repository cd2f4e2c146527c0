"""The lm-evaluation-harness adapter (linrope.evaluation.harness): each of the harness's three requests against the
model's own log-probabilities computed by hand, and local tasks of each kind scored end to end through
``lm_eval.simple_evaluate`` (nothing downloaded: the tasks' data are JSON lines under tmp_path)."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
import torch.nn.functional as F

from linrope.evaluation.harness import HarnessLM
from linrope.models.model import TransformerLM


def model(kind="linear", max_len=32):
    torch.manual_seed(0)
    return TransformerLM(
        dict(
            d_model=32,
            n_heads=2,
            n_layers=1,
            d_ff=64,
            max_len=max_len,
            attention={"kind": kind},
            position={"name": "rope"},
        )  # fmt: skip
    ).double()


def req(*args):
    return types.SimpleNamespace(args=args)


def logprobs(m, ids):
    """log p(ids[t] | ids[:t]) for t ≥ 1, by hand."""
    x = torch.tensor(ids).unsqueeze(0)
    return F.log_softmax(m(x[:, :-1])[0].double(), -1).gather(-1, x[0, 1:, None])[:, 0]


@pytest.mark.parametrize("kind", ["linear", "softmax"])
def test_loglikelihood_is_the_continuation_log_probability(kind):
    m = model(kind)
    lm = HarnessLM(m)
    (lp, greedy), (lp2, _) = lm.loglikelihood([req("def f(x):", " return x"), req("", "ab")])
    ids = list(b"def f(x): return x")
    assert math.isclose(lp, logprobs(m, ids)[-len(" return x") :].sum().item(), rel_tol=1e-9)
    assert isinstance(greedy, bool)
    assert math.isclose(lp2, logprobs(m, list(b"\nab"))[-2:].sum().item(), rel_tol=1e-9)  # empty context: prefix
    # a trailing space of the context belongs to the continuation (as the harness's Hugging Face model splits it)
    (moved, _), (plain, _) = lm.loglikelihood([req("x = ", "1"), req("x =", " 1")])
    assert moved == plain


def test_greedy_says_whether_the_argmax_writes_the_continuation():
    m = model()
    lm = HarnessLM(m)
    ctx = list(b"abc")
    logits = m(torch.tensor(ctx).unsqueeze(0))[0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    (_, yes), (_, no) = lm.loglikelihood([req("abc", chr(best)), req("abc", chr(worst))])
    assert yes and not no


def test_loglikelihood_rolling_scores_every_token_once_in_windows():
    m = model(max_len=16)
    lm = HarnessLM(m)
    text = "def add(a, b):\n    return a + b\n"  # 33 bytes: three windows of at most 16 tokens
    (total,) = lm.loglikelihood_rolling([req(text)])
    ids = list(text.encode())
    expected, done = 0.0, 0
    while done < len(ids):  # every window's input is the 16 tokens before its last prediction
        end = min(done + 16, len(ids))
        full = [10] + ids[:end]
        window = full[max(0, len(full) - 17) :]
        expected += logprobs(m, window)[-(end - done) :].sum().item()
        done = end
    assert math.isclose(total, expected, rel_tol=1e-9)
    short = lm.loglikelihood_rolling([req("ab")])[0]
    assert math.isclose(short, logprobs(m, [10, 97, 98]).sum().item(), rel_tol=1e-9)


@pytest.mark.parametrize("kind", ["linear", "softmax"])
def test_generate_until_is_greedy_and_stops_at_the_first_stop_string(kind):
    m = model(kind)
    lm = HarnessLM(m)
    ids = list(b"x = 1\n")
    greedy = []
    for _ in range(12):  # greedy decoding by hand
        nxt = int(m(torch.tensor(ids + greedy).unsqueeze(0))[0, -1].argmax())
        greedy.append(nxt)
    text = bytes(greedy).decode("utf-8", errors="replace")
    (out,) = lm.generate_until([req("x = 1\n", {"until": [], "max_gen_toks": 12})])
    assert out == text
    stop = text[3:5]
    (cut,) = lm.generate_until([req("x = 1\n", {"until": [stop], "max_gen_toks": 12})])
    assert cut == text.split(stop)[0]


def write_tasks(folder):
    data = folder / "data"
    data.mkdir()
    (data / "mc.jsonl").write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"question": "def f(x):\n    return", "choices": [" x", " )))"], "answer": 0},
                {"question": "import", "choices": [" os", " 1+"], "answer": 0},
            ]
        )
        + "\n"  # fmt: skip
    )
    (data / "text.jsonl").write_text(json.dumps({"text": "class A:\n    pass\n"}) + "\n")
    (data / "gen.jsonl").write_text(json.dumps({"prompt": "x = 1\ny =", "target": " 2"}) + "\n")
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {data / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n    higher_is_better: true\n"
    )
    (folder / "tiny_ppl.yaml").write_text(
        f"task: tiny_ppl\n{common}dataset_kwargs:\n  data_files:\n    test: {data / 'text.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte\n    higher_is_better: false\n"
    )
    (folder / "tiny_gen.yaml").write_text(
        f"task: tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {data / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n    higher_is_better: true\n"
    )


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_local_tasks_of_each_kind_score_end_to_end(tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tasks(tmp_path)
    m = model()
    lm = HarnessLM(m)
    out = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc", "tiny_ppl", "tiny_gen"],
                                  task_manager=TaskManager(include_path=str(tmp_path)), log_samples=False)  # fmt: skip
    res = out["results"]
    # multiple choice: acc is the share of questions whose answer has the highest log-likelihood, by hand
    hand = []
    for q, choices, answer in [("def f(x):\n    return", [" x", " )))"], 0), ("import", [" os", " 1+"], 0)]:
        scores = [logprobs(m, list((q + c).encode()))[-len(c) :].sum().item() for c in choices]
        hand.append(float(max(range(len(scores)), key=scores.__getitem__) == answer))
    assert res["tiny_mc"]["acc,none"] == sum(hand) / len(hand)
    # bits per byte of the text: -(its rolling log-likelihood) / (ln 2 · its bytes)
    text = "class A:\n    pass\n"
    nll = -logprobs(m, [10] + list(text.encode())).sum().item()
    assert math.isclose(res["tiny_ppl"]["bits_per_byte,none"], nll / (math.log(2) * len(text.encode())), rel_tol=1e-6)
    assert res["tiny_gen"]["exact_match,none"] in (0.0, 1.0)


@pytest.mark.slow  # lm-eval's import and a subprocess: the slow stage
def test_the_task_example_in_the_docs_runs_as_its_comment_says(tmp_path):
    """docs/examples/my_tasks/ (docs/usage.md, "Research scale"): the command its comment gives scores both tasks on a
    checkpoint, from the checkout's root, with no warning from lm-eval about a metric it cannot aggregate."""
    import os
    import subprocess
    import sys

    from linrope.training.lit import LanguageModel
    from tests.helpers import ROOT

    torch.manual_seed(0)
    module = LanguageModel(model=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=64,
                                      attention={"kind": "linear"}, position={"name": "rope"}))  # fmt: skip
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 0,
                "hyper_parameters": {"model": dict(module.hparams["model"]), "optim": None}}, ckpt)  # fmt: skip
    comment = (ROOT / "docs" / "examples" / "my_tasks" / "python_next.yaml").read_text()
    command = " ".join(line.lstrip("#").strip().rstrip("\\") for line in comment.splitlines()[2:4]).split()
    assert command[:3] == ["python", "-m", "linrope.evaluation.harness"], command
    command = [sys.executable, *command[1:]]
    command[command.index("--ckpt") + 1] = str(ckpt)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout)
    assert 0.0 <= results["python_next"]["acc,none"] <= 1.0 and results["python_bpb"]["bits_per_byte,none"] > 0
    assert "aggregation is not" not in r.stderr


@pytest.mark.slow  # lm-eval's task index: the slow stage
def test_an_unknown_task_and_an_out_without_a_folder_are_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """An unknown task name was a KeyError traceback after the model loaded; an --out in a folder that does not
    exist a FileNotFoundError after the whole evaluation.  Both are one line now, before either."""
    from linrope.evaluation import harness

    def no_model(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(harness, "load_model", no_model)
    assert harness.main(["--ckpt", "x.ckpt", "--tasks", "no_such_task_xyz", "--include-path", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "linrope.harness: no harness task named no_such_task_xyz; lm_eval --tasks list lists them"
    )
    assert harness.main(["--ckpt", "x.ckpt", "--tasks", "a", "--out", str(tmp_path / "no" / "r.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"linrope.harness: --out {tmp_path / 'no' / 'r.json'}: no folder {tmp_path / 'no'} to write it in"
    )
