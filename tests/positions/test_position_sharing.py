"""Position parameters shared across layers: who may borrow, what the shared role allocates (DeBERTa: the table P,
its projections per layer), and position options checked before anything is built.  What every sharing scheme owes
(counted once, used by every layer, the same as tied per-layer copies, position-only terms once per forward; the
``share`` option only where the paper shares): the contract suite, tests/positions/test_contract.py."""

from __future__ import annotations

import pytest

from linrope.positions import build_position
from tests.helpers import CONF


def test_only_an_attention_layer_borrows_and_only_from_its_own_scheme():
    with pytest.raises(ValueError, match="only an attention layer borrows"):
        build_position(
            "t5",
            where="attention",
            d_model=32,
            n_heads=4,
            head_dim=8,
            max_len=8,
            shared=build_position("deberta", where="shared", d_model=32, n_heads=4, head_dim=8, max_len=8),
        )


def test_shared_role_allocates_only_the_shared_part():
    dims = dict(d_model=32, n_heads=4, head_dim=8, max_len=16)
    s = build_position("deberta", where="shared", **dims)
    assert {n for n, _ in s.named_parameters()} == {"table"}
    layer = build_position("deberta", where="attention", shared=s, **dims)
    assert {n for n, _ in layer.named_parameters()} == {"w_kr", "w_qr"}
    assert sum(p.numel() for p in layer.parameters()) == 2 * 32 * 32  # W_{K,r}, W_{Q,r}: what stays per layer
    alone = build_position("deberta", where="attention", **dims)
    assert {n for n, _ in alone.named_parameters()} == {"table", "w_kr", "w_qr"}


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model=softmax_rope", "+model.position.share=true"], "rope has no parameters to share across layers"),
        (["model=softmax_deberta", "model.position.p2c=both"], "p2c=both: expected one of release, paper"),
        (
            ["model=softmax_floater", "model.position.inject=attention"],
            "inject=attention: expected one of input, blocks",
        ),
        (
            ["model=softmax_t5", "+model.position.buckets=8"],
            "model.position.buckets: unknown option; did you mean num_buckets?",
        ),
    ],
)
def test_bad_position_options_fail_in_the_config_check(compose, overrides, message):
    """Before any data is read or model built: one line naming the option."""
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose(*overrides, "size=tiny"))
    assert "\n" not in str(e.value) and message in str(e.value) and "model.position" in str(e.value)


def test_every_preset_passes_the_option_check(compose):
    from linrope.config.checks import model_errors

    for path in sorted((CONF / "model").glob("*.yaml")):
        assert model_errors(compose(f"model={path.stem}", "size=tiny").model) == [], path.stem
