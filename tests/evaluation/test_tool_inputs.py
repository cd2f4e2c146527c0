"""Inputs of evaluate and generate that did what a user would not expect (issue 33): `lengths=[]` silently ran
the default table; `temperature=0` was refused, where users expect greedy decoding."""

import pytest

from linrope.evaluation.generate import generate, generate_text
from tests.evaluation.helpers import compose_evaluate, compose_generate, tiny


def test_an_empty_list_of_lengths_is_refused_in_one_line(tmp_path):
    from linrope.evaluation.evaluate import EvaluateError, evaluate

    with pytest.raises(EvaluateError) as e:
        evaluate(compose_evaluate(f"ckpt={tmp_path / 'none.ckpt'}", "lengths=[]"))
    assert str(e.value) == (
        "lengths=[]: no length to evaluate; give at least one (lengths=[256,512]), or leave "
        "lengths out for factors × the training context"
    )


def test_temperature_zero_is_greedy(tmp_path):
    """temperature=0 passes the checks (the next problem named is the missing checkpoint) and decodes greedily:
    the same bytes as top_k=1, whatever the seed."""
    from linrope.base.errors import LinropeError

    with pytest.raises(LinropeError) as e:
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "temperature=0"))
    assert str(e.value) == f"checkpoint {tmp_path / 'none.ckpt'}: does not exist"
    with pytest.raises(LinropeError, match=r"^temperature=-1: expected a number >= 0 \(0: greedy\)$"):
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "temperature=-1"))
    model = tiny({"name": "rope"}).float()
    greedy = {generate_text(model, "def ", 12, temperature=0, top_k=None, seed=s) for s in (0, 1, 2)}
    assert greedy == {generate_text(model, "def ", 12, temperature=1.0, top_k=1, seed=5)}


# ---- generation: streamed, bounded, kept on Ctrl+C; arguments that are not UTF-8 -----------------------------------
def saved_tiny_checkpoint(path, **attention):
    """A checkpoint of an untrained tiny linear-attention model, written as linrope writes one (no training);
    ``attention``: more options of its attention layer (``impl="auto"``, as conf/attention/linear.yaml)."""
    import torch

    from linrope.training.lit import LanguageModel

    torch.manual_seed(0)
    module = LanguageModel(
        model=dict(
            d_model=32,
            n_heads=2,
            n_layers=1,
            d_ff=64,
            max_len=64,
            attention={"kind": "linear", **attention},
            position={"name": "rope"},
        )
    )
    torch.save(
        {
            "state_dict": module.state_dict(),
            "global_step": 0,
            "hyper_parameters": {"model": dict(module.hparams["model"]), "optim": None},
        },
        path,
    )
    return path


def test_generation_streams_each_piece_as_it_is_sampled_and_a_stop_keeps_them():
    """The text reaches ``write`` piece by piece while sampling goes on (a stop raised from the 50th piece, as a
    signal handler would, finds 50 pieces written), and what was written is the start of the uninterrupted text."""
    from linrope.evaluation.generate import Stopped

    model = tiny({"name": "rope"}).float()
    full = generate_text(model, "def ", 400, temperature=1.0, top_k=None, seed=3)
    written = []

    def write(piece):
        written.append(piece)
        if len(written) == 51:  # the prompt and 50 pieces
            raise Stopped(2)

    with pytest.raises(Stopped) as e:
        generate_text(model, "def ", 400, temperature=1.0, top_k=None, seed=3, write=write)
    assert e.value.text == "".join(written) and full.startswith(e.value.text) and len(written) == 51
    assert 50 <= e.value.sampled < 400
    assert written[0] == "def "


def test_a_huge_request_needs_allow_long(tmp_path):
    from linrope.base.errors import LinropeError

    with pytest.raises(LinropeError) as e:
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "max_new_tokens=1000000000"))
    assert str(e.value) == (
        "max_new_tokens=1000000000: more than 1,000,000 bytes; if you mean it, add allow_long=true "
        "(the text streams as it is sampled; Ctrl+C keeps what is printed)"
    )
    with pytest.raises(LinropeError, match="does not exist"):  # allowed: the next problem is the missing checkpoint
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "max_new_tokens=1000000000", "allow_long=true"))


