"""data=text: a BPE trained and shards written from a folder of .jsonl documents (manifest, reuse, resume), windows
packed across documents with their ids, bits per byte across tokenizers, bad input in one line, and train.py on it."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil

import pytest
import torch

from linrope.base.errors import CorpusError
from linrope.data.bytes import SPLITS, split_of
from linrope.data.shards import Shards, build_shards
from linrope.data.sources import Source, resolve_source
from linrope.data.tasks import IGNORE
from linrope.data.tokenize_command import main as tokenize
from linrope.data.tokenizer import load_tokenizer
from tests.data.helpers import files_state, write_docs

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A folder of .jsonl documents and a byte-level BPE of 300 tokens trained on it (by the command)."""
    root = tmp_path_factory.mktemp("text")
    texts = write_docs(root / "docs")
    assert (
        tokenize(["train", "--input", str(root / "docs"), "--vocab-size", "300", "--out", str(root / "tok.json")]) == 0
    )
    return root, texts


def test_tokenize_commands_write_a_bpe_and_shards_with_their_manifest(corpus, capsys):
    root, texts = corpus
    tok = load_tokenizer(str(root / "tok.json"))
    assert tok.vocab_size == 300 and tok.decode([tok.eod]) == "<|endoftext|>"
    out = root / "shards"
    assert tokenize(["shards", "--input", str(root / "docs"), "--tokenizer", str(root / "tok.json"),
                     "--out", str(out), "--shard-documents", "50"]) == 0  # fmt: skip
    m = json.loads((out / "manifest.json").read_text())
    assert m["documents"] == len(texts) == 240 and len(m["shards"]) == 5
    assert m["bytes"] == sum(len(t.encode()) for _, t in texts)
    assert m["settings"]["tokenizer"] == {"name": str(root / "tok.json"), "vocab_size": 300, "eod": tok.eod,
                                          "dtype": "uint16", "sha256": tok.digest}  # fmt: skip
    assert tok.digest == hashlib.sha256((root / "tok.json").read_bytes()).hexdigest()[:16]
    files = {f["path"]: f for f in m["source"]["files"]}
    assert files["part2.jsonl"]["sha256"] == hashlib.sha256((root / "docs/part2.jsonl").read_bytes()).hexdigest()
    for s in SPLITS:  # split by each document's identity; tokens = its tokens + one EOD each
        mine = [t for ident, t in texts if split_of(ident, 0.05, 0.05) == s]
        assert m["splits"][s]["documents"] == len(mine) > 0
        assert m["splits"][s]["tokens"] == sum(len(tok.encode_batch([t])[0]) + 1 for t in mine)
    assert m["tokens"] * 2 == sum(p.stat().st_size for p in out.glob("*.bin"))  # uint16
    assert m["bytes_mismatch_documents"] == 0  # each token's bytes add up to its document's
    assert "240 documents" in capsys.readouterr().out


def test_a_second_build_reuses_the_shards_and_a_stopped_one_resumes(corpus, tmp_path):
    root, _ = corpus
    tok = load_tokenizer(str(root / "tok.json"))
    source = resolve_source(str(root / "docs"))
    first = build_shards(source, tok, cache_dir=tmp_path / "cache", shard_documents=40, progress=False)
    assert first.parent == tmp_path / "cache"
    before = files_state(first)
    assert build_shards(source, tok, cache_dir=tmp_path / "cache", shard_documents=40, progress=False) == first
    assert files_state(first) == before  # nothing rewritten (mtimes and contents)
    other = build_shards(
        source, load_tokenizer("bytes"), cache_dir=tmp_path / "cache", shard_documents=40, progress=False
    )
    assert other != first  # another tokenizer: another key

    class Stops(Source):  # a build killed while reading document 130: shards 0–2 finished, shard 3 partial
        def documents(self):
            for i, d in enumerate(super().documents()):
                if i == 130:
                    raise KeyboardInterrupt
                yield d

    out = tmp_path / "resumed"
    stopping = Stops(source.root, source.files, source.field)
    with pytest.raises(KeyboardInterrupt):
        build_shards(stopping, tok, out=out, shard_documents=40, progress=False)
    assert not (out / "manifest.json").exists() and (out / "00002.docs.npy").exists()
    (out / "00003.train.bin").write_bytes(b"\0" * 6)  # a shard half-written when the run stopped
    for split in ("docs.npy", "train.bin", "val.bin", "test.bin"):  # shard 2's files are another shard's: sizes
        shutil.copy(out / f"00001.{split}", out / f"00002.{split}")  # agree with its index, documents do not
    kept = {k: v for k, v in files_state(out).items() if k[:5] in ("00000", "00001")}
    build_shards(source, tok, out=out, shard_documents=40, progress=False)
    now = files_state(out)
    assert all(now[k] == v for k, v in kept.items())  # finished shards kept
    assert {k: v[1] for k, v in now.items()} == {k: v[1] for k, v in files_state(first).items()}


