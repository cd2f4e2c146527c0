"""Issue 52, case 2: a data=text run records its tokenizer and corpus by absolute path and content hash (its
provenance, and so every checkpoint), and whatever reads the checkpoint again — a resume, evaluate, passkey, the
harness, generate — takes that tokenizer, or refuses another in one line naming what differs.  The run here is
started as a user types it: ``data.tokenizer=tok.json data.path=docs`` relative to the folder it was started in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

CONTEXT = 32


def _tokenizer(folder: Path, seed: int) -> Path:
    from linrope.data.tokenize_command import main as tokenize
    from tests.data.helpers import write_docs

    write_docs(folder / f"texts{seed}", files=2, per_file=40, seed=seed)
    out = folder / "tok.json"
    assert tokenize(["train", "--input", str(folder / f"texts{seed}"), "--vocab-size", "300", "--out", str(out),
                     "--no-progress"]) == 0  # fmt: skip
    return out


def _compose(root: Path, *extra: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.helpers import CONF

    overrides = ["model=linear_rope", "size=tiny", "data=text", "data.path=docs", "data.tokenizer=tok.json",
                 "data.progress=false", f"context={CONTEXT}", "data.batch_size=4", "data.eval_batch_size=8",
                 "data.val_windows=2", "trainer.max_steps=2", "trainer.val_check_interval=2", "logger=csv",
                 "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "test=false",
                 f"paths.output_dir={root / 'run'}", *extra]  # fmt: skip
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=False)
    GlobalHydra.instance().clear()
    return cfg


@pytest.fixture(scope="module")
def typed_run(tmp_path_factory):
    """A tiny data=text run started in ``root`` with relative paths; returns the folder and its last.ckpt."""
    from tests.data.helpers import write_docs
    from tests.helpers import run_main

    root = tmp_path_factory.mktemp("typed")
    write_docs(root / "docs", files=4, per_file=40)
    _tokenizer(root, 0)
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    try:
        run_main(_compose(root))
    finally:
        mp.undo()
    return {"root": root, "ckpt": root / "run" / "checkpoints" / "last.ckpt"}


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Another folder, with a tok.json of its own (another BPE of the same size) and a docs/ of its own."""
    from tests.data.helpers import write_docs

    write_docs(tmp_path / "docs", files=4, per_file=40, seed=7)
    _tokenizer(tmp_path, 1)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_checkpoint_records_the_tokenizer_and_corpus_by_path_and_hash(typed_run):
    from linrope.data.tokenizer import load_tokenizer
    from linrope.run.checkpoint import load_checkpoint
    from linrope.run.provenance import PROVENANCE_KEY

    record = load_checkpoint(str(typed_run["ckpt"]))[PROVENANCE_KEY]["data"]
    tok = record["tokenizer"]
    assert tok["path"] == str(typed_run["root"] / "tok.json") and tok["spec"] == "tok.json"
    assert tok["sha256"] == load_tokenizer(str(typed_run["root"] / "tok.json")).digest and tok["vocab_size"] == 300
    corpus = record["corpus"]
    assert corpus["path"] == str(typed_run["root"] / "docs") and (Path(corpus["shards"]) / "manifest.json").is_file()


def test_passkey_harness_and_generate_from_another_folder_read_the_runs_tokenizer(typed_run, elsewhere):
    """Case 2: started from another folder they read that folder's tok.json; they take the run's, by its path."""
    from linrope.data.tokenizer import load_tokenizer
    from linrope.evaluation.passkey import checkpoint_tokenizer
    from linrope.run.checkpoint import load_checkpoint

    ours = load_tokenizer(str(typed_run["root"] / "tok.json"))
    assert load_tokenizer("tok.json").digest != ours.digest  # the other folder's, of the same size
    tok = checkpoint_tokenizer(load_checkpoint(str(typed_run["ckpt"])), 300, "passkey")
    assert tok.digest == ours.digest