def test_an_argument_that_is_not_utf8_is_one_line():
    """``prompt=$'ab\\xff'`` reached Hydra's parser as a lone surrogate: LexerNoViableAltException."""
    from linrope.config.command_line import check_command_line

    prompt = b"prompt=ab\xff\xfe".decode("utf-8", errors="surrogateescape")  # what Python makes of the argument
    with pytest.raises(SystemExit) as e:
        check_command_line(["ckpt=x.ckpt", prompt], config_name="generate", prefix="linrope generate")
    assert str(e.value) == (
        "linrope generate: prompt: is not UTF-8 text (byte 0xff at byte 2 of the value); give it in UTF-8"
    )


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_ctrl_c_during_generation_keeps_every_sampled_byte(tmp_path):
    """A real process: the text streams to stdout, Ctrl+C prints one line and exits 130 with what was sampled."""
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers import ROOT

    ckpt = saved_tiny_checkpoint(tmp_path / "tiny.ckpt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "linrope",
            "generate",
            f"ckpt={ckpt}",
            "prompt=abc",
            "max_new_tokens=999999",
            "device=cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    try:
        head = os.read(p.stdout.fileno(), 200)  # the prompt and the first bytes, streamed
        while len(head) < 200:
            head += os.read(p.stdout.fileno(), 200 - len(head))
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    text = head + out
    assert p.returncode == 130, err.decode()[-2000:]
    line = err.decode().strip().splitlines()[-1]
    sampled = int(line.split(" after ")[1].split(" ")[0])
    assert line == f"linrope generate: stopped by SIGINT after {sampled} of 999999 bytes: all of them are printed above"
    assert text.startswith(b"abc") and len(text) >= 200 and "Traceback" not in err.decode()
    model = __import__("linrope.training.lit", fromlist=["LanguageModel"]).LanguageModel.from_checkpoint(ckpt).model
    expected = generate_text(model, "abc", sampled, temperature=0.8, top_k=40, seed=0)
    assert text.decode("utf-8", errors="replace") == expected + "\n"


def test_generate_prints_the_text_alone_on_stdout_and_a_prompt_takes_newlines(tmp_path):
    """stdout is the text and nothing else (``> out.txt`` holds the sample): the log line of ``impl=auto`` goes to
    stderr; ``\\n`` and ``\\t`` in a prompt are a newline and a tab, ``\\\\`` one backslash."""
    import os
    import subprocess
    import sys

    from linrope.evaluation.generate import prompt_text
    from linrope.training.lit import LanguageModel
    from tests.helpers import ROOT

    assert prompt_text("def f():\\n\\treturn '\\\\n' \\x") == "def f():\n\treturn '\\n' \\x"
    ckpt = saved_tiny_checkpoint(tmp_path / "tiny.ckpt", impl="auto")
    typed = "def f():\\n\\treturn \\\\n"  # as a user types it: backslash-n, backslash-t, two backslashes
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "linrope",
            "generate",
            f"ckpt={ckpt}",
            f"prompt='{typed}'",
            "max_new_tokens=12",
            "device=cpu",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    model = LanguageModel.from_checkpoint(ckpt).model
    prompt = "def f():\n\treturn \\n"
    assert r.stdout == generate_text(model, prompt, 12, temperature=0.8, top_k=40, seed=0) + "\n"
    assert "linear attention impl=auto: chunk" in r.stderr and "impl=auto" not in r.stdout


# ---- evaluation: rows written as they finish ------------------------------------------------------------------------
def test_evaluation_rows_are_written_as_they_finish_and_a_sigterm_keeps_them(tmp_path, monkeypatch, capsys):
    """evaluate.csv was written once, at the end: a SIGTERM after a 59-s row lost it.  Here a SIGTERM arrives
    as the second row is written: one line, exit 143, and evaluate.csv holds the two rows, whole."""
    import os
    import signal

    import linrope.evaluation.evaluate as E
    from linrope.evaluation.tables import read_csv

    ckpt = saved_tiny_checkpoint(tmp_path / "tiny.ckpt")
    before = signal.getsignal(signal.SIGTERM)
    real = E.write_csv

    def write_then_stop(rows, path):
        real(rows, path)
        if len(rows) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(E, "write_csv", write_then_stop)
    out = tmp_path / "eval"
    with pytest.warns(UserWarning, match="default byte corpus"), pytest.raises(SystemExit) as e:
        E.evaluate(
            compose_evaluate(
                f"ckpt={ckpt}",
                "lengths=[32,64,128]",
                "scalings=[pi]",
                "scored_bytes=2048",
                "data.max_bytes=300000",
                "device=cpu",
                f"out={out}",
            )
        )
    assert e.value.code == 128 + signal.SIGTERM
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"linrope evaluate: stopped by SIGTERM: the 2 rows done are in {out / 'evaluate.csv'}"
    )
    rows = read_csv(out / "evaluate.csv")
    assert [(r["length"], r["scaling"]) for r in rows] == [(32, "none"), (32, "pi")]
    assert all(r["status"] == "ok" and r["scored"] == 2048 for r in rows)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone again


