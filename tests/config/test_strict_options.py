"""A typo in an option is refused in one line naming it and the nearest valid key, at every level (the model,
its attention and position scheme, the data module, the optimiser, linrope's own settings), on the command
line and in a preset file alike, before any data is read: each component checks its own options."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import CONF, ROOT


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["+model.d_modle=512"], "model.d_modle: unknown option; did you mean d_model?"),
        (
            ["+model.attention.feture_map=cosine"],
            "model.attention.feture_map: unknown option; did you mean feature_map?",
        ),
        (
            ["model=softmax_rope", "+model.attention.chunk_sise=8"],
            "model.attention.chunk_sise: unknown option; it takes window",
        ),
        (["+model.position.bse=500"], "model.position.bse: unknown option; did you mean base?"),
        (
            ["model=softmax_t5", "+model.position.num_bucket=8"],
            "model.position.num_bucket: unknown option; did you mean num_buckets?",
        ),
        (["+data.bach_size=8"], "data.bach_size: unknown option; did you mean batch_size?"),
        (["data=mqar", "+data.num_kv_pair=4"], "data.num_kv_pair: unknown option; did you mean num_kv_pairs?"),
        (["+optim.weight_decy=0.01"], "optim.weight_decy: unknown option; did you mean weight_decay?"),
        (["+trainer.max_step=3"], "trainer.max_step: unknown option; did you mean max_steps?"),
        (["+seeed=1"], "seeed: unknown option; did you mean seed?"),
        (["+extrapolation.factor=[1,2]"], "extrapolation.factor: unknown option; did you mean factors?"),
        (["+plan.tokens_per_param=20"], "plan.tokens_per_param: unknown option; did you mean tokens_per_parameter?"),
        (["plan.measure_steps=-1"], "plan.measure_steps=-1: expected an integer >= 0"),
    ],
)
def test_a_typo_is_refused_naming_the_nearest_key(compose, overrides, message):
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose("size=tiny", *overrides))
    assert str(e.value) == message


@pytest.mark.parametrize(
    "section,message",
    [
        ("model:\n  name: typo\n  d_modle: 512\n", "model.d_modle: unknown option; did you mean d_model?"),
        (
            "model:\n  name: typo\n  attention:\n    feture_map: cosine\n",
            "model.attention.feture_map: unknown option; did you mean feature_map?",
        ),
        ("model:\n  name: typo\n  position:\n    bse: 500\n", "model.position.bse: unknown option; did you mean base?"),
    ],
)
def test_a_typo_in_a_preset_file_is_refused(tmp_path, section, message):
    """A preset written as README says (conf/model/<name>.yaml), with a typo: refused like the command line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from linrope.config.checks import ConfigError, validate

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "model" / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /attention: linear\n  - override /position: rope\n" + section
    )
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose(config_name="train", overrides=["model=typo", "size=tiny", f"paths.output_dir={tmp_path}"])
    finally:
        GlobalHydra.instance().clear()
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == message


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
@pytest.mark.parametrize("override", ["+model.attention.feture_map=cosine", "model.attention.feture_map=cosine"])
def test_a_typo_on_the_command_line_stops_train_py_in_one_line(tmp_path, override):
    """With ``+`` the composed config is checked (linrope.config.checks); without, the key is found missing before
    Hydra applies it (linrope.config.command_line.unknown_key_errors): the same line either way."""
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "size=tiny", "logger=none", override, f"hydra.run.dir={run}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("linrope:")]
    assert lines == ["linrope: model.attention.feture_map: unknown option; did you mean feature_map?"], r.stderr[-2000:]
    assert not run.exists()  # nothing built, no run folder left


def test_the_model_and_its_layers_take_only_their_options():
    """Built directly (a checkpoint's config, a test, a notebook), a model refuses what its components do not
    take; the attention layers have no catch-all keyword arguments."""
    from linrope.base.errors import ConfigError
    from linrope.models.attention import LinearAttention, SoftmaxAttention
    from linrope.models.model import TransformerLM
    from linrope.positions import build_position

    small = dict(vocab_size=16, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8)
    with pytest.raises(ConfigError, match=r"^model.d_modle: unknown option; did you mean d_model\?$"):
        TransformerLM({**small, "d_modle": 16})
    with pytest.raises(ConfigError, match=r"^model.attention.eps_: unknown option; did you mean eps\?$"):
        TransformerLM({**small, "attention": {"kind": "linear", "eps_": 1e-3}})
    assert (
        TransformerLM({**small, "attention": {"kind": "linear", "feature_map": "cosine"}}).blocks[0].attn.feature_map
        == "cosine"
    )
    position = build_position("none", where="attention", d_model=8, n_heads=2, head_dim=4, max_len=8)
    for cls in (LinearAttention, SoftmaxAttention):
        with pytest.raises(TypeError):
            cls(8, 2, position, feture_map="cosine")
    assert set(LinearAttention.options()) == {
        "feature_map",
        "placement",
        "impl",
        "chunk_size",
        "eps",
        "window",
        "normalize",
    }
    assert SoftmaxAttention.options() == {"window": None}


