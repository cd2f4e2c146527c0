"""A data=text run under a subword tokenizer (a byte-level BPE trained here): train.py trains, validates and tests
it in loss per token and bits per byte, and the next run reuses its shards; its length-extrapolation table in both
(the 1× row is the test, the same tokens at every length), the report's tables in both, and the pass-key probe and
the harness adapter reading the run's own tokenizer.  (The bytes tokenizer's run: tests/data/test_text.py.)"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers")

CONTEXT = 32


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """One tiny linear_rope run on .jsonl documents with a 300-token BPE, tested and extrapolated to 1/2/4×."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from linrope.data.tokenize_command import main as tokenize
    from tests.data.helpers import write_docs
    from tests.helpers import CONF, run_main

    root = tmp_path_factory.mktemp("textrun")
    write_docs(root / "docs", files=4, per_file=40)
    assert (
        tokenize(["train", "--input", str(root / "docs"), "--vocab-size", "300", "--out", str(root / "tok.json")]) == 0
    )
    overrides = ["model=linear_rope", "size=tiny", "data=text", f"data.path={root / 'docs'}",
                 f"data.tokenizer={root / 'tok.json'}", f"data.shards_dir={root / 'cache'}", "data.progress=false",
                 f"context={CONTEXT}", "data.batch_size=4", "data.eval_batch_size=8", "data.val_windows=4",
                 "trainer.max_steps=3", "trainer.val_check_interval=3", "logger=csv",
                 "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "extrapolation.enabled=true", "extrapolation.factors=[1,2,4]",
                 "extrapolation.scalings=[pi]", "extrapolation.position_bucket=1", f"hydra.run.dir={root / 'sweep' / 'run'}",
                 f"paths.output_dir={root / 'sweep' / 'run'}"]  # fmt: skip
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=False)
    GlobalHydra.instance().clear()
    run = Path(cfg.paths.output_dir)
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml", resolve=True)  # as Hydra saves it: the report reads it
    assert run_main(cfg) is not None
    metrics = {k: float(v) for f in run.rglob("metrics.csv") for r in csv.DictReader(open(f))
               for k, v in r.items() if v not in ("", None)}  # fmt: skip
    return {"root": root, "run": run, "metrics": metrics, "ckpt": run / "checkpoints" / "last.ckpt", "cfg": cfg}


def test_train_py_logs_loss_per_token_and_bits_per_byte_and_the_next_run_reuses_the_shards(text_run):
    from linrope.data.shards import Shards
    from linrope.training.builders import build_datamodule
    from tests.data.helpers import files_state

    m = text_run["metrics"]
    assert {"val/loss", "val/bpb", "test/loss", "test/bpb", "test/tokens", "test/bytes"} <= set(m)
    cache = text_run["root"] / "cache"
    shards = Shards(next(cache.iterdir()))
    assert m["test/tokens"] == shards.length("test") - len(shards.doc_tokens["test"])  # every target but EODs'
    assert m["test/bytes"] > 2 * m["test/tokens"]  # subword tokens: bits per byte are not the loss over ln 2
    assert math.isclose(m["test/bpb"] * math.log(2) * m["test/bytes"], m["test/loss"] * m["test/tokens"], rel_tol=1e-12)
    before = files_state(shards.folder)
    assert build_datamodule(text_run["cfg"]).folder == shards.folder  # the next run's data: the same shards
    assert files_state(shards.folder) == before and len(list(cache.iterdir())) == 1


