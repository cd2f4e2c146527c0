"""Each component declares its options once (``linrope.base.options``), and that one declaration checks every
place options enter: the command line, a preset file of the user's own (``--config-dir``), a saved config
(evaluate's ``config=PATH``) and a checkpoint's hyper-parameters — a typo in one line naming the nearest key, a
bad value in one line naming what is expected.  The config files agree with the declarations: each file's keys
are its component's, and its values pass."""

import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import CONF, ROOT


def compose_with(user_conf, *overrides):
    """conf/train.yaml with the user's folder as train.py's ``--config-dir`` adds it (Hydra's search path)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from linrope.config.command_line import config_dirs_as_overrides

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(
                config_name="train",
                overrides=config_dirs_as_overrides(
                    ["--config-dir", str(user_conf), "size=tiny", "trainer.accelerator=cpu", *overrides]
                ),
            )
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize(
    "group,text,message",
    [
        (
            "model",
            "# @package _global_\ndefaults:\n  - /model/linear_rope@_here_\n  - _self_\nmodel:\n  name: mine\n"
            "  attention:\n    chunk_sise: 8\n",
            "model.attention.chunk_sise: unknown option; did you mean chunk_size?",
        ),
        (
            "model",
            "# @package _global_\ndefaults:\n  - /model/linear_rope@_here_\n  - _self_\nmodel:\n  name: mine\n"
            "  attention:\n    chunk_size: 0\n",
            "model.attention.chunk_size=0: expected an integer >= 1",
        ),
        (
            "position",
            "# @package model.position\nname: t5\nnum_bucket: 8\n",
            "model.position.num_bucket: unknown option; did you mean num_buckets?",
        ),
        (
            "position",
            "# @package model.position\nname: t5\nnum_buckets: 0\n",
            "model.position.num_buckets=0: expected an integer >= 1",
        ),
        (
            "data",
            "_target_: linrope.data.modules.ByteDataModule\ntask: bytes\ncontext: ${context}\nbach_size: 8\n",
            "data.bach_size: unknown option; did you mean batch_size?",
        ),
        (
            "data",
            "_target_: linrope.data.modules.ByteDataModule\ntask: bytes\ncontext: ${context}\nval_fraction: 1.5\n",
            "data.val_fraction=1.5: expected a number > 0 and < 1",
        ),
        (
            "optim",
            "lr: 1.0e-3\nbetas: [0.9, 0.95]\nweight_decay: 0.1\nwarmup_steps: 0\nmin_lr_ratoi: 0.1\n",
            "optim.min_lr_ratoi: unknown option; did you mean min_lr_ratio?",
        ),
        (
            "optim",
            "lr: 1.0e-3\nbetas: [0.9, 1.5]\nweight_decay: 0.1\nwarmup_steps: 0\nmin_lr_ratio: 0.1\n",
            "optim.betas=[0.9, 1.5]: expected two numbers >= 0 and < 1",
        ),
        (
            "extrapolation",
            "defaults:\n  - default\n  - _self_\nscaling: [pi]\n",
            "extrapolation.scaling: unknown option; did you mean scalings?",
        ),
        (
            "extrapolation",
            "defaults:\n  - default\n  - _self_\nsplit: train\n",
            "extrapolation.split=train: expected one of val, test",
        ),
    ],
)
def test_a_users_preset_with_a_typo_or_a_bad_value_is_one_line(tmp_path, group, text, message):
    """A preset of the user's own (``--config-dir DIR``, ``DIR/<group>/mine.yaml``), checked by the declaration
    of its component as the command line is."""
    from linrope.config.checks import ConfigError, validate

    (tmp_path / group).mkdir()
    (tmp_path / group / "mine.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        validate(compose_with(tmp_path, f"{group}=mine", f"paths.output_dir={tmp_path / 'run'}"))
    assert str(e.value) == message


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["model.attention.chunk_sise=8"],
            "linrope: model.attention.chunk_sise: unknown option; did you mean chunk_size?",
        ),
        (["model.attention.chunk_size=0"], "linrope: model.attention.chunk_size=0: expected an integer >= 1"),
        (["extrapolation.max_score_mb=0"], "linrope: extrapolation.max_score_mb=0: expected a number > 0"),
        (["data=mqar", "data.batch_size=0"], "linrope: data.batch_size=0: expected an integer >= 1"),
    ],
)
def test_the_command_line_is_checked_by_the_same_declarations(compose, argv, message):
    """A typo is named before Hydra runs (``check_command_line``, no torch); a value once the config is composed
    (``validate``): the same declarations as a preset's."""
    from linrope.base.errors import ConfigError
    from linrope.config.checks import validate
    from linrope.config.command_line import check_command_line

    try:
        check_command_line(["size=tiny", *argv])
        validate(compose("size=tiny", *argv))
    except SystemExit as e:
        assert str(e) == message
    except ConfigError as e:
        assert f"linrope: {e}" == message
    else:
        pytest.fail("not refused")


