"""Which parameters AdamW decays (docs/methods.md#weight-decay): for every model preset, listed and checked
against what they are — never a bias, a norm gain, an embedding or position table, or an additive score
bias (T5's β, TUPE's b, XL's u and v); always every matrix that multiplies activations."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from torch import nn

from tests.helpers import CONF

PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
# the additive score biases each preset holds, by name, written here independently of the rule under test
SCORE_BIASES = {
    "softmax_t5": {"pos_shared.bias"},
    "softmax_tupe": {"pos_shared.bias"},
    "softmax_xl": {f"blocks.{i}.attn.pos.{a}" for i in range(2) for a in "uv"},
    "softmax_fire": {f"blocks.{i}.attn.pos.{a}" for i in range(2) for a in ("w1", "b1", "w2", "b2")},
}


def build(compose, preset):
    from linrope.models.model import TransformerLM

    cfg = compose(f"model={preset}", "size=tiny")
    return TransformerLM(OmegaConf.to_container(cfg.model, resolve=True))


def owners(model):
    """Parameter name (as named_parameters gives it) -> every (module, attribute) that holds it."""
    first = {id(p): n for n, p in model.named_parameters()}
    found = {}
    for m in model.modules():
        for a, p in m.named_parameters(recurse=False):
            found.setdefault(first[id(p)], []).append((m, a))
    return found


@pytest.mark.parametrize("preset", PRESETS)
def test_the_decayed_parameters_of_every_preset(compose, preset):
    from linrope.models.model import weight_decay_split

    model = build(compose, preset)
    decay, spared = weight_decay_split(model)
    params = dict(model.named_parameters())
    assert sorted(decay + spared) == sorted(params) and not set(decay) & set(spared)
    held = owners(model)
    for name in decay:
        for module, attr in held[name]:
            what = f"{preset}: {name} ({type(module).__name__}.{attr}, shape {tuple(params[name].shape)}) is decayed"
            assert params[name].dim() >= 2, what + ": a bias or gain"
            assert "bias" not in attr and "table" not in attr, what
            assert not isinstance(module, (nn.LayerNorm, nn.Embedding)), what
    assert not SCORE_BIASES.get(preset, set()) & set(decay), f"{preset}: a score-bias table is decayed"
    assert SCORE_BIASES.get(preset, set()) <= set(spared)
    # every projection is decayed (the rule does not spare everything), except the head tied to the embedding
    linear = {
        n
        for n, hs in held.items()
        for m, a in hs
        if isinstance(m, nn.Linear) and a == "weight" and not any(isinstance(o, nn.Embedding) for o, _ in hs)
    }
    assert linear and linear <= set(decay)


def test_the_optimizer_uses_the_split(compose):
    from linrope.models.model import weight_decay_split
    from linrope.training.builders import build_module

    module = build_module(compose("model=softmax_t5", "size=tiny", "trainer.max_steps=5"))
    module.trainer = SimpleNamespace(max_steps=5)
    groups = module.configure_optimizers()["optimizer"].param_groups
    params = dict(module.model.named_parameters())
    decay, spared = weight_decay_split(module.model)
    assert [g["weight_decay"] for g in groups] == [module.optim["weight_decay"], 0.0] and groups[0]["weight_decay"] > 0
    assert [id(p) for p in groups[0]["params"]] == [id(params[n]) for n in decay]
    assert [id(p) for p in groups[1]["params"]] == [id(params[n]) for n in spared]
    assert any(p is module.model.pos_shared.bias for p in groups[1]["params"])


def test_a_frozen_parameter_is_in_no_group():
    from linrope.models.model import weight_decay_split

    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    model[0].weight.requires_grad_(False)
    assert weight_decay_split(model) == ([], ["0.bias", "1.weight", "1.bias"])
    model[0].weight.requires_grad_(True)
    assert weight_decay_split(model) == (["0.weight"], ["0.bias", "1.weight", "1.bias"])