def test_the_extrapolation_table_gives_loss_per_token_and_bits_per_byte_of_the_same_tokens(text_run):
    from linrope.evaluation.tables import read_csv, read_details

    run, m = text_run["run"], text_run["metrics"]
    rows = read_csv(run / "extrapolation.csv")
    assert {r["length"] for r in rows} == {CONTEXT, 2 * CONTEXT, 4 * CONTEXT}
    assert all(r["status"] == "ok" and r["protocol"] == "windows" for r in rows)
    # every row scores the same tokens of the test split: the test's own
    assert len({r["scored_hash"] for r in rows}) == 1
    assert {r["scored"] for r in rows} == {int(m["test/tokens"])} and {r["bytes"] for r in rows} == {
        int(m["test/bytes"])
    }
    for r in rows:
        assert math.isclose(r["bpb"] * math.log(2) * r["bytes"], r["loss"] * r["scored"], rel_tol=1e-9)
    plain = next(r for r in rows if r["length"] == CONTEXT and r["scaling"] == "none" and not r["window"])
    assert math.isclose(plain["loss"], m["test/loss"], rel_tol=1e-5)  # 1×: exactly the test's windows
    assert math.isclose(plain["bpb"], m["test/bpb"], rel_tol=1e-5)
    assert plain["documents"] == int(m["test/documents"])
    # the context-limited control beyond 1×; the pi row at 2× and 4×
    assert {r["length"] for r in rows if r["window"] == CONTEXT} == {2 * CONTEXT, 4 * CONTEXT}
    assert {r["length"] for r in rows if r["scaling"] == "pi"} == {CONTEXT, 2 * CONTEXT, 4 * CONTEXT}
    # per document and per position (in its document): the row's tokens, bytes and nats, split without loss
    for which in ("documents", "positions"):
        details = read_details(run / f"extrapolation_{which}.csv")
        for r in rows:
            mine = [
                d
                for d in details
                if (d["length"], d["scaling"], d["window"]) == (r["length"], r["scaling"], r["window"])
            ]
            assert sum(d["tokens"] for d in mine) == r["scored"] and sum(d["bytes"] for d in mine) == r["bytes"]
            assert math.isclose(sum(d["nats"] for d in mine), r["loss"] * r["scored"], rel_tol=1e-6)  # float32 sums
    positions = read_details(run / "extrapolation_positions.csv")
    for length in (CONTEXT, 4 * CONTEXT):  # positions count from each document's start, not the window's
        mine = [d for d in positions if d["length"] == length and d["scaling"] == "none" and not d["window"]]
        windows = -(-(m["test/tokens"] + 6) // length)  # at most ceil(targets / length) windows score a target
        assert next(d["tokens"] for d in mine if d["start"] == 0) > windows
    assert max(d["end"] for d in mine) > CONTEXT  # documents longer than the context reach unseen positions


def test_document_positions_count_from_each_documents_start():
    from linrope.evaluation.extrapolation import document_positions

    docs = torch.tensor([[3, 3, 4, 4, 4, 5], [7, 7, 7, 7, 7, 7]])
    assert document_positions(docs).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


def test_the_report_tables_text_in_bits_per_byte_and_loss_per_token(text_run, tmp_path):
    from linrope.analysis.report import build_report

    text = build_report([text_run["run"].parent], tmp_path)
    assert "## Task: text" in text and "test/loss (per token)" in text and "best val/bpb (selection metric)" in text
    assert "## Length extrapolation: text" in text
    assert "Bits per byte at each evaluation length" in text and "Loss per token (nats) at each" in text
    loss = f"{text_run['metrics']['test/loss']:.3f}"
    assert loss in text and f"{text_run['metrics']['test/bpb']:.3f}" in text


def test_the_passkey_probe_reads_the_runs_tokenizer(text_run, tmp_path):
    from linrope.data.tokenizer import load_tokenizer
    from linrope.evaluation.passkey import build_prompt, checkpoint_tokenizer, probe
    from linrope.run.checkpoint import load_checkpoint
    from tests.evaluation.helpers import compose_passkey

    ckpt = text_run["ckpt"]
    tok = checkpoint_tokenizer(load_checkpoint(str(ckpt)), 300, "passkey")
    assert tok.vocab_size == 300 and tok.digest == load_tokenizer(str(text_run["root"] / "tok.json")).digest
    prompt = build_prompt(tok, 400, 0.5, "40417")
    assert max(prompt.ids) >= 256 and tok.decode(prompt.ids).endswith("The pass key is 40417")  # merges in use
    rows = probe(compose_passkey(f"ckpt={ckpt}", "factors=[8,16]", "depths=[0,1]", "trials=2", f"out={tmp_path}"))
    control = [r for r in rows if r["arm"].startswith("control")]
    assert len(control) == 4 and all(r["exact"] == 1.0 for r in control)  # answerable by copying, in BPE tokens
    assert all(r["length"] in (8 * CONTEXT, 16 * CONTEXT) for r in rows)
    from linrope.base.errors import CorpusError

    with pytest.raises(CorpusError, match="no such file"):
        probe(compose_passkey(f"ckpt={ckpt}", "tokenizer=/nowhere/tok.json", f"out={tmp_path / 'b'}"))


def test_the_harness_scores_continuations_in_the_runs_tokens(text_run):
    pytest.importorskip("lm_eval")
    from linrope.evaluation.harness import HarnessLM
    from linrope.evaluation.passkey import checkpoint_tokenizer
    from linrope.run.checkpoint import load_checkpoint
    from linrope.training.lit import LanguageModel

    ckpt = str(text_run["ckpt"])
    model = LanguageModel.from_checkpoint(ckpt, map_location="cpu").model.double()
    tok = checkpoint_tokenizer(load_checkpoint(ckpt), model.cfg.vocab_size, "harness")
    lm = HarnessLM(model, tok)
    assert lm.prefix_ids == [tok.eod]  # a document follows an end-of-document token

    class Req:
        def __init__(self, *args):
            self.args = args

    context, continuation = "the cat sat on", " a mat"
    ((got, _),) = lm.loglikelihood([Req(context, continuation)])
    ids = tok.encode(context + continuation)
    n = len(ids) - len(tok.encode(context))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0], -1)
    want = sum(logp[i - 1, ids[i]].item() for i in range(len(ids) - n, len(ids)))
    assert n >= 1 and math.isclose(got, want, rel_tol=1e-9)
    (rolling,) = lm.loglikelihood_rolling([Req(context)])
    ids = [tok.eod] + tok.encode(context)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0], -1)
    assert math.isclose(rolling, sum(logp[i - 1, ids[i]].item() for i in range(1, len(ids))), rel_tol=1e-9)