@pytest.mark.parametrize(
    "section,message",
    [
        ({"bach_size": 8}, "data.bach_size: unknown option; did you mean batch_size?"),
        ({"batch_size": 0}, "data.batch_size=0: expected an integer >= 1"),
    ],
)
def test_a_saved_config_given_to_evaluate_is_checked_by_the_data_modules_declaration(tmp_path, section, message):
    """evaluate's ``config=PATH`` (a run's .hydra/config.yaml): a typo or a bad value in its data section is one
    line naming the key, before any data module is built."""
    from linrope.base.errors import SavedDataError
    from linrope.evaluation.evaluate import build_data

    saved = tmp_path / "config.yaml"
    saved.write_text(
        OmegaConf.to_yaml(
            {"data": {"_target_": "linrope.data.modules.ByteDataModule", "task": "bytes", "context": 64, **section}}
        )
    )
    cfg = OmegaConf.create({"config": str(saved), "data": {"path": None, "max_bytes": None}, "train_context": None})
    with pytest.raises(SavedDataError) as e:
        build_data(cfg, tmp_path / "x.ckpt", {}, "bytes")
    assert str(e.value) == f"config {saved}: {message}"


@pytest.mark.parametrize(
    "part,change,message",
    [
        (
            "model",
            {"attention": {"feture_map": "cosine"}},
            "model.attention.feture_map: unknown option; did you mean feature_map?",
        ),
        ("model", {"position": {"bse": 500.0}}, "model.position.bse: unknown option; did you mean base?"),
        ("model", {"position": {"base": -1.0}}, "model.position.base=-1.0: expected a number > 0"),
        ("model", {"dropout": 1.5}, "model.dropout=1.5: expected a number >= 0 and < 1"),
        ("model", {"attention": "linear"}, "model.attention: expected a mapping of options; got 'linear'"),
        ("data", {"eval_batch_sise": 4}, "data.eval_batch_sise: unknown option; did you mean eval_batch_size?"),
        ("data", {"test_windows": -1}, "data.test_windows=-1: expected an integer >= 1 or null"),
    ],
)
def test_a_checkpoints_hyper_parameters_are_checked_by_the_same_declarations(tmp_path, part, change, message):
    from linrope.base.errors import CheckpointError, SavedDataError
    from linrope.evaluation.evaluate import build_data
    from linrope.training.lit import LanguageModel

    ckpt = torch.load(ROOT / "tests" / "fixtures" / "main_linear_rope.ckpt", weights_only=True)
    del ckpt["linrope_identity"]
    if part == "model":
        model = ckpt["hyper_parameters"]["model"]
        for key, value in change.items():
            model[key] = {**model[key], **value} if isinstance(value, dict) else value
        with pytest.raises(CheckpointError) as e:
            LanguageModel.from_checkpoint(tmp_path / "x.ckpt", checkpoint=ckpt)
        assert (
            str(e.value) == f"checkpoint {tmp_path / 'x.ckpt'}: its model config is not one linrope builds: {message}"
        )
    else:
        ckpt["datamodule_hyper_parameters"] = {**ckpt["datamodule_hyper_parameters"], **change}
        cfg = OmegaConf.create({"config": None, "data": {"path": None, "max_bytes": None}, "train_context": None})
        with pytest.raises(SavedDataError) as e:
            build_data(cfg, tmp_path / "x.ckpt", ckpt, "bytes")
        assert str(e.value) == f"checkpoint {tmp_path / 'x.ckpt'}: {message}"


