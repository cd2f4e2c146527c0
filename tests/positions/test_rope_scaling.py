"""RoPE's ``scaling: yarn`` (Peng, Quesnelle, Fan, Shippole 2024) and ``scaling: dynamic`` (dynamic NTK, as Hugging Face
transformers releases it): the frequencies against the released formulas written out here in float64 (and YaRN's
ramp against the paper's), the temperature, a yarn / dynamic model equal to today's model given the hand-computed
frequencies (and, for YaRN under softmax, q and k scaled by the temperature through the projection), and the
options refused in one line."""

import math

import pytest
import torch

from linrope.base.errors import ConfigError
from linrope.models.attention import SoftmaxAttention
from linrope.models.model import TransformerLM
from linrope.ops.rope import apply_rope, dynamic_ntk_scale, rope_frequencies, yarn_mscale, yarn_ramp
from linrope.positions import build_position, option_errors
from tests.helpers import gen

pytestmark = pytest.mark.usefixtures("kernel_env")


# ---- the formulas, written out --------------------------------------------------------------------------------------
def release_yarn(d, base, s, l0, beta_fast=32.0, beta_slow=1.0):
    """The authors' LlamaYaRNScaledRotaryEmbedding.yarn (and transformers' _compute_yarn_parameters), one pair at a
    time in float64: the pair that turns r times within L0 is d·ln(L0/(2πr))/(2 ln base); the ramp runs linearly in
    the pair index from floor(that pair for beta_fast) to ceil(that pair for beta_slow), clamped to [0, d-1]."""

    def pair(r):
        return d * math.log(l0 / (r * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair(beta_fast)), 0), min(math.ceil(pair(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(d // 2):
        extrapolated = 1.0 / base ** (2 * i / d)
        interpolated = 1.0 / (s * base ** (2 * i / d))
        keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(interpolated * (1 - keep) + extrapolated * keep)
    return torch.tensor(out, dtype=torch.float64)


def paper_yarn(d, base, s, l0, alpha=1.0, beta=32.0):
    """Eqs. 17-18 of the paper: r(d) = L / λ_d, λ_d = 2π b^(2d/|D|); γ(r) = 0 below α, 1 above β, linear between;
    h(θ_d) = (1 - γ) θ_d / s + γ θ_d."""
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        r = l0 / (2 * math.pi * base ** (2 * i / d))
        g = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        out.append((1 - g) * theta / s + g * theta)
    return torch.tensor(out, dtype=torch.float64)


def released_dynamic(d, base, factor, n, l0):
    """transformers' _compute_dynamic_ntk_parameters: seq_len = max(n, L0);
    base · (factor·seq_len/L0 - (factor - 1))^(d/(d-2)), then base^(-2i/d)."""
    n = max(n, l0)
    b = base * ((factor * n / l0) - (factor - 1)) ** (d / (d - 2))
    return torch.tensor([1.0 / b ** (2 * i / d) for i in range(d // 2)], dtype=torch.float64)


CASES = [
    (d, s, l0, base)
    for d in (8, 32, 64, 128)
    for s in (2.0, 4.5, 16.0)
    for l0 in (64, 256, 4096)
    for base in (1e4, 5e5)
]


@pytest.mark.parametrize("d,s,l0,base", CASES)
def test_yarn_frequencies_are_the_released_formula(d, s, l0, base):
    got = rope_frequencies(d, base, scaling="yarn", factor=s, original_context=l0)
    torch.testing.assert_close(got, release_yarn(d, base, s, l0), rtol=1e-13, atol=0)
    paper = rope_frequencies(d, base, scaling="yarn", factor=s, original_context=l0, ramp="paper")
    torch.testing.assert_close(paper, paper_yarn(d, base, s, l0), rtol=1e-13, atol=0)


def test_the_two_ramps_differ_and_the_betas_move_them():
    d, base, l0 = 64, 10000.0, 256
    release, paper = yarn_ramp(d, base, l0), yarn_ramp(d, base, l0, ramp="paper")
    assert (release - paper).abs().max() > 0.1  # linear in the pair index vs linear in the rotations
    assert release[0] == paper[0] == 1 and release[-1] == paper[-1] == 0
    narrower = yarn_ramp(d, base, l0, beta_fast=8.0, beta_slow=2.0)
    assert not torch.equal(narrower, release)
    torch.testing.assert_close(
        rope_frequencies(d, base, scaling="yarn", factor=3.0, original_context=l0, beta_fast=8.0, beta_slow=2.0),
        release_yarn(d, base, 3.0, l0, 8.0, 2.0),
        rtol=1e-13,
        atol=0,
    )


@pytest.mark.parametrize("s", [0.5, 1.0, 2.0, 8.0, 64.0])
def test_yarn_temperature(s):
    want = 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0  # sqrt(1/t) of the paper, on q and on k
    assert yarn_mscale(s) == pytest.approx(want, rel=1e-15)
    scheme = build_position(
        "rope", where="attention", d_model=32, n_heads=2, head_dim=16, max_len=64, scaling="yarn", factor=max(s, 1)
    )
    assert scheme.attention_scale == pytest.approx(yarn_mscale(max(s, 1)), rel=1e-15)
    fixed = build_position(
        "rope",
        where="attention",
        d_model=32,
        n_heads=2,
        head_dim=16,
        max_len=64,
        scaling="yarn",
        factor=4.0,
        mscale=1.3,
    )
    assert fixed.attention_scale == 1.3


@pytest.mark.parametrize("d", [4, 16, 64])
@pytest.mark.parametrize("factor", [1.0, 2.0, 3.5])
def test_dynamic_frequencies_are_the_released_formula(d, factor):
    base, l0 = 10000.0, 32
    scheme = build_position(
        "rope", where="attention", d_model=2 * d, n_heads=2, head_dim=d, max_len=l0, scaling="dynamic", factor=factor
    )
    for n in (1, 31, 32, 33, 100, 4096):
        want = released_dynamic(d, base, factor, n, l0)
        got = rope_frequencies(d, base, scaling="dynamic", factor=factor, original_context=l0, length=n)
        torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
        torch.testing.assert_close(scheme.frequencies(n), want, rtol=1e-13, atol=0)  # the per-forward rescaling
        assert dynamic_ntk_scale(factor, n, l0) == (1.0 if n <= l0 else factor * n / l0 - factor + 1)
    assert torch.equal(scheme.theta, rope_frequencies(d, base))  # as trained up to L0


# ---- the models: today's model given the hand-computed frequencies ----------------------------------------------
def lm(kind, **position):
    attention = {"kind": "softmax"} if kind == "softmax" else {"kind": "linear", "impl": "chunk", "chunk_size": 8}
    torch.manual_seed(0)
    cfg = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=16, attention=attention)
    model = TransformerLM({**cfg, "position": {"name": "rope", **position}}).double().eval()
    with torch.no_grad():  # q and k drawn large (std 0.5, not 0.02): peaked attention, where every frequency shows
        for block in model.blocks:
            block.attn.qkv.weight.mul_(25.0)
    return model


def plain_twin(model, kind, theta, scale=1.0):
    """Today's RoPE model with ``model``'s weights, each layer turning at ``theta``, and q, k multiplied by ``scale``
    through the rows of the qkv projection that make them."""
    twin = lm(kind)
    twin.load_state_dict(model.state_dict())
    d_model = twin.cfg.d_model
    with torch.no_grad():
        for block in twin.blocks:
            block.attn.pos.theta = theta.clone()
            block.attn.qkv.weight[: 2 * d_model] *= scale
    return twin


@pytest.mark.parametrize("kind", ["softmax", "linear"])
@pytest.mark.parametrize("ramp", ["release", "paper"])
def test_a_yarn_model_is_rope_at_the_hand_frequencies_with_q_and_k_scaled(kind, ramp):
    s, l0, hd = 6.0, 40, 16
    model = lm(kind, scaling="yarn", factor=s, original_context=l0, ramp=ramp)
    theta = (release_yarn if ramp == "release" else paper_yarn)(hd, 10000.0, s, l0)
    # softmax: the temperature on q and on k (the logits by its square); linear attention: none (it would cancel)
    twin = plain_twin(model, kind, theta, (0.1 * math.log(s) + 1) if kind == "softmax" else 1.0)
    x = torch.randint(0, 32, (2, 21), generator=gen("yarn-model", kind, ramp))
    torch.testing.assert_close(model(x), twin(x), rtol=1e-10, atol=1e-10)
    assert (model(x) - plain_twin(model, kind, rope_frequencies(hd))(x)).abs().max() > 1e-4  # yarn acts
    if kind == "softmax":  # and so does the temperature
        assert (model(x) - plain_twin(model, kind, theta)(x)).abs().max() > 1e-4
    torch.testing.assert_close(model(x, offset=9), model(x), rtol=1e-10, atol=1e-10)  # still relative


def test_yarn_attention_layer_against_the_formula():
    """One softmax layer, written out: s_ij = m²·(R_i q_i)·(R_j k_j)/sqrt(d) at the hand frequencies."""
    s, hd = 3.0, 8
    pos = build_position(
        "rope", where="attention", d_model=16, n_heads=2, head_dim=hd, max_len=24, scaling="yarn", factor=s
    )
    att = SoftmaxAttention(16, 2, pos).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=gen("yarn-layer"))
    positions = torch.arange(11) + 5
    q, k, v = att.split(x)
    theta = release_yarn(hd, 10000.0, s, 24)
    q, k = apply_rope(q, positions, theta=theta), apply_rope(k, positions, theta=theta)
    m = 0.1 * math.log(s) + 1
    scores = (m * m) * (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(att(x, positions)[0], att.merge(scores.softmax(-1) @ v), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_a_dynamic_model_turns_at_the_frequencies_of_its_largest_position(kind):
    factor, l0, hd = 2.0, 16, 16  # max_len 16: the original context
    model = lm(kind, scaling="dynamic", factor=factor)
    x = torch.randint(0, 32, (2, 24), generator=gen("dynamic-model", kind))
    unscaled = rope_frequencies(hd)
    # up to L0 positions: as trained
    torch.testing.assert_close(model(x[:, :16]), plain_twin(model, kind, unscaled)(x[:, :16]), rtol=1e-10, atol=1e-10)
    # 24 positions: the released formula at seq_len 24
    want = plain_twin(model, kind, released_dynamic(hd, 10000.0, factor, 24, l0))(x)
    torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-10)
    assert (model(x) - plain_twin(model, kind, unscaled)(x)).abs().max() > 1e-4
    # the length is the largest position + 1, not the number of positions: 10 tokens at offset 20 -> 30
    twin = plain_twin(model, kind, released_dynamic(hd, 10000.0, factor, 30, l0))
    torch.testing.assert_close(model(x[:, :10], offset=20), twin(x[:, :10], offset=20), rtol=1e-10, atol=1e-10)


def test_linear_dynamic_refuses_positions_it_cannot_read():
    model = lm("linear", scaling="dynamic", factor=2.0)
    x = torch.randint(0, 32, (1, 20))
    with pytest.raises(ValueError, match="^rope scaling: dynamic with linear attention reads the forward's length"):
        model(x, positions=torch.arange(20))
    softmax = lm("softmax", scaling="dynamic", factor=2.0)  # softmax reads them (outside training: a host read)
    torch.testing.assert_close(softmax(x, positions=torch.arange(20)), softmax(x), rtol=1e-12, atol=1e-12)


def test_yarn_factor_one_is_plain_rope():
    plain, one = lm("softmax"), lm("softmax", scaling="yarn", factor=1.0)
    x = torch.randint(0, 32, (2, 12))
    assert one.blocks[0].attn.pos.attention_scale == 1.0
    torch.testing.assert_close(one(x), plain(x), rtol=0, atol=0)


# ---- refusals --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,line",
    [
        ({"scaling": "yarn", "factor": 0.5}, "factor=0.5: scaling: yarn extends the context, so factor >= 1"),
        ({"scaling": "dynamic", "factor": 0.9}, "factor=0.9: scaling: dynamic extends the context, so factor >= 1"),
        (
            {"scaling": "yarn", "factor": 2.0, "beta_fast": 1.0, "beta_slow": 4.0},
            "beta_fast=1.0, beta_slow=4.0: YaRN's ramp needs beta_fast > beta_slow (the pairs turning beta_fast "
            "times within the original context are kept)",
        ),
        (
            {"scaling": "pi", "factor": 2.0, "beta_fast": 16.0},
            "beta_fast=16.0: an option of scaling: yarn, and this model's scaling is pi",
        ),
        (
            {"scaling": "dynamic", "mscale": 1.2},
            "mscale=1.2: an option of scaling: yarn, and this model's scaling is dynamic",
        ),
        (
            {"original_context": 128},
            "original_context=128: an option of scaling: yarn or dynamic, and this model's scaling is null",
        ),
    ],
)
def test_bad_scaling_options_are_one_line(options, line):
    assert option_errors("rope", options) == [f"model.position: {line}"]


def test_bad_values_and_the_linear_temperature_are_refused():
    assert option_errors("rope", {"scaling": "yarn", "ramp": "eq18"}) == [
        "model.position.ramp=eq18: expected one of release, paper"
    ]
    assert option_errors("rope", {"scaling": "yarn", "original_context": 0}) == [
        "model.position.original_context=0: expected an integer >= 1 or null (null: model.max_len, the training context)"
    ]
    with pytest.raises(ConfigError, match=r"^model.position.mscale=1.2: YaRN's temperature scales softmax logits; "):
        lm("linear", scaling="yarn", factor=2.0, mscale=1.2)
    lm("linear", scaling="yarn", factor=2.0)  # the ramp alone: taken
    with pytest.raises(ValueError, match="needs the original context"):
        rope_frequencies(8, scaling="yarn", factor=2.0)