def test_generate_reads_the_runs_tokenizer(text_run, capsys):
    """Issue 52, case 3: ``python -m linrope generate`` on a data=text BPE checkpoint encoded the prompt as bytes and
    failed mid-stream (``bytes must be in range(0, 256)``); it encodes and decodes with the run's own tokenizer."""
    from linrope.data.tokenizer import load_tokenizer
    from linrope.evaluation.generate import generate
    from linrope.training.lit import LanguageModel
    from tests.evaluation.helpers import compose_generate

    ckpt = text_run["ckpt"]
    pieces = []
    cfg = compose_generate(f"ckpt={ckpt}", "prompt='the cat sat on'", "max_new_tokens=40", "temperature=1.0",
                           "top_k=null", "device=cpu")  # fmt: skip
    text = generate(cfg, write=pieces.append)
    tok = load_tokenizer(str(text_run["root"] / "tok.json"))
    model = LanguageModel.from_checkpoint(str(ckpt), map_location="cpu").model
    g = torch.Generator().manual_seed(0)
    ids = tok.encode("the cat sat on")
    sampled = [int(t[0, 0]) for t in model.stream(torch.tensor([ids]), 40, temperature=1.0, top_k=None, generator=g)]
    assert max(sampled) >= 256  # merges sampled: what bytes could not decode
    assert text == tok.decode(ids + sampled) == "".join(pieces)


def test_the_harness_keeps_the_prompt_and_leaves_room_to_generate():
    """Issue 52, case 4: ``generate_until`` cut the context to max(max_len − max_gen_toks, 1) tokens: with the default
    256 generated tokens and a context of 256 the model saw only the prompt's last token.  The prompt is now cut from
    the left to leave room for generation but keep half the context at least, and the cut is said."""
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from linrope.evaluation.harness import HarnessLM
    from linrope.evaluation.passkey import ByteTokenizer

    seen = []

    class Model(torch.nn.Module):  # size=small's context; records the prompt it is given, then ends the document
        cfg = SimpleNamespace(max_len=256, vocab_size=256)

        def stream(self, prompt, max_new_tokens, **kwargs):
            seen.append((prompt[0].tolist(), max_new_tokens))
            yield torch.tensor([[ord("\n")]])

    class Req:
        def __init__(self, *args):
            self.args = args

    context = "".join(f"line {i}: the cat sat on a mat\n" for i in range(40))  # about 1 100 bytes
    lm = HarnessLM(Model(), ByteTokenizer())
    with pytest.warns(UserWarning, match=r"harness: 1 prompt of generate_until cut from the left to its last 128"):
        lm.generate_until([Req(context, {"until": ["\n"]})])  # max_gen_toks: 256 by default
    assert seen == [(list(context.encode())[-128:], 256)]
    seen.clear()
    lm.generate_until([Req(context[-60:], {"until": ["\n"], "max_gen_toks": 32})])  # fits: kept whole
    assert seen == [(list(context[-60:].encode()), 32)]


def test_passkey_checks_its_output_folder_before_the_probe(text_run, tmp_path, monkeypatch):
    """Issue 52, case 9: ``passkey … out=<a path it cannot write>`` ran the whole probe, then a traceback; nothing
    was written.  The folder is checked before the checkpoint is read."""
    import linrope.evaluation.passkey as P
    from linrope.base.errors import LinropeError
    from tests.evaluation.helpers import compose_passkey

    scored = []
    monkeypatch.setattr(P, "passkey_table", lambda *a, **k: scored.append(a) or [])
    (tmp_path / "afile").write_text("not a folder\n")
    bad = tmp_path / "afile" / "probe"
    with pytest.raises(LinropeError, match=f"^out={bad}: cannot write into {bad} \\(not a folder\\)$"):
        P.probe(compose_passkey(f"ckpt={text_run['ckpt']}", "factors=[8]", "depths=[0]", "trials=1", f"out={bad}"))
    assert scored == []  # refused before any prompt was scored