def test_windows_pack_documents_with_their_ids_and_never_score_across_a_boundary(corpus, tmp_path):
    root, texts = corpus
    tok = load_tokenizer(str(root / "tok.json"))
    shards = Shards(build_shards(resolve_source(str(root / "docs")), tok, out=tmp_path / "s", progress=False))
    from linrope.data.text import EvalWindows, TrainWindows

    x, y, d = TrainWindows(shards, 64, seed=1, length=8)[3]
    assert x.shape == y.shape == d.shape == (64,) and d.dtype == torch.int64
    assert bool((d[1:] >= d[:-1]).all())
    ends = x == tok.eod  # EOD ends its document: its target, the next document's first token, is not scored
    assert bool((y[ends] == IGNORE).all()) and bool((y[~ends] != IGNORE).all())
    changes = torch.nonzero(d[1:] != d[:-1]).flatten()
    assert len(changes) > 0 and bool((x[changes] == tok.eod).all())
    test = EvalWindows(shards, "test", 32)  # the whole split: every target once but each document's first
    scored = torch.cat([test[k][1] for k in range(len(test))]) != IGNORE
    assert int(scored.sum()) == shards.length("test") - len(shards.doc_tokens["test"])
    assert [t for t in torch.cat([test[k][1] for k in range(len(test))]).tolist() if t != IGNORE][-1] == tok.eod


def test_bits_per_byte_is_the_nats_of_the_scored_tokens_over_their_decoded_bytes(corpus):
    from linrope.training.lit import LN2, text_sums

    root, texts = corpus
    tok = load_tokenizer(str(root / "tok.json"))
    doc = tok.encode_batch([texts[0][1]])[0] + [tok.eod]
    targets = torch.tensor(doc[1:] + [7])
    targets[-1] = IGNORE  # a crossing target
    logits = torch.randn(len(targets), tok.vocab_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    nats, tokens, nbytes = text_sums(logits, targets, torch.from_numpy(tok.token_bytes()))
    by_hand = sum(-torch.log_softmax(logits[i], -1)[t].item() for i, t in enumerate(doc[1:]))
    text = tok.decode(doc[1:-1])  # the scored text: all but the first token, then EOD (one byte)
    assert text == texts[0][1][len(tok.decode(doc[:1])) :]
    assert int(tokens) == len(doc) - 1 and int(nbytes) == len(text.encode()) + 1
    assert math.isclose(float(nats) / (LN2 * float(nbytes)), by_hand / (LN2 * (len(text.encode()) + 1)), rel_tol=1e-12)
    assert int(nbytes) < int(tokens) * 4 and int(nbytes) > int(tokens)  # a BPE token covers several bytes here


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda r: resolve_source(str(r / "empty")), "no files ending in"),
        (lambda r: list(resolve_source(str(r / "docs"), field="body").documents()), "no field 'body'"),
        (lambda r: load_tokenizer(str(r / "nope.json")), "no such file"),
        (lambda r: load_tokenizer("-not-a-tokenizer-"), "unknown tokenizer"),
    ],
)
def test_bad_input_is_one_line(corpus, make, match):
    root, _ = corpus
    (root / "empty").mkdir(exist_ok=True)
    with pytest.raises(CorpusError, match=match) as e:
        make(root)
    assert "\n" not in str(e.value)


def test_a_vocabulary_larger_than_the_models_is_refused_in_one_line(corpus):
    from linrope.data.text import TextDataModule

    root, _ = corpus
    data = {"tokenizer": str(root / "tok.json"), "vocab_size": 256}
    with pytest.raises(CorpusError, match=r"data.vocab_size=256 is smaller than .* \(300 tokens\); leave it null"):
        TextDataModule.model_overrides_for(data)
    assert TextDataModule.model_overrides_for({"tokenizer": "bytes"}) == {"vocab_size": 257}
    assert TextDataModule.model_overrides_for({**data, "vocab_size": 320}) == {"vocab_size": 320}


