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


def compose_command(name: str, *overrides):
    """conf/<name>.yaml composed with ``overrides``, as the command ``python -m linrope <name>`` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name=name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def compose_evaluate(*overrides):
    import linrope.evaluation.evaluate  # noqa: F401 - registers the resolver of `out`

    return compose_command("evaluate", *overrides)


def compose_generate(*overrides):
    return compose_command("generate", *overrides)


def compose_passkey(*overrides):
    return compose_command("passkey", *overrides)
