"""What a run is called, pinned for every model preset and for attention=… position=… overrides: model.name
(the label of reports, plots and wandb), the wandb run name and tags.  The values are those of main at
4955a32, before the one-model-spec refactor (linrope.models.spec), which must not change them."""

import pytest

from tests.helpers import CONF

PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
# overrides -> (model.name, wandb run name, wandb tags)
PINNED = [
    (
        ["model=linear"],
        ("linear", "linear-elu-none-s1234", ["attention:linear", "position:none", "task:bytes", "feature_map:elu"]),
    ),
    (
        ["model=linear_alibi"],
        (
            "linear_alibi",
            "linear-elu-alibi-s1234",
            ["attention:linear", "position:alibi", "task:bytes", "feature_map:elu"],
        ),
    ),
    (
        ["model=linear_cosine"],
        (
            "linear_cosine",
            "linear-cosine-none-s1234",
            ["attention:linear", "position:none", "task:bytes", "feature_map:cosine"],
        ),
    ),
    (
        ["model=linear_cosine_rope"],
        (
            "linear_cosine_rope",
            "linear-cosine-rope-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:cosine", "placement:numerator"],
        ),
    ),
    (
        ["model=linear_floater"],
        (
            "linear_floater",
            "linear-elu-floater-s1234",
            ["attention:linear", "position:floater", "task:bytes", "feature_map:elu"],
        ),
    ),
    (
        ["model=linear_learned"],
        (
            "linear_learned",
            "linear-elu-learned-s1234",
            ["attention:linear", "position:learned", "task:bytes", "feature_map:elu"],
        ),
    ),
    (
        ["model=linear_multiplicative"],
        (
            "linear_multiplicative",
            "linear-elu-multiplicative-s1234",
            ["attention:linear", "position:multiplicative", "task:bytes", "feature_map:elu"],
        ),
    ),
    (
        ["model=linear_randomized"],
        (
            "linear_randomized",
            "linear-elu-rope-randomized-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "randomized:2048",
            ],
        ),
    ),
    (
        ["model=linear_rope"],
        (
            "linear_rope",
            "linear-elu-rope-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:elu", "placement:numerator"],
        ),
    ),
    (
        ["model=linear_rope_decay"],
        (
            "linear_rope_decay",
            "linear-elu-rope-retnet-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "rope_decay:retnet",
            ],
        ),
    ),
    (
        ["model=linear_rope_both"],
        (
            "linear_rope_both",
            "linear-elu-rope-both-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:elu", "placement:both"],
        ),
    ),
    (
        ["model=linear_rope_norm"],
        (
            "linear_rope_norm",
            "linear-elu-rope-norm-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "normalize:false",
            ],
        ),
    ),
    (
        ["model=linear_sinusoidal"],
        (
            "linear_sinusoidal",
            "linear-elu-sinusoidal-s1234",
            ["attention:linear", "position:sinusoidal", "task:bytes", "feature_map:elu"],
        ),
    ),
    (["model=softmax"], ("softmax", "softmax-none-s1234", ["attention:softmax", "position:none", "task:bytes"])),
    (
        ["model=softmax_alibi"],
        ("softmax_alibi", "softmax-alibi-s1234", ["attention:softmax", "position:alibi", "task:bytes"]),
    ),
    (
        ["model=softmax_deberta"],
        ("softmax_deberta", "softmax-deberta-s1234", ["attention:softmax", "position:deberta", "task:bytes"]),
    ),
    (
        ["model=softmax_fire"],
        ("softmax_fire", "softmax-fire-s1234", ["attention:softmax", "position:fire", "task:bytes"]),
    ),
    (
        ["model=softmax_floater"],
        ("softmax_floater", "softmax-floater-s1234", ["attention:softmax", "position:floater", "task:bytes"]),
    ),
    (
        ["model=softmax_kerple"],
        ("softmax_kerple", "softmax-kerple-s1234", ["attention:softmax", "position:kerple", "task:bytes"]),
    ),
    (
        ["model=softmax_kerple_power"],
        (
            "softmax_kerple_power",
            "softmax-kerple-power-s1234",
            ["attention:softmax", "position:kerple", "task:bytes", "kerple_variant:power"],
        ),
    ),
    (
        ["model=softmax_learned"],
        ("softmax_learned", "softmax-learned-s1234", ["attention:softmax", "position:learned", "task:bytes"]),
    ),
    (
        ["model=softmax_multiplicative"],
        (
            "softmax_multiplicative",
            "softmax-multiplicative-s1234",
            ["attention:softmax", "position:multiplicative", "task:bytes"],
        ),
    ),
    (
        ["model=softmax_none"],
        ("softmax_none", "softmax-none-s1234", ["attention:softmax", "position:none", "task:bytes"]),
    ),
    (
        ["model=softmax_randomized"],
        (
            "softmax_randomized",
            "softmax-rope-randomized-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "randomized:2048"],
        ),
    ),
    (
        ["model=softmax_rope"],
        ("softmax_rope", "softmax-rope-s1234", ["attention:softmax", "position:rope", "task:bytes"]),
    ),
    (
        ["model=softmax_rope_decay"],
        (
            "softmax_rope_decay",
            "softmax-rope-retnet-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rope_decay:retnet"],
        ),
    ),
    (
        ["model=softmax_rope_partial"],
        (
            "softmax_rope_partial",
            "softmax-rope-rot0.25-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rotary_fraction:0.25"],
        ),
    ),
    (
        ["model=linear_rope_partial"],
        (
            "linear_rope_partial",
            "linear-elu-rope-rot0.25-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "rotary_fraction:0.25",
            ],
        ),
    ),
    (
        ["model=softmax_rope_ntk"],
        (
            "softmax_rope_ntk",
            "softmax-rope-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rope_scaling:ntk"],
        ),
    ),
    (
        ["model=softmax_rope_pi"],
        (
            "softmax_rope_pi",
            "softmax-rope-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rope_scaling:pi"],
        ),
    ),
    (
        ["model=softmax_xpos"],
        ("softmax_xpos", "softmax-xpos-s1234", ["attention:softmax", "position:xpos", "task:bytes"]),
    ),
    (
        ["model=softmax_sandwich"],
        ("softmax_sandwich", "softmax-sandwich-s1234", ["attention:softmax", "position:sandwich", "task:bytes"]),
    ),
    (
        ["model=softmax_rope_yarn"],
        (
            "softmax_rope_yarn",
            "softmax-rope-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rope_scaling:yarn"],
        ),
    ),
    (
        ["model=linear_rope_yarn"],
        (
            "linear_rope_yarn",
            "linear-elu-rope-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "rope_scaling:yarn",
            ],
        ),
    ),
    (
        ["model=softmax_shaw"],
        ("softmax_shaw", "softmax-shaw-s1234", ["attention:softmax", "position:shaw", "task:bytes"]),
    ),
    (
        ["model=softmax_sinusoidal"],
        ("softmax_sinusoidal", "softmax-sinusoidal-s1234", ["attention:softmax", "position:sinusoidal", "task:bytes"]),
    ),
    (["model=softmax_t5"], ("softmax_t5", "softmax-t5-s1234", ["attention:softmax", "position:t5", "task:bytes"])),
    (
        ["model=softmax_tupe"],
        ("softmax_tupe", "softmax-tupe-s1234", ["attention:softmax", "position:tupe", "task:bytes"]),
    ),
    (["model=softmax_xl"], ("softmax_xl", "softmax-xl-s1234", ["attention:softmax", "position:xl", "task:bytes"])),
    (
        ["model=softmax_cope"],
        ("softmax_cope", "softmax-cope-s1234", ["attention:softmax", "position:cope", "task:bytes"]),
    ),
    (
        ["attention=softmax", "position=none"],
        ("softmax_none", "softmax-none-s1234", ["attention:softmax", "position:none", "task:bytes"]),
    ),
    (
        ["position=alibi"],
        (
            "linear_alibi",
            "linear-elu-alibi-s1234",
            ["attention:linear", "position:alibi", "task:bytes", "feature_map:elu"],
        ),
    ),
    (
        ["attention=linear_cosine"],
        (
            "linear_cosine_rope",
            "linear-cosine-rope-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:cosine", "placement:numerator"],
        ),
    ),
    (
        ["attention=softmax", "model.name=mine"],
        ("mine", "softmax-rope-s1234", ["attention:softmax", "position:rope", "task:bytes"]),
    ),
    (
        ["attention=linear_cosine", "position=alibi"],
        (
            "linear_cosine_alibi",
            "linear-cosine-alibi-s1234",
            ["attention:linear", "position:alibi", "task:bytes", "feature_map:cosine"],
        ),
    ),
    (
        ["attention=linear", "position=none"],
        ("linear", "linear-elu-none-s1234", ["attention:linear", "position:none", "task:bytes", "feature_map:elu"]),
    ),
    (
        ["attention=linear_cosine", "position=none"],
        (
            "linear_cosine",
            "linear-cosine-none-s1234",
            ["attention:linear", "position:none", "task:bytes", "feature_map:cosine"],
        ),
    ),
    (
        ["attention=softmax", "position=randomized"],
        (
            "softmax_randomized",
            "softmax-rope-randomized-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "randomized:2048"],
        ),
    ),
    (
        ["model=softmax_learned", "+model.position.max_position=512", "model.max_len=512"],
        (
            "softmax_learned",
            "softmax-learned-randomized-s1234",
            ["attention:softmax", "position:learned", "task:bytes", "randomized:512"],
        ),
    ),
    (
        ["model=softmax", "position=t5"],
        ("softmax_t5", "softmax-t5-s1234", ["attention:softmax", "position:t5", "task:bytes"]),
    ),
    (
        ["model=linear_rope_both", "attention=linear"],
        (
            "linear_rope_both",
            "linear-elu-rope-both-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:elu", "placement:both"],
        ),
    ),
    (
        ["model=linear_rope_both", "attention=linear_cosine"],
        (
            "linear_cosine_rope",
            "linear-cosine-rope-both-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:cosine", "placement:both"],
        ),
    ),
    (
        ["model=softmax_rope_ntk", "position=rope"],
        (
            "softmax_rope_ntk",
            "softmax-rope-s1234",
            ["attention:softmax", "position:rope", "task:bytes", "rope_scaling:ntk"],
        ),
    ),
    (
        ["model=softmax_rope_ntk", "position=xl"],
        ("softmax_xl", "softmax-xl-s1234", ["attention:softmax", "position:xl", "task:bytes"]),
    ),
    (
        ["model=softmax", "attention=softmax"],
        ("softmax", "softmax-none-s1234", ["attention:softmax", "position:none", "task:bytes"]),
    ),
    (
        ["model=linear", "attention=softmax"],
        ("softmax_none", "softmax-none-s1234", ["attention:softmax", "position:none", "task:bytes"]),
    ),
    (
        ["model=linear_cosine_rope", "attention=linear"],
        (
            "linear_rope",
            "linear-elu-rope-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:elu", "placement:numerator"],
        ),
    ),
    (
        ["model=softmax_rope_pi", "seed=7", "tags=[x]", "data=mqar"],
        (
            "softmax_rope_pi",
            "softmax-rope-s7",
            ["attention:softmax", "position:rope", "task:mqar", "rope_scaling:pi", "x"],
        ),
    ),
    (
        ["model=linear_rope_norm", "position=alibi"],  # a pairing of its own: without a denominator still
        (
            "linear_alibi_norm",
            "linear-elu-alibi-norm-s1234",
            ["attention:linear", "position:alibi", "task:bytes", "feature_map:elu", "normalize:false"],
        ),
    ),
    (
        ["model=linear_rope", "+model.attention.normalize=false"],
        (
            "linear_rope",
            "linear-elu-rope-norm-s1234",
            [
                "attention:linear",
                "position:rope",
                "task:bytes",
                "feature_map:elu",
                "placement:numerator",
                "normalize:false",
            ],
        ),
    ),
    (
        ["model=linear_rope", "model.attention.placement=both"],
        (
            "linear_rope",
            "linear-elu-rope-both-s1234",
            ["attention:linear", "position:rope", "task:bytes", "feature_map:elu", "placement:both"],
        ),
    ),
    (
        ["model=linear_rope", "model.attention.feature_map=cosine", "position=alibi"],
        (
            "linear_alibi",
            "linear-cosine-alibi-s1234",
            ["attention:linear", "position:alibi", "task:bytes", "feature_map:cosine"],
        ),
    ),
]


def names(overrides, tmp_path):
    """model.name, run name and tags of a run composed with ``overrides``, as train.py names it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from linrope.training.builders import name_model, run_name, run_tags

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
            with open_dict(cfg):
                cfg.hydra.runtime.output_dir = str(tmp_path)
            HydraConfig.instance().set_config(cfg)
            task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            name_model(task)
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    return task.model.name, run_name(task), run_tags(task)


def test_every_preset_is_pinned():
    assert sorted(o[0].split("=", 1)[1] for o, _ in PINNED if len(o) == 1 and o[0].startswith("model=")) == PRESETS


@pytest.mark.parametrize("overrides,expected", PINNED, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_names_of_a_run_are_as_pinned(overrides, expected, tmp_path):
    assert names(overrides, tmp_path) == expected