def test_a_checkpoint_whose_model_config_has_a_typo_is_refused_in_one_line(tmp_path):
    import torch

    from linrope.base.errors import CheckpointError
    from linrope.training.lit import LanguageModel

    ckpt = torch.load(ROOT / "tests" / "fixtures" / "main_linear_rope.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["model"]["attention"]["feture_map"] = "cosine"
    del ckpt["linrope_identity"]
    with pytest.raises(
        CheckpointError,
        match=r"its model config is not one linrope builds: "
        r"model.attention.feture_map: unknown option; did you mean feature_map\?$",
    ):
        LanguageModel.from_checkpoint(tmp_path / "x.ckpt", checkpoint=ckpt)


def test_checking_a_model_draws_no_random_numbers():
    """The model's check reads the declarations of its components and builds nothing: it leaves the random
    state as it found it, so a model starts from the same weights as before the check existed (float32
    numerics of every preset unchanged)."""
    import torch

    from linrope.models.spec import ModelConfig
    from linrope.positions import REGISTRY

    for position in ({"name": name} for name in sorted(REGISTRY)):  # every scheme, those with parameters too
        torch.manual_seed(0)
        ModelConfig.from_dict(
            dict(vocab_size=32, d_model=16, n_heads=2, d_ff=32, max_len=16, position=position)
        ).check()
        after = torch.rand(1)
        torch.manual_seed(0)
        assert torch.equal(torch.rand(1), after), position


@pytest.mark.parametrize(
    "argv,errors",
    [
        (
            ["trainer.max_step=3", "contxt=64"],
            [
                "trainer.max_step: unknown option; did you mean max_steps?",
                "contxt: unknown option; did you mean context?",
            ],
        ),
        (
            ["model=softmax_t5", "model.position.num_bucket=8"],
            ["model.position.num_bucket: unknown option; did you mean num_buckets?"],
        ),
        (
            ["data=mqar", "data.num_kv_pair=4", "optim.weight_decy=0.1"],
            [
                "data.num_kv_pair: unknown option; did you mean num_kv_pairs?",
                "optim.weight_decy: unknown option; did you mean weight_decay?",
            ],
        ),
        (
            ["-m", "model=linear_rope", "trainer.max_step=3,4"],
            ["trainer.max_step: unknown option; did you mean max_steps?"],
        ),
        # what exists, what Hydra or linrope.config.checks checks instead, and what this check cannot compose: nothing
        (
            [
                "model=softmax_t5",
                "model.position.num_buckets=8",
                "data=mqar",
                "data.num_kv_pairs=4",
                "trainer.max_steps=3",
                "context=64",
                "seed=2",
                "hydra.run.dir=x",
                "extrapolation.factors=[1,2]",
            ],
            [],
        ),
        (
            ["model=linear_rope", "model.attention.normalize=false"],  # declared, but no file of the preset sets it
            [
                "model.attention.normalize: unknown option; it takes chunk_size, eps, feature_map, impl, kind, "
                "placement, window (an option the composed config leaves out is added with +: "
                "+model.attention.normalize=false)"
            ],
        ),
        (["model=linear_rope_norm", "model.attention.normalize=true"], []),
        (  # a Trainer option the preset leaves out: said so, not "did you mean limit_val_batches?"
            ["trainer.accumulate_grad_batches=2"],
            [
                "trainer.accumulate_grad_batches: not in the composed config, but Lightning's Trainer takes it: "
                "add it with +trainer.accumulate_grad_batches=2"
            ],
        ),
        (["experiment=budget", "trainer.max_steps=5", "model.position.base=500"], []),
        (["+trainer.max_step=3", "~seed"], []),  # + and ~: the composed config's check
        (["-m", "model=linear_rope,softmax_rope", "trainer.max_step=3"], []),  # a sweep of a group: Hydra's jobs say it
        (["model=nope", "trainer.max_step=3"], []),  # command_line_errors names model=nope first
    ],
)
def test_an_unknown_key_without_plus_is_named_before_hydra(argv, errors):
    from linrope.config.command_line import unknown_key_errors

    assert unknown_key_errors(["size=tiny", *argv]) == errors


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_a_user_preset_key_is_found_and_a_typo_in_evaluate_is_one_line(tmp_path):
    from linrope.config.command_line import unknown_key_errors

    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /model/linear_rope@_here_\n  - _self_\nmodel:\n  name: mine\n"
    )
    argv = ["-cd", str(tmp_path / "my_conf"), "model=mine"]
    assert unknown_key_errors([*argv, "model.d_model=64"]) == []
    assert unknown_key_errors([*argv, "model.d_modle=64"]) == ["model.d_modle: unknown option; did you mean d_model?"]
    r = subprocess.run(
        [sys.executable, "-m", "linrope", "evaluate", "ckpt=missing.ckpt", "lenghts=[64]"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 1 and r.stderr.strip() == "linrope evaluate: lenghts: unknown option; did you mean lengths?"
    assert not (tmp_path / "evaluate").exists() and not (tmp_path / "outputs").exists()


def test_a_line_hydra_cannot_read_is_one_line_with_its_cure():
    """Hydra's grammar errors are several lines naming neither the cure nor, for an unquoted '=' (Lightning's
    epoch=1-step=32.ckpt), the cause: one line each, before Hydra."""
    from linrope.config.command_line import grammar_errors

    assert grammar_errors(["model=linear_rope", "seed=3", "--cfg", "job"]) == []
    (line,) = grammar_errors(["ckpt=runs/a/epoch=1-step=32.ckpt"])
    assert line.startswith("ckpt=runs/a/epoch=1-step=32.ckpt: Hydra cannot read it (")
    assert line.endswith("""a value holding '=' is quoted: 'ckpt="runs/a/epoch=1-step=32.ckpt"'""")
    (line,) = grammar_errors(["model.d_model=[64"])
    assert "Hydra cannot read it" in line and line.endswith("lists as [a,b]; a value with spaces or brackets quoted)")
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "data.path=~/x.txt"], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("linrope: data.path=~/x.txt: Hydra cannot read it")