def test_another_tokenizer_is_refused_naming_both(typed_run, elsewhere, tmp_path):
    """Case 2: a tokenizer changed under the run's path, or another one named, is refused in one line."""
    from linrope.base.errors import CorpusError
    from linrope.data.tokenizer import load_tokenizer
    from linrope.evaluation.passkey import checkpoint_tokenizer
    from linrope.run.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(str(typed_run["ckpt"]))
    theirs = load_tokenizer(str(elsewhere / "tok.json"))
    with pytest.raises(CorpusError, match=f"^harness: tokenizer tok.json is {elsewhere / 'tok.json'} \\(sha256 "
                       f"{theirs.digest}, 300 tokens\\), not the run's: {typed_run['root'] / 'tok.json'}"):  # fmt: skip
        checkpoint_tokenizer(checkpoint, 300, "harness", "tok.json")
    copy = tmp_path / "copy.json"  # the same tokenizer elsewhere: taken
    shutil.copy(typed_run["root"] / "tok.json", copy)
    assert checkpoint_tokenizer(checkpoint, 300, "generate", str(copy)).digest != theirs.digest


def test_a_resume_with_the_tokenizer_or_corpus_changed_under_the_same_path_is_refused(typed_run, tmp_path,
                                                                                      monkeypatch, capsys):  # fmt: skip
    """Case 2: the tokenizer or corpus changed under the same path, and ``ckpt_path=last`` continued, printing only
    the step change.  The resume is refused in one line naming what differs, before the run folder changes."""
    from tests.data.helpers import write_docs
    from tests.helpers import run_main

    def files_state(folder):
        files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".linrope.lock"]  # the lock: taken
        return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}

    root = tmp_path / "again"
    shutil.copytree(typed_run["root"], root, ignore=shutil.ignore_patterns("data"))
    monkeypatch.chdir(root)
    shutil.copy(_tokenizer(tmp_path, 1), root / "tok.json")  # another BPE of the same size, same path
    before = files_state(root / "run")
    with pytest.raises(SystemExit) as e:
        run_main(_compose(root, "ckpt_path=last", "trainer.max_steps=4"))
    assert str(e.value).startswith(f"linrope: resume: tokenizer tok.json is {root / 'tok.json'} (sha256 ")
    assert f"not the run's: {typed_run['root'] / 'tok.json'}" in str(e.value)
    assert files_state(root / "run") == before

    shutil.copy(typed_run["root"] / "tok.json", root / "tok.json")  # the tokenizer back; a document more
    write_docs(root / "docs", files=5, per_file=40)
    with pytest.raises(SystemExit) as e:
        run_main(_compose(root, "ckpt_path=last", "trainer.max_steps=4"))
    assert str(e.value).startswith(f"linrope: resume: the corpus differs from the run's: data.path {root / 'docs'}")
    assert "part4.jsonl added" in str(e.value)
    assert files_state(root / "run") == before


def test_evaluate_from_another_folder_reads_the_runs_corpus_and_tokenizer(typed_run, elsewhere):
    """Case 2: evaluate started from another folder read that folder's tok.json and docs/."""
    from linrope.evaluation.evaluate import build_data
    from linrope.run.checkpoint import load_checkpoint
    from tests.evaluation.helpers import compose_evaluate

    ckpt = typed_run["ckpt"]
    dm = build_data(compose_evaluate(f"ckpt={ckpt}"), ckpt, load_checkpoint(str(ckpt)), "text")
    from linrope.data.tokenizer import load_tokenizer

    assert dm.tokenizer.digest == load_tokenizer(str(typed_run["root"] / "tok.json")).digest
    assert dm.folder.resolve().parent == (typed_run["root"] / "data" / "shards").resolve()  # the run's shards


def test_tokenize_train_refuses_to_overwrite_a_tokenizer(tmp_path, capsys):
    """Case 2: ``tokenize train --out tok.json`` overwrote an existing tokenizer without a word."""
    from linrope.data.tokenize_command import main as tokenize
    from linrope.data.tokenize_command import parser

    out = _tokenizer(tmp_path, 0)
    before = out.read_bytes()
    argv = ["train", "--input", str(tmp_path / "texts0"), "--vocab-size", "280", "--out", str(out), "--no-progress"]
    assert tokenize(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"linrope: --out {out}: exists (a tokenizer runs may have trained with); pass --force to replace it"
    ]
    assert out.read_bytes() == before
    assert tokenize(argv + ["--force"]) == 0 and out.read_bytes() != before
    assert "--force" in parser()._subparsers._group_actions[0].choices["train"].format_help()
