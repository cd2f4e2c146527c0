"""Linear attention without a denominator in the model (``model.attention.normalize: false``, the preset
``linear_rope_norm``): each head's numerator RMS-normalised before the output projection, a norm that exists only
there (the default model and its checkpoints keep their keys and identity), and generation (the recurrent step)
giving what the whole sequence gives."""

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import gen, rel


def model_config(compose, *overrides):
    cfg = compose("size=tiny", "model.attention.impl=chunk", "model.attention.chunk_size=16", *overrides)
    return OmegaConf.to_container(cfg.model, resolve=True)


def build(compose, preset, *overrides):
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    return TransformerLM(model_config(compose, f"model={preset}", *overrides))


def test_the_norm_exists_only_without_a_denominator(compose):
    plain, normed = build(compose, "linear_rope"), build(compose, "linear_rope_norm")
    n_layers = plain.cfg.n_layers
    added = {f"blocks.{i}.attn.out_norm.weight" for i in range(n_layers)}
    assert set(normed.state_dict()) == set(plain.state_dict()) | added
    assert not any("norm" in k and "ln" not in k for k in plain.state_dict())  # the default model: as before
    for i in range(n_layers):
        norm = normed.blocks[i].attn.out_norm
        assert isinstance(norm, torch.nn.RMSNorm) and norm.eps == 1e-6
        assert norm.normalized_shape == (plain.cfg.head_dim,) and torch.equal(norm.weight, torch.ones(16))
        assert not hasattr(plain.blocks[i].attn, "out_norm")


def test_the_layer_normalises_each_heads_numerator(compose):
    """The layer against the sum written out: o_h = RMSNorm(numerator of head h) · gain, merged, projected."""
    from linrope.ops import linear_attention

    model = build(compose, "linear_rope_norm").double()
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.out_norm.weight.copy_(torch.rand(16, generator=gen("gain"), dtype=torch.float64) + 0.5)
    g = gen("layer")
    x = torch.randn(2, 70, model.cfg.d_model, generator=g, dtype=torch.float64)
    positions = torch.arange(70)
    got, _ = attn(x, positions)
    q, k, v = attn.split(x)
    kw = attn.kernel_options()  # RoPE's frequencies (the kernel rotates φ(q), φ(k)), no decay
    assert kw["normalize"] is False and kw["rope"] == "numerator" and kw["rope_theta"] is not None
    num = linear_attention(q, k, v, impl="naive", positions=positions, **kw)
    normed = num / num.square().mean(-1, keepdim=True).add(1e-6).sqrt() * attn.out_norm.weight
    want = attn.out(normed.transpose(1, 2).flatten(2))
    assert rel(got, want) < 1e-12
    # and it is not the layer with a denominator
    with_den = linear_attention(q, k, v, impl="naive", positions=positions, **{**kw, "normalize": True})
    assert rel(got, attn.out(with_den.transpose(1, 2).flatten(2))) > 0.1


@pytest.mark.parametrize("preset", ["linear_rope_norm", "linear_rope"])
def test_generation_matches_the_whole_sequence(compose, preset, monkeypatch):
    """The prompt through the chunk kernel (chunk 16, 40 positions: several chunks), then each new token through
    the registered recurrent step carrying the state: every step's logits equal the whole sequence's, and greedy
    generation picks each one's argmax."""
    from linrope.models import attention

    steps, real = [], attention.recurrent_step
    monkeypatch.setattr(attention, "recurrent_step", lambda *a, **k: (steps.append(k["normalize"]), real(*a, **k))[1])
    model = build(compose, preset).double().eval()
    prompt = torch.randint(0, 256, (2, 40), generator=gen("prompt", preset))
    out = model.generate(prompt, 12, temperature=0)
    assert out.shape == (2, 52) and torch.equal(out[:, :40], prompt)
    normalize = preset == "linear_rope"
    assert steps == [normalize] * (model.cfg.n_layers * 12)  # each generated token fed back, one step a layer
    with torch.no_grad():
        whole = model(out)
        assert torch.equal(whole[:, 39:-1].argmax(-1), out[:, 40:])
        logits, states = model(out[:, :40], return_states=True)
        stepped = [logits]
        for t in range(40, 52):
            logits, states = model(out[:, t : t + 1], offset=t, states=states, return_states=True)
            stepped.append(logits)
    assert rel(torch.cat(stepped, dim=1), whole) < 1e-10


def test_identity_names_normalize_only_when_false(compose, tmp_path):
    from linrope.base.errors import CheckpointMismatch
    from linrope.models.spec import IDENTITY_KEY, ModelConfig, check_identity, model_identity

    plain, normed = model_config(compose, "model=linear_rope"), model_config(compose, "model=linear_rope_norm")
    assert "attention.normalize" not in model_identity(plain)  # every earlier checkpoint keeps its identity
    assert model_identity(normed) == {**model_identity(plain), "attention.normalize": False}
    with pytest.raises(CheckpointMismatch) as err:
        check_identity({IDENTITY_KEY: model_identity(plain)}, normed)
    assert str(err.value) == (
        "the checkpoint is a checkpoint of another model: model.attention.normalize: (absent) in the checkpoint, "
        "False now"
    )
    assert ModelConfig.from_dict({**normed, "attention": {**normed["attention"], "normalize": "no"}}).problems() == [
        "model.attention.normalize=no: expected true or false"
    ]
