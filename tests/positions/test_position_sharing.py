"""Position parameters shared across layers as the papers share them (T5: the bias table; DeBERTa: the
relative-embedding table P, projections per layer; TUPE: everything, one correlation for all layers), and
``share: false`` for one set per layer."""

from __future__ import annotations

import pytest
import torch

from linrope.models.model import TransformerLM
from linrope.positions import REGISTRY, build_position

SHARING = ("t5", "deberta", "tupe")
PER_LAYER = {  # parameters each layer keeps with sharing on (DeBERTa's projections)
    "t5": 0,
    "deberta": 2 * 32 * 32,
    "tupe": 0,
}


def lm(name, n_layers, **opts):
    return TransformerLM(
        dict(
            vocab_size=32,
            d_model=32,
            n_layers=n_layers,
            n_heads=4,
            d_ff=64,
            max_len=64,
            position={"name": name, **opts},
        )
    )


@pytest.mark.parametrize("name", SHARING)
def test_shared_parameters_grow_with_depth_as_without_position(name):
    step_none = lm("none", 3).num_params() - lm("none", 2).num_params()  # one block
    step = lm(name, 3).num_params() - lm(name, 2).num_params()
    assert step == step_none + PER_LAYER[name]
    # per layer: every layer carries its own copy of what the paper shares
    shared = sum(p.numel() for p in lm(name, 1).pos_shared.parameters())
    assert shared > 0
    step_own = lm(name, 3, share=False).num_params() - lm(name, 2, share=False).num_params()
    assert step_own == step + shared
    assert lm(name, 1, share=False).pos_shared is None


@pytest.mark.parametrize("name", SHARING)
def test_every_layer_uses_the_one_shared_module(name):
    m = lm(name, 3)
    assert all(b.attn.pos.src is m.pos_shared for b in m.blocks)
    keys = list(m.state_dict())
    assert not any(
        ".attn.pos." in k and k.split(".attn.pos.")[1] in dict(m.pos_shared.named_parameters()) for k in keys
    )  # saved once, under pos_shared
    x = torch.randint(0, 32, (2, 10))
    m(x).pow(2).mean().backward()
    for n, p in m.pos_shared.named_parameters():  # every layer's gradient lands on the one copy
        assert p.grad is not None and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("name", SHARING)
def test_sharing_is_per_layer_copies_tied(name):
    """The shared model is the per-layer model with every layer's copy set to the same values."""
    torch.manual_seed(0)
    shared = lm(name, 2).double()
    own = lm(name, 2, share=False).double()
    state = own.state_dict()
    for key, value in shared.state_dict().items():
        if key.startswith("pos_shared."):
            for i in range(2):
                state[f"blocks.{i}.attn.pos.{key[len('pos_shared.') :]}"] = value
        else:
            state[key] = value
    own.load_state_dict(state)
    x = torch.randint(0, 32, (2, 12))
    torch.testing.assert_close(own(x), shared(x), rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # untie: layer 1 gets other values, and the models part
        for p in own.blocks[1].attn.pos.parameters():
            p.add_(torch.randn_like(p))
    assert not torch.allclose(own(x), shared(x), atol=1e-6)


@pytest.mark.parametrize("name", ["t5", "tupe"])
def test_position_only_bias_is_computed_once_per_forward(name, monkeypatch):
    m = lm(name, 4)
    calls = []
    original = type(m.pos_shared).position_bias

    def counting(self, positions, dtype):
        calls.append(self)
        return original(self, positions, dtype)

    monkeypatch.setattr(type(m.pos_shared), "position_bias", counting)
    m(torch.randint(0, 32, (2, 9)))
    assert len(calls) == 1
    m(torch.randint(0, 32, (2, 9)))  # a fresh forward computes it afresh
    assert len(calls) == 2
    own = lm(name, 4, share=False)
    calls.clear()
    own(torch.randint(0, 32, (2, 9)))
    assert len(calls) == 4


def test_share_option_only_where_there_is_something_to_share():
    for name in ("rope", "alibi", "learned", "shaw"):
        assert not REGISTRY[name].shares
        with pytest.raises(ValueError, match=f"{name} has no parameters to share across layers"):
            lm(name, 1, share=True)
    for name in SHARING:
        assert REGISTRY[name].shares
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


def test_presets_with_options_pass_the_position_option_check(compose):
    from linrope.config.checks import model_errors

    for name in ("softmax_t5", "softmax_deberta", "softmax_tupe", "softmax_floater", "softmax_learned", "linear_rope"):
        assert model_errors(compose(f"model={name}", "size=tiny").model) == [], name