# ---- configs and resume ---------------------------------------------------------------------------------------------
def test_a_preset_that_is_not_yaml_is_one_line_naming_the_file(tmp_path):
    """A preset of the user's (--config-dir) that is not YAML gave Hydra's 71-89-line PyYAML traceback; now one
    line naming the file and where it breaks, also when an experiment's defaults list chooses it."""
    from linrope.config.command_line import check_command_line

    (tmp_path / "model").mkdir()
    (tmp_path / "experiment").mkdir()
    (tmp_path / "model" / "nul.yaml").write_bytes(b"d_model: 64\n\0")
    (tmp_path / "model" / "colon.yaml").write_text("d_model: n_heads: 4\n")
    (tmp_path / "model" / "listed.yaml").write_text("- d_model\n- 64\n")
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /model: colon\n")
    expected = {
        "model=nul": f"model=nul: {tmp_path / 'model' / 'nul.yaml'} is not YAML: unacceptable character #x0000: "
        f"special characters are not allowed at byte 12",
        "model=colon": f"model=colon: {tmp_path / 'model' / 'colon.yaml'} is not YAML: mapping values are not "
        f"allowed here at line 1, column 17",
        "model=listed": f"model=listed: {tmp_path / 'model' / 'listed.yaml'} is not a config: YAML of keys and "
        f"values is expected, this file holds a list",
        "experiment=mine": f"experiment=mine chooses model=colon: {tmp_path / 'model' / 'colon.yaml'} is not YAML: "
        f"mapping values are not allowed here at line 1, column 17",
    }
    for arg, line in expected.items():
        with pytest.raises(SystemExit) as e:
            check_command_line(["--config-dir", str(tmp_path), arg])
        assert str(e.value) == f"linrope: {line}"
    check_command_line(["model=linear_rope", "experiment=pe_compare"])  # linrope's own presets pass


def test_a_resume_on_other_code_says_the_code_changed():
    """resume.json held the code change but only changed keys were printed; now the first line says it."""
    from linrope.run.provenance import PROVENANCE_KEY
    from linrope.run.resume_diff import resume_record

    def prov(code, commit="a" * 40, dirty=False):
        return {"linrope": {"code": code, "commit": commit, "dirty": dirty, "diff_hash": "d" * 12 if dirty else None}}

    ckpt = {PROVENANCE_KEY: prov("111111111111"), "global_step": 5, "hyper_parameters": {"model": {"d_model": 32}}}
    new = {"model": {"d_model": 32}}
    rec = resume_record(ckpt, "/r/checkpoints/last.ckpt", new, current=prov("222222222222", dirty=True))
    assert rec["code_changed"] and rec["lines"] == [
        "resume: the code changed: the checkpoint was written by code 111111111111 (aaaaaaaaaa), this run is code "
        "222222222222 (aaaaaaaaaa+dirty (diff dddddddddddd)) — the continued run is not what either code alone trains"
    ]
    assert resume_record(ckpt, "/r/last.ckpt", new, current=prov("111111111111"))["lines"] == []
    old = {PROVENANCE_KEY: prov(None, commit="b" * 40), "hyper_parameters": {"model": {"d_model": 32}}}
    assert resume_record(old, "/r/last.ckpt", new, current=prov("1" * 12))["lines"] == [
        "resume: the code changed: the checkpoint was written by bbbbbbbbbb, this run is aaaaaaaaaa — the continued "
        "run is not what either code alone trains"
    ]
    assert resume_record({"hyper_parameters": {}}, "/r/last.ckpt", {}, current=prov("1" * 12))["lines"] == []


def test_a_run_folder_lock_replaced_while_it_is_taken_is_taken_again(tmp_path, monkeypatch):
    """The run folder's claim, as the study's: a `.linrope.lock` removed between its opening and its locking
    (another run's cleanup) leaves a lock on a file the path no longer names, which guards nothing; the claim
    is taken again on the file there now, which then refuses a second run."""
    import fcntl
    import os

    from omegaconf import OmegaConf

    import linrope.run.folder as F

    real = fcntl.flock
    removed = []

    def flock(fd, op):
        if not removed:
            removed.append(True)
            os.unlink(tmp_path / F.LOCK_NAME)
        return real(fd, op)

    monkeypatch.setattr(F.fcntl, "flock", flock)
    cfg = OmegaConf.create({"paths": {"output_dir": str(tmp_path)}, "callbacks": {}})
    F.claim_run_folder(cfg)
    try:
        held = F._held[str(tmp_path)]
        assert os.fstat(held).st_ino == os.stat(tmp_path / F.LOCK_NAME).st_ino
        assert F.lock_holder(tmp_path) == f"pid {os.getpid()} on {__import__('socket').gethostname()}"
    finally:
        F.release_run_folder()
