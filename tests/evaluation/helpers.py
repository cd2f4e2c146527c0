"""What the tests of tests/evaluation share: the evaluate and generate configs composed as their commands compose
them, and a tiny linear-attention model in float64."""

import torch

from linrope.models.model import TransformerLM
from tests.helpers import CONF


def tiny(position, short_conv=0, **attention):
    torch.manual_seed(0)
    return (
        TransformerLM(
            dict(
                d_model=32,
                n_heads=2,
                n_layers=2,
                d_ff=64,
                max_len=64,
                short_conv=short_conv,
                attention={"kind": "linear", "impl": "chunk", "chunk_size": 8, **attention},
                position=position,
            )
        )
        .double()
        .eval()
    )


def compose_evaluate(*overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import linrope.evaluate  # noqa: F401 - registers the resolver of `out`

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return cfg


def compose_generate(*overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="generate", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def compose_passkey(*overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.helpers import CONF

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="passkey", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