def test_evaluate_and_generate_check_their_own_keys_by_their_declarations(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from linrope.base.errors import LinropeError
    from linrope.evaluation.evaluate import evaluate
    from linrope.evaluation.generate import generate

    def composed(name, *overrides):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                return compose(config_name=name, overrides=[f"ckpt={tmp_path / 'none.ckpt'}", *overrides])
        finally:
            GlobalHydra.instance().clear()

    for name, override, message in [
        ("evaluate", "+lenghts=[64]", "lenghts: unknown option; did you mean lengths?"),
        ("evaluate", "train_context=0", "train_context=0: expected an integer >= 1 or null"),
        ("generate", "+top=5", "top: unknown option; did you mean top_k?"),
        ("generate", "top_k=0", "top_k=0: expected an integer >= 1 or null (null: every byte)"),
    ]:
        with pytest.raises(LinropeError) as e:
            (evaluate if name == "evaluate" else generate)(composed(name, override))
        assert str(e.value) == message, (name, override)


def test_a_bad_setting_is_refused_without_torch():
    """linrope's own settings, the extrapolation table's and the optimiser's are checked before torch is
    imported, so such a value is refused in about a second."""
    code = (
        "import sys\nfrom hydra import compose, initialize_config_dir\n"
        "from linrope.config.checks import ConfigError, validate\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base='1.3'):\n"
        "    cfg = compose(config_name='train', overrides=['extrapolation.stride=0', 'optim.lr=0'])\n"
        "try:\n    validate(cfg)\nexcept ConfigError as e:\n    print(e)\n"
        "print('torch' in sys.modules, 'lightning' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.splitlines() == [
        "extrapolation.stride=0: expected an integer >= 1 or null (null: half the length)",
        "optim.lr=0: expected a number > 0",
        "False False",
    ], r.stderr[-2000:]


# ---- the config files agree with the declarations ------------------------------------------------------------------
def _file_options(path):
    """A group file's own keys and values (its defaults list and Hydra's package line dropped)."""
    node = OmegaConf.load(path)
    return {k: v for k, v in OmegaConf.to_container(node, resolve=False).items() if k != "defaults"}


def test_every_position_and_attention_file_is_in_its_components_declaration():
    from linrope.models.attention import ATTENTION
    from linrope.positions import REGISTRY, scheme_options

    for path in sorted((CONF / "position").glob("*.yaml")):
        options = _file_options(path)
        rules = scheme_options(REGISTRY[options.pop("name")])
        assert set(options) <= set(rules), (path.name, set(options) - set(rules))
        assert [k for k, v in options.items() if not rules[k].accepts(v)] == [], path.name
    for path in sorted((CONF / "attention").glob("*.yaml")):
        options = _file_options(path)
        rules = ATTENTION[options.pop("kind")].rules()
        assert set(options) <= set(rules) and [k for k, v in options.items() if not rules[k].accepts(v)] == [], path


def test_the_extrapolation_and_optimiser_files_give_every_declared_setting():
    """conf/extrapolation/default.yaml and conf/optim/adamw.yaml give the values of exactly the settings their
    declarations name (and length_table reads), each of which passes."""
    from linrope.base.options import declared
    from linrope.config.settings import ExtrapolationSettings
    from linrope.evaluation.extrapolation import SETTINGS
    from linrope.models.optim import REQUIRED, AdamW

    for declaration, path in (
        (ExtrapolationSettings, CONF / "extrapolation" / "default.yaml"),
        (AdamW, CONF / "optim" / "adamw.yaml"),
    ):
        values, rules = _file_options(path), declared(declaration)
        assert set(values) == set(rules), path
        assert [k for k, v in values.items() if not rules[k].accepts(v)] == [], path
    assert set(SETTINGS) == set(declared(ExtrapolationSettings)) and set(REQUIRED) < set(declared(AdamW))


def test_traits_not_names_say_what_a_scheme_holds():
    """The table check and weight decay read a scheme's traits: every parameter a scheme names in ``tables`` is
    a table it allocates, and a scheme bounded by ``max_len`` says so for its own options."""
    from linrope.positions import REGISTRY, build_position, scheme_settings

    dims = dict(d_model=16, n_heads=2, head_dim=8, max_len=12)
    bounded = {n for n, c in REGISTRY.items() if c.bounded_by_max_len(scheme_settings(n, {}))}
    assert bounded == {"learned", "tupe"}
    assert REGISTRY["multiplicative"].bounded_by_max_len(scheme_settings("multiplicative", {"table": "learned"}))
    for name, cls in REGISTRY.items():
        options = {"table": "learned"} if name == "multiplicative" else {}
        held = {
            n
            for role in ("input", "attention", "shared")
            if role != "shared" or cls.shares
            for n, _ in build_position(name, where=role, **dims, **options).named_parameters(recurse=False)
        }
        assert set(cls.tables) - {"value_table"} <= held, name  # shaw's value table: its default variant only


@pytest.mark.slow  # a subprocess or a whole run: the slow stage (default suite under 10 minutes)
def test_train_py_refuses_a_bad_value_in_a_config_dir_preset_in_one_line(tmp_path):
    """The whole way in: ``train.py --config-dir DIR model=mine`` with a value the attention declaration refuses
    stops in one line, with no traceback and no run folder."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /model/linear_rope@_here_\n  - _self_\nmodel:\n  name: mine\n"
        "  attention:\n    eps: 0\n"
    )
    run = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--config-dir",
            str(tmp_path / "conf"),
            "model=mine",
            "size=tiny",
            "logger=none",
            f"hydra.run.dir={run}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert [l for l in r.stderr.splitlines() if l.startswith("linrope:")] == [
        "linrope: model.attention.eps=0: expected a number > 0"
    ], r.stderr[-2000:]
    assert not run.exists()
