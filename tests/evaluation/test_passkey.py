"""The pass-key probe (linrope.evaluation.passkey): its prompts, its scoring against hand-made models, its positive
control retrieving every key, and the command on a real checkpoint."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
import torch

from linrope.evaluation.passkey import (
    INTRO,
    NEEDLE,
    QUESTION,
    ByteTokenizer,
    InductionOracle,
    build_prompt,
    passkey_table,
    random_key,
    score_prompt,
)
from tests.evaluation.helpers import compose_passkey

TOK = ByteTokenizer()


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_a_prompt_holds_the_needle_at_its_depth_and_ends_with_the_answer(depth):
    p = build_prompt(TOK, 600, depth, "40417")
    assert 600 - 90 <= len(p.ids) <= 600  # filler fills to within one filler line of the length, never beyond
    text = TOK.decode(p.ids)
    assert text.endswith("What is the pass key? The pass key is 40417")
    assert TOK.decode(p.ids[p.answer[0] : p.answer[1]]) == " 40417"
    assert TOK.decode(p.ids[p.needle_at :]).startswith("The pass key is 40417.")
    # the filler before the needle is `depth` of all the filler, to the token
    fixed = sum(len(TOK.encode(t)) for t in (INTRO, NEEDLE.format(key="40417"), "\n" + QUESTION, " 40417"))
    assert p.needle_at - len(TOK.encode(INTRO)) == round(depth * (600 - fixed))


def test_bad_prompts_are_one_line():
    with pytest.raises(ValueError, match="depth must be in"):
        build_prompt(TOK, 600, 1.5, "1")
    with pytest.raises(ValueError, match="cannot hold"):
        build_prompt(TOK, 50, 0.5, "12345")


def test_scoring_is_exact_only_when_every_answer_token_is_the_argmax():
    p = build_prompt(TOK, 400, 0.5, "12345")
    start, end = p.answer

    def answering(wrong_at=None):
        def logits_of(ids):
            out = torch.zeros(1, ids.shape[1], 256)
            for i in range(start, end):  # the prediction of token i sits at position i - 1
                token = p.ids[i] if i != wrong_at else (p.ids[i] + 1) % 256
                out[0, i - 1, token] = 5.0
            return out

        return logits_of

    right = score_prompt(answering(), p)
    assert right["exact"] == 1.0 and right["token_acc"] == 1.0
    nll = -torch.log_softmax(torch.tensor([5.0] + [0.0] * 255), 0)[0].item()
    assert math.isclose(right["nll"], nll, rel_tol=1e-6)
    wrong = score_prompt(answering(wrong_at=end - 2), p)
    assert wrong["exact"] == 0.0 and math.isclose(wrong["token_acc"], (end - start - 1) / (end - start), rel_tol=1e-6)
    blank = score_prompt(lambda ids: torch.zeros(1, ids.shape[1], 256), p)
    assert blank["exact"] == 0.0 and math.isclose(blank["nll"], math.log(256), rel_tol=1e-6)


def test_the_positive_control_retrieves_every_key_and_chance_retrieves_none():
    rows = passkey_table(InductionOracle(256), TOK, [300, 1200], [0.0, 0.5, 1.0], trials=3, digits=5, seed=7)
    assert [r["exact"] for r in rows] == [1.0] * 6
    rng = random.Random(0)  # a model that guesses digits at random after "is"
    guess = lambda ids: torch.randn(1, ids.shape[1], 256, generator=torch.Generator().manual_seed(rng.randrange(9**9)))  # noqa: E731
    rows = passkey_table(guess, TOK, [300], [0.5], trials=4, digits=5)
    assert rows[0]["exact"] == 0.0 and rows[0]["token_acc"] < 0.5


def test_the_keys_depend_on_the_seed_and_cell_only():
    seen = {}

    def recording(ids):
        seen.setdefault(len(seen), TOK.decode(ids[0].tolist())[-5:])
        return torch.zeros(1, ids.shape[1], 256)

    passkey_table(recording, TOK, [300], [0.5], trials=2, seed=3)
    first = dict(seen)
    seen.clear()
    passkey_table(recording, TOK, [300], [0.5], trials=2, seed=3)
    assert seen == first and first[0] != first[1]
    assert random_key(random.Random(1), 5).isdigit()
    from linrope.evaluation.passkey import shortest

    assert shortest(TOK, []) == 0  # depths=[] or trials=0: no key, nothing to hold (max() of nothing raised)


def test_passkey_command_on_a_trained_checkpoint(compose, small_corpus, tmp_path, capsys, monkeypatch):
    import train
    from linrope.base.errors import ConfigError
    from linrope.evaluation import passkey
    from linrope.evaluation.passkey import probe
    from tests.helpers import tiny

    # model.max_len above the context (as a learned table raised for a longer eval_context): the lengths are factors
    # of the training context all the same (they were of max_len: every length doubled, and labelled so)
    cfg = compose(*tiny("model=linear_rope", f"data.path={small_corpus}", "data.val_windows=2"), "trainer.max_steps=2",
                  "trainer.val_check_interval=2", "test=false", "model.max_len=128")  # fmt: skip
    train.main(cfg)
    ckpt = Path(cfg.paths.output_dir, "checkpoints", "last.ckpt")
    pk = compose_passkey(f"ckpt={ckpt}", "factors=[1,4,8]", "depths=[0,1]", "trials=2")
    rows = probe(pk)
    out = Path(cfg.paths.output_dir, "passkey")
    written = list(csv.DictReader(open(out / "passkey.csv")))
    assert len(written) == len(rows) == 2 * 3 * 2  # the model and the control, 3 lengths × 2 depths
    short = [r for r in written if r["length"] == "64"]  # 1× the tiny context: too short for the prompt
    assert short and all(r["trials"] == "0" and "cannot hold" in r["note"] for r in short)
    written = [r for r in written if r["length"] != "64"]
    assert {r["length"] for r in written} == {"256", "512"}  # 4× and 8× the tiny context of 64
    assert {r["factor"] for r in written} == {"4.0", "8.0"}
    control = [r for r in written if r["arm"].startswith("control")]
    assert all(float(r["exact"]) == 1.0 for r in control)  # the prompts are answerable by copying
    model = [r for r in written if not r["arm"].startswith("control")]
    assert all(0 <= float(r["exact"]) <= 1 and math.isfinite(float(r["nll"])) for r in model)
    assert (out / "passkey.png").stat().st_size > 1000
    with pytest.raises(ConfigError, match="exists"):  # an earlier probe's files are kept
        probe(pk)
    with pytest.raises(ConfigError, match="depths: 2"):
        probe(compose_passkey(f"ckpt={ckpt}", "depths=[2]", f"out={tmp_path / 'x'}"))

    # a tokenizer that splits keys of one length into different numbers of tokens (as a BPE does): a length that holds
    # the fixed text with the key 00000 but not with a key it draws is a skipped row, not a traceback for the probe
    class Uneven(ByteTokenizer):
        def encode(self, text):
            return super().encode(text.replace("7", "77"))

    monkeypatch.setattr(passkey, "checkpoint_tokenizer", lambda *a, **kw: Uneven())
    zero = passkey.shortest(Uneven(), ["00000"])
    keys = lambda n: [k for one in passkey.cell_keys(0, n, [0.0], 2, 5) for k in one]  # noqa: E731 - the probe's
    tight = next(n for n in range(zero, zero + 60) if passkey.shortest(Uneven(), keys(n)) > n)
    rows = probe(compose_passkey(f"ckpt={ckpt}", f"factors=[{tight / 64!r},8]", "depths=[0]", "trials=2",
                                 f"out={tmp_path / 'tight'}"))  # fmt: skip
    short = [r for r in rows if r["length"] == tight]
    assert len(short) == 2 and all(r["trials"] == 0 and "cannot hold" in r["note"] for r in short)
    assert [r["trials"] for r in rows if r["length"] == 512] == [2, 2]
