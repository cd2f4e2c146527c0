"""python -m linrope evaluate: the same scored bytes at every length, like-for-like RoPE rows, a data
module rebuilt without running what a saved file names, and a Hydra command line."""

import csv
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from linrope.data.rebuild import DATA_MODULES, SavedDataError, build_data_module
from linrope.data.tasks import IGNORE
from linrope.evaluation.extrapolation import SlidingWindows, default_stride, length_table
from tests.evaluation.helpers import compose_evaluate
from tests.helpers import CONF, ROOT


def run_cli(program, *args, cwd):
    """``python -m <program> args``: ``program`` a module, or ``linrope <command>``."""
    return subprocess.run(
        [sys.executable, "-m", *program.split(), *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One file of about 3.4 MB of stdlib sources: its test split (the last 5%) holds more than 2^17 bytes."""
    from linrope.data.bytes import stdlib_dir

    out = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    files = sorted(stdlib_dir().glob("*.py"))
    out.write_bytes(b"\n".join(p.read_bytes() for p in files)[:3_400_000])
    assert out.stat().st_size * 0.05 > 2**17 + 1
    return out


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, corpus):
    """A tiny linear_rope run, trained 2 steps on `corpus`: <run>/checkpoints/last.ckpt and <run>/.hydra/."""
    run = tmp_path_factory.mktemp("run")
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "model=linear_rope",
        "size=tiny",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"data.path={corpus}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "data.val_windows=2",
        "data.test_windows=2",
        "data.batch_size=4",
        "test=false",
        f"hydra.run.dir={run}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=run, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "checkpoints" / "last.ckpt").exists()
    return run


# ---- the same bytes at every length ------------------------------------------------------------------------------
@pytest.mark.parametrize("stride", [None, 7])
def test_sliding_windows_score_the_same_byte_set_at_every_length(stride):
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    n = 3001
    sets = {}
    for length in (16, 64, 100, 256, 3001):
        s = stride or default_stride(length)
        ds = SlidingWindows(data, length, s, n, offsets=True)
        offsets, values = [], []
        for k in range(len(ds)):
            x, y, where = ds[k]
            assert x.shape == y.shape == (length,)  # every window is exactly `length` bytes
            scored = y != IGNORE
            assert torch.equal(scored, where >= 0)
            # the input before each scored target is the byte before it in the text
            assert torch.equal(x[scored], torch.from_numpy(data[where[scored].numpy() - 1]).long())
            if k > 0:  # after the first window, a scored byte sees at least length − stride bytes before it
                assert int(torch.nonzero(scored)[0]) >= length - s
            offsets += where[scored].tolist()
            values += y[scored].tolist()
        assert len(offsets) == len(set(offsets)) == n  # each once
        assert values == data[offsets].tolist()  # the bytes of the text at those offsets
        sets[length] = set(offsets)
    assert all(v == set(range(1, n + 1)) for v in sets.values())


def test_sliding_windows_refuse_a_length_beyond_the_scored_text():
    with pytest.raises(ValueError, match="shorter than the length"):
        SlidingWindows(np.zeros(100, np.uint8), 64, 32, 50)


@pytest.mark.slow  # 5 rows of 2^18 tokens through the tiny model
def test_evaluate_scores_the_whole_split_at_every_length_by_default(run_folder, tmp_path, capsys):
    from linrope.data.bytes import load_corpus
    from linrope.evaluation.evaluate import evaluate

    ckpt = run_folder / "checkpoints" / "last.ckpt"
    cfg = compose_evaluate(f"ckpt={ckpt}", "lengths=[32,64,128]", "scalings=[pi]", f"out={tmp_path}")
    rows = evaluate(cfg)
    out = capsys.readouterr().out
    named = [(r["length"], r["protocol"], r["scaling"], r["window"]) for r in rows]
    plain = [(p, s, None) for p in ("sliding", "windows") for s in ("none", "pi")]
    # beyond the training context (64) the context-limited control: windows, attention to the last 64 keys
    assert named == [(n, *v) for n in (32, 64, 128) for v in plain] + [(128, "windows", "none", 64)]
    # every byte of the test split but its first, the same at every row; the documents it holds
    from omegaconf import OmegaConf

    data = OmegaConf.load(run_folder / ".hydra" / "config.yaml").data
    test = load_corpus(data.path, context=32, val_fraction=data.val_fraction, test_fraction=data.test_fraction)
    assert {r["scored"] for r in rows} == {len(test["test"]) - 1} and all(r["status"] == "ok" for r in rows)
    assert {r["documents"] for r in rows} == {len(test.documents["test"])}
    assert len({r["scored_hash"] for r in rows}) == 1
    assert all(0 < r["bpb"] < 12 for r in rows)
    written = list(csv.DictReader(open(tmp_path / "evaluate.csv")))
    assert [int(r["scored"]) for r in written] == [len(test["test"]) - 1] * len(rows)
    # every row printed once
    lines = [line.split() for line in out.splitlines() if line.split()[:1] in (["32"], ["64"], ["128"])]
    assert len(lines) == len(rows)


def test_every_length_scores_the_same_bytes_and_prints_each_row_once(run_folder, tmp_path, capsys):
    from linrope.evaluation.evaluate import EvaluateError, evaluate

    ckpt = run_folder / "checkpoints" / "last.ckpt"
    rows = evaluate(
        compose_evaluate(f"ckpt={ckpt}", "lengths=[32,64]", "scalings=[ntk]", "scored_bytes=4096", f"out={tmp_path}")
    )
    # sliding and windows, each as trained and ntk (no control: the model was trained at 64)
    assert len(rows) == 8 and [r["scored"] for r in rows] == [4096] * 8 and len({r["scored_hash"] for r in rows}) == 1
    out = capsys.readouterr().out
    printed = [" ".join(line.split()[2:-7]) for line in out.splitlines() if line.split()[:1] in (["32"], ["64"])]
    assert sorted(printed) == sorted(["none", "ntk", "windows", "windows ntk"] * 2)
    written = list(csv.DictReader(open(tmp_path / "evaluate.csv")))
    assert [w["scored_hash"] for w in written] == [r["scored_hash"] for r in rows]
    again = compose_evaluate(f"ckpt={ckpt}", "lengths=[32]", "scalings=[]", "scored_bytes=4097", f"out={tmp_path}")
    with pytest.raises(EvaluateError, match=f"^{tmp_path / 'evaluate.csv'} exists \\(an earlier evaluation\\)"):
        evaluate(again)  # a second evaluation into the same folder: refused before the checkpoint is read
    assert list(csv.DictReader(open(tmp_path / "evaluate.csv"))) == written  # the first one's rows, kept
    again.out = str(tmp_path / "more")
    more = evaluate(again)
    assert more[0]["scored"] == 4097 and more[0]["scored_hash"] != rows[0]["scored_hash"]


def test_evaluate_ends_with_the_command_to_run_next(run_folder, tmp_path, capsys, monkeypatch):
    """After its table evaluate says in one line what to run next on the checkpoint, its path filled in, as
    train.py ends with its next commands: the pass-key probe for a model of text, the run's report otherwise."""
    from pathlib import Path

    from linrope.evaluation.evaluate import evaluate, next_command, table_files

    monkeypatch.chdir(tmp_path)  # paths outside the working folder are shown whole
    ckpt = run_folder / "checkpoints" / "last.ckpt"
    evaluate(compose_evaluate(f"ckpt={ckpt}", "lengths=[32]", "scalings=[]", "scored_bytes=1024", f"out={tmp_path}"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("wrote ") and lines[-1].startswith(f"next: python -m linrope passkey ckpt={ckpt}    # ")
    # a model of bytes: the table, its plot, the loss per document and per position
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == sorted(table_files("evaluate"))
    assert all(str(tmp_path / name) in lines[-2] for name in written)  # the closing line names every file written
    assert sum(line.startswith("next:") for line in lines) == 1
    task = next_command(Path("/runs/mqar/checkpoints/last.ckpt"), "mqar")
    assert task.startswith("next: python -m linrope report /runs/mqar    # ")


def test_evaluate_gives_the_yarn_and_dynamic_rows_by_default(run_folder, tmp_path):
    """The default scalings: pi, ntk, yarn and dynamic beside the model as trained, each with finite values; at the
    training length they repeat it, beyond it yarn is its own row and dynamic (one forward per window of L
    positions) turns as ntk does."""
    from linrope.evaluation.evaluate import evaluate

    ckpt = run_folder / "checkpoints" / "last.ckpt"
    options = ["lengths=[64,128]", "scored_bytes=1024", "protocols=[sliding]", "window_control=false"]
    cfg = compose_evaluate(f"ckpt={ckpt}", *options, f"out={tmp_path}")
    rows = evaluate(cfg)
    assert [(r["length"], r["scaling"]) for r in rows] == [
        (n, s) for n in (64, 128) for s in ("none", "pi", "ntk", "yarn", "dynamic")
    ]
    assert all(r["status"] == "ok" and 0 < r["bpb"] < 12 and r["scored"] == 1024 for r in rows)
    bpb = {(r["length"], r["scaling"]): r["bpb"] for r in rows}
    assert {bpb[64, s] for s in ("pi", "ntk", "yarn", "dynamic")} == {bpb[64, "none"]}
    assert bpb[128, "dynamic"] == pytest.approx(bpb[128, "ntk"], rel=1e-6)
    assert len({bpb[128, s] for s in ("none", "pi", "ntk", "yarn")}) == 4
    written = list(csv.DictReader(open(tmp_path / "evaluate.csv")))
    assert [w["scaling"] for w in written] == [r["scaling"] for r in rows]


# ---- like-for-like RoPE rows -------------------------------------------------------------------------------------
class Text:
    """A stand-in data module: a test split of random bytes."""

    def __init__(self):
        self.splits = {"test": np.random.default_rng(1).integers(0, 256, 2000, dtype=np.uint8)}


@pytest.mark.parametrize("trained", [(None, 1.0), ("pi", 2.0), ("ntk", 3.0)])
def test_rope_rows_compose_with_the_trained_scaling(trained, monkeypatch):
    import linrope.positions.rope as rope_module
    from linrope.training.lit import LanguageModel

    scaling, f0 = trained
    base, d, l0 = 10000.0, 16, 32
    module = LanguageModel(
        model=dict(
            vocab_size=256,
            d_model=32,
            n_heads=2,
            n_layers=1,
            d_ff=32,
            max_len=l0,
            attention={"kind": "softmax"},
            position={"name": "rope", "base": base, "scaling": scaling, "factor": f0},
        )
    )
    used = []
    real = rope_module.rope_cos_sin
    monkeypatch.setattr(
        rope_module, "rope_cos_sin", lambda p, theta, dtype: used.append(theta.clone()) or real(p, theta, dtype)
    )
    settings = {
        **OmegaConf.to_container(OmegaConf.load(CONF / "extrapolation" / "default.yaml")),
        "scalings": ["pi", "ntk"],
        "scored_bytes": 512,
        "batch_size": 64,
        "protocols": ["sliding"],  # one protocol, no window control: one forward per RoPE row
        "window_control": False,
    }
    rows = length_table(module, Text(), settings, train_context=l0, lengths=[l0, 2 * l0, 4 * l0])
    t = np.arange(d // 2, dtype=np.float64)
    p0 = f0 if scaling == "pi" else 1.0
    k0 = f0 if scaling == "ntk" else 1.0

    def theta(p, k):  # written from the definitions: PI divides θ, NTK raises the base by k^(d/(d-2))
        return (base * k ** (d / (d - 2))) ** (-2 * t / d) / p

    expected = {("none", 1): theta(p0, k0)}
    for rho in (2, 4):
        expected.update(
            {("none", rho): theta(p0, k0), ("pi", rho): theta(p0 * rho, k0), ("ntk", rho): theta(p0, k0 * rho)}
        )
    # one forward per row (one batch, one layer): the rows at the training length repeat the first
    computed = [(r["scaling"], int(r["factor"])) for r in rows if r["factor"] > 1 or r["scaling"] == "none"]
    assert len(used) == len(computed) == 7
    for key, theta_used in zip(computed, used):
        assert theta_used.dtype == torch.float64
        np.testing.assert_allclose(theta_used.numpy(), expected[key], rtol=1e-13, atol=0, err_msg=str(key))
    assert module.model.blocks[0].attn.pos.theta.numpy() == pytest.approx(theta(p0, k0), rel=1e-13)


def test_a_length_beyond_randomized_positions_is_an_na_row_that_says_so():
    """Randomized positions (max_position = 2 × the context): the row at 2× is scored, the row at 4× has no
    distinct positions below max_position and is n/a, saying why (not a position table's length)."""
    from linrope.training.lit import LanguageModel

    l0 = 16
    module = LanguageModel(
        model=dict(
            vocab_size=256,
            d_model=16,
            n_heads=2,
            n_layers=1,
            d_ff=16,
            max_len=l0,
            attention={"kind": "softmax"},
            position={"name": "rope", "max_position": 2 * l0},
        )  # fmt: skip
    )
    settings = {
        **OmegaConf.to_container(OmegaConf.load(CONF / "extrapolation" / "default.yaml")),
        "scalings": [],
        "scored_bytes": 256,
        "protocols": ["sliding"],
        "window_control": False,
    }
    torch.manual_seed(0)
    rows = length_table(module, Text(), settings, train_context=l0, lengths=[2 * l0, 4 * l0])
    assert [r["status"] for r in rows] == ["ok", "n/a (positions drawn below max_position=32)"]


def test_the_table_says_its_plan_before_the_first_row_and_the_time_left_after_each():
    """A table that can take an hour says up front how many rows it will compute, at which lengths and on how many
    bytes, and after each computed row how long is left (``note``: linrope evaluate prints it on stderr)."""
    from linrope.training.lit import LanguageModel

    l0 = 16
    module = LanguageModel(
        model=dict(vocab_size=256, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=l0,
                   attention={"kind": "softmax"}, position={"name": "rope"})
    )  # fmt: skip
    settings = {
        **OmegaConf.to_container(OmegaConf.load(CONF / "extrapolation" / "default.yaml")),
        "scalings": ["pi"],
        "scored_bytes": 256,
    }
    notes, logged = [], []
    rows = length_table(
        module, Text(), settings, train_context=l0, lengths=[l0, 2 * l0], note=notes.append, log=logged.append
    )
    # at l0: 2 protocols x (as trained, pi), pi repeating; at 2 l0: 2 x 2 and the context-limited control
    assert len(rows) == 9
    assert notes[0] == (
        "plan: 9 rows (7 computed) at lengths 16, 32, each scoring 256 bytes of the test split; the time left follows "
        "each row"
    )
    assert [n.split(" computed")[0] for n in notes[1:]] == [f"row {i} of 7" for i in range(1, 8)]
    assert notes[-1].endswith("about 0 s left") and not any(n.startswith("plan") for n in logged)


# ---- the data module, rebuilt without running code ----------------------------------------------------------------
def _malicious_config(path, payload):
    """What `hydra.utils.instantiate` would run: the nested _target_ makes a folder (any code could run)."""
    OmegaConf.save(
        OmegaConf.create(
            {
                "context": 64,
                "seed": 1,
                "data": {
                    "_target_": "linrope.data.modules.ByteDataModule",
                    "task": "bytes",
                    "context": "${context}",
                    "max_bytes": 400000,
                    "path": {"_target_": "os.makedirs", "name": str(payload)},
                },
            }
        ),
        path,
    )


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_run_config_that_names_code_is_refused_in_one_line(run_folder, tmp_path):
    payload = tmp_path / "pwned"
    config = tmp_path / "config.yaml"
    _malicious_config(config, payload)
    ckpt = run_folder / "checkpoints" / "last.ckpt"
    r = run_cli(
        "linrope evaluate", f"ckpt={ckpt}", f"config={config}", "lengths=[32]", f"out={tmp_path / 'o'}", cwd=tmp_path
    )
    assert not payload.exists()
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "data.path={'_target_': 'os.makedirs'" in r.stderr and "expected a string or null" in r.stderr


def test_a_malicious_run_folder_is_not_read(run_folder, tmp_path, capsys):
    """A checkpoint inside a run folder whose .hydra/config.yaml names code: the checkpoint's own data
    hyper-parameters are used, the file's _target_ never runs."""
    import shutil

    from linrope.evaluation.evaluate import evaluate

    run = tmp_path / "run"
    shutil.copytree(run_folder / "checkpoints", run / "checkpoints")
    (run / ".hydra").mkdir()
    payload = tmp_path / "pwned"
    _malicious_config(run / ".hydra" / "config.yaml", payload)
    rows = evaluate(
        compose_evaluate(
            f"ckpt={run / 'checkpoints' / 'last.ckpt'}", "lengths=[32]", "scalings=[]", "scored_bytes=1024"
        )
    )
    assert not payload.exists() and rows[0]["status"] == "ok" and rows[0]["scored"] == 1024
    assert (run / "evaluate" / "evaluate.csv").exists()


def test_saved_data_is_type_checked_and_rebuilt_from_the_table(corpus):
    with pytest.raises(SavedDataError, match=r"^the data config: data.context=abc: expected an integer >= 1$"):
        build_data_module({"task": "bytes", "context": "abc"})
    with pytest.raises(SavedDataError, match=r"data.path=\{'_target_'"):
        build_data_module({"path": {"_target_": "os.makedirs", "name": "x"}, "context": 64})
    with pytest.raises(SavedDataError, match="data._target_='os.system' is not linrope's data module for task"):
        build_data_module({"_target_": "os.system", "task": "bytes", "command": "touch x"})
    with pytest.raises(SavedDataError, match="unknown task 'evil'"):
        build_data_module({"task": "evil", "context": 64})
    with pytest.raises(SavedDataError, match="trained on task 'bytes'"):
        build_data_module({"task": "mqar", "context": 64}, "bytes")
    with pytest.raises(
        SavedDataError,
        match=r"^the data config: data.bach_size: unknown option; did you mean "
        r"batch_size\?$",
    ):  # a typo in a saved config: refused, naming the key
        build_data_module({"path": str(corpus), "context": 64, "bach_size": 8})
    dm = build_data_module(
        {"_target_": "linrope.data.modules.ByteDataModule", "task": "bytes", "path": str(corpus), "context": 64}
    )
    assert type(dm).__name__ == "ByteDataModule" and dm.context == 64
    dm = build_data_module({"context": 32, "num_kv_pairs": 4}, "mqar")
    assert type(dm).__name__ == "MQARDataModule" and dm.task.num_kv_pairs == 4


@pytest.mark.parametrize("task", sorted(DATA_MODULES))
def test_each_data_schema_is_its_modules_constructor_and_covers_its_yaml(task):
    """The declaration a saved data config is checked against is read from the data module's constructor (and
    the parents it passes ``**common`` to): every key of conf/data/<task>.yaml is in it, and every argument's
    default passes the check made on saved values."""
    from linrope.base.options import defaults
    from linrope.data.rebuild import data_options

    cls = DATA_MODULES[task]
    rules = data_options(cls)
    assert "context" in rules and "batch_size" in rules and "seed" in rules
    yaml_keys = set(OmegaConf.load(CONF / "data" / f"{task}.yaml")) - {"_target_", "task"}
    assert yaml_keys <= set(rules), yaml_keys - set(rules)
    assert {n: v for n, v in defaults(cls).items() if n in rules and not rules[n].accepts(v)} == {}
    assert not rules["context"].accepts("abc") and not rules["context"].accepts(0)
    assert rules["context"].expectation() == "an integer >= 1"


# ---- the command line ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_evaluate_help_and_one_line_errors_write_nothing_in_the_cwd(tmp_path):
    r = run_cli("linrope evaluate", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "ckpt=PATH" in r.stdout and "scored_bytes" in r.stdout
    assert "'ckpt=\"logs/.../epoch=1-step=32.ckpt\"'" in r.stdout and "scalings=[pi,ntk,yarn,dynamic]" in r.stdout
    r = run_cli("linrope evaluate", f"ckpt={tmp_path / 'none.ckpt'}", cwd=tmp_path)
    assert (
        r.returncode == 2
        and r.stderr.strip() == f"linrope evaluate: checkpoint {tmp_path / 'none.ckpt'}: does not exist"
    )
    assert list(tmp_path.iterdir()) == []  # no outputs/, no .hydra/, no log in the current directory
    from linrope.evaluation.evaluate import EvaluateError, evaluate

    with pytest.raises(EvaluateError, match="ckpt=PATH is required"):
        evaluate(compose_evaluate("lengths=[64]"))
    # bad settings: one line naming each, before the checkpoint is read
    with pytest.raises(
        EvaluateError,
        match=r"^scored_bytes=0: expected an integer >= 1 or null \(null: the whole split\); stride=-2: expected an "
        r"integer >= 1 or null \(null: half the length\); factors=\[\]: expected "
        r"a list of numbers > 0; lengths=\[64, 0\]: expected integers >= 1$",
    ):
        evaluate(
            compose_evaluate(
                f"ckpt={tmp_path / 'none.ckpt'}", "scored_bytes=0", "stride=-2", "factors=[]", "lengths=[64,0]"
            )
        )
    with pytest.raises(EvaluateError, match=r"^scalings=\['longrope'\]: expected a list of pi, ntk, yarn, dynamic"):
        evaluate(compose_evaluate(f"ckpt={tmp_path / 'none.ckpt'}", "scalings=[longrope]"))


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
@pytest.mark.parametrize("broken", ["missing", "truncated"])
def test_generate_says_a_missing_or_truncated_checkpoint_in_one_line(broken, tmp_path):
    ckpt = tmp_path / "last.ckpt"
    if broken == "truncated":
        data = torch.nn.Linear(64, 64).state_dict()
        torch.save({"state_dict": data}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    r = run_cli("linrope generate", f"ckpt={ckpt}", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert r.stderr.startswith(f"linrope generate: checkpoint {ckpt}: ")
    assert ("does not exist" if broken == "missing" else "not a complete checkpoint") in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (["last.ckpt"] if broken == "truncated" else [])