def metrics(folder):
    rows = [r for f in folder.rglob("metrics.csv") for r in csv.DictReader(open(f))]
    return {k: float(v) for r in rows for k, v in r.items() if v not in ("", None)}


def test_train_py_trains_validates_and_tests_on_text_in_bytes(corpus, compose, tmp_path):
    """The bytes tokenizer (a BPE's run, with its extrapolation and evaluation: tests/evaluation/test_text_evaluation.py)."""
    from tests.helpers import run_main

    root, _ = corpus
    cfg = compose("model=linear_rope", "size=tiny", "data=text", f"data.path={root / 'docs'}",
                  "data.tokenizer=bytes", f"data.shards_dir={tmp_path / 'cache'}", "data.progress=false",
                  "context=32", "data.batch_size=4", "data.eval_batch_size=8", "data.val_windows=4",
                  "trainer.max_steps=3", "trainer.val_check_interval=3", "logger=csv",
                  "trainer.enable_progress_bar=false")  # fmt: skip
    assert run_main(cfg) is not None
    m = metrics(tmp_path)
    assert {"val/loss", "val/bpb", "test/loss", "test/bpb", "test/tokens", "test/bytes"} <= set(m)
    shards = Shards(next((tmp_path / "cache").iterdir()))
    assert m["test/tokens"] == shards.length("test") - len(shards.doc_tokens["test"])
    assert m["test/bytes"] == m["test/tokens"]  # every target one byte: bits per byte are the loss over ln 2
    assert math.isclose(m["test/bpb"], m["test/loss"] / math.log(2), rel_tol=1e-12)
    before = files_state(shards.folder)
    from linrope.training.builders import build_datamodule

    assert build_datamodule(cfg).folder == shards.folder  # the next run's data: the same shards, untouched
    assert files_state(shards.folder) == before and len(list((tmp_path / "cache").iterdir())) == 1


def test_parquet_rows_and_text_files_are_documents(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "c").mkdir()
    pq.write_table(pa.table({"body": ["first row", None, "third row"], "n": [1, 2, 3]}), tmp_path / "c/a.parquet")
    (tmp_path / "c/b.txt").write_text("a whole file\nis one document\n")
    docs = list(resolve_source(str(tmp_path / "c"), field="body").documents())
    assert docs == [("a.parquet:0", b"first row"), ("a.parquet:2", b"third row"),
                    ("b.txt", b"a whole file\nis one document\n")]  # fmt: skip
    with pytest.raises(CorpusError, match=r"a.parquet: no column 'text' \(it has body, n\)"):
        list(resolve_source(str(tmp_path / "c/a.parquet")).documents())
    glob = resolve_source(str(tmp_path / "c" / "*.txt"))
    assert [d[0] for d in glob.documents()] == ["b.txt"]


@pytest.mark.parametrize(
    "override, match",
    [
        ("data.tokenizer=/nowhere/tok.json", "data.tokenizer=/nowhere/tok.json: no such file"),
        ("data.vocab_size=100", "data.vocab_size=100 is smaller than the vocabulary of data.tokenizer=bytes"),
        ("data.path=/nowhere/*.jsonl", "data.path /nowhere/\\*.jsonl: the pattern matches no file"),
    ],
)
def test_train_py_refuses_bad_text_data_before_reading_it(compose, override, match):
    from linrope.base.errors import ConfigError
    from linrope.config.checks import validate

    cfg = compose("data=text", "size=tiny", override)
    with pytest.raises(ConfigError, match=f"^{match}") as e:
        validate(cfg, hardware=False)
    assert "\n" not in str(e.value)


def test_the_key_is_the_files_contents_not_where_they_lie(corpus, tmp_path):
    import shutil

    root, _ = corpus
    shutil.copytree(root / "docs", tmp_path / "moved")
    tok = load_tokenizer("bytes")
    a = build_shards(resolve_source(str(root / "docs")), tok, cache_dir=tmp_path / "c", progress=False)
    assert build_shards(resolve_source(str(tmp_path / "moved")), tok, cache_dir=tmp_path / "c", progress=False) == a
    with open(tmp_path / "moved/part1.jsonl", "a") as h:
        h.write(json.dumps({"text": "one more document"}) + "\n")
    assert build_shards(resolve_source(str(tmp_path / "moved")), tok, cache_dir=tmp_path / "c", progress=False) != a
