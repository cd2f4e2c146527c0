"""KERPLE (docs/schemes.md#kerple): the paper's two kernels against a scalar float64 loop, the release's
clamping and initialisation, one pair of parameters per head shared across layers.  A shift, the refusal of linear
attention, the sharing's mechanics, bf16 training and compile: the contract suite (test_contract.py)."""

from __future__ import annotations

import math

import pytest
import torch

from linrope.models.model import weight_decay_split
from linrope.positions import REGISTRY, build_position
from tests.helpers import scalar_softmax
from tests.positions.contract import D, H, attention, tiny_lm


def layer(variant, *, causal=True, n_heads=H, r1=None, r2=None):
    """A float64 softmax layer owning its KERPLE parameters, drawn large (every term moves the output)."""
    att = attention("kerple", causal=causal, max_len=64, n_heads=n_heads, randomize=False, variant=variant)
    pos = att.pos
    with torch.no_grad():
        pos.r1.copy_(torch.empty(n_heads).uniform_(0.5, 2.5) if r1 is None else torch.tensor(r1, dtype=torch.float64))
        pos.r2.copy_(torch.empty(n_heads).uniform_(0.3, 1.8) if r2 is None else torch.tensor(r2, dtype=torch.float64))
    return att


def kernel(variant, r1, r2, distance):
    """The paper's kernels (section 4), one distance at a time."""
    if variant == "log":
        return -r1 * math.log(1.0 + r2 * distance)
    return -r1 * distance**r2


def loop_output(att, x, positions, causal, r1, r2, variant):
    """softmax_j(q_i·k_j / sqrt(d) + kernel(|p_i - p_j|)) v_j, element by element, in float64."""
    p = positions.tolist()
    return scalar_softmax(att, x, causal, lambda h, i, j: kernel(variant, r1[h], r2[h], abs(p[i] - p[j])))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("variant", ["log", "power"])
def test_kernels_against_the_paper_formula(variant, causal):
    att = layer(variant, causal=causal)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    positions = torch.randperm(40)[:9].sort().values  # distinct, not contiguous
    r1, r2 = att.pos.r1.tolist(), att.pos.r2.tolist()
    want = loop_output(att, x, positions, causal, r1, r2, variant)
    got = att(x, positions)[0]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # the kernel matters: without it (r1 at the floor, nearly no bias) the output is another one
    assert (got - loop_output(att, x, positions, causal, [1e-2] * H, r2, variant)).abs().max() > 1e-2
    got.pow(2).sum().backward()  # finite gradients, the exponent's too (0 ** r2 on the diagonal)
    for p in (att.pos.r1, att.pos.r2):
        assert torch.isfinite(p.grad).all() and p.grad.abs().min() > 0


@pytest.mark.parametrize("variant", ["log", "power"])
def test_release_clamps_before_use_and_passes_the_gradient(variant):
    """Values below 0.01 (and, for the exponent, above 2) act as the release's clamp leaves them; the gradient
    reaches the stored parameter as the release's does: that of the bias at the clamped value."""
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = torch.arange(7) + 5
    high = 3.0 if variant == "power" else 1.3
    out_of_range = layer(variant, r1=[-0.4, 0.7], r2=[0.005, high])
    inside = layer(variant, r1=[0.01, 0.7], r2=[0.01, 2.0 if variant == "power" else 1.3])
    for p, q in zip(inside.parameters(), out_of_range.parameters()):
        if p.dim() == 2:
            p.data.copy_(q.data)  # the same projections
    a, b = out_of_range(x, positions)[0], inside(x, positions)[0]
    assert torch.equal(a, b)
    a.sum().backward()
    b.sum().backward()
    for name in ("r1", "r2"):
        ga, gb = getattr(out_of_range.pos, name).grad, getattr(inside.pos, name).grad
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)
        assert ga.abs().min() > 0  # never stuck at the floor
    assert out_of_range.pos.r1[0].item() == -0.4  # the stored value is left alone (the forward writes nothing)


@pytest.mark.parametrize("variant,scale1,scale2", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_release_initialisation(variant, scale1, scale2):
    """r1 ~ scale1·U(0, 1), r2 ~ scale2·U(0, 1) (the release's torch.rand times 2 for the log's multiplier and
    the power's exponent, times 1 for the other parameter); one value per head."""
    torch.manual_seed(0)
    pos = build_position("kerple", where="attention", d_model=4096, n_heads=4096, head_dim=1, max_len=8,
                         variant=variant)  # fmt: skip
    for p, scale in ((pos.r1, scale1), (pos.r2, scale2)):
        assert p.shape == (4096,) and p.min() >= 0 and p.max() < scale
        assert abs(p.mean().item() - scale / 2) < 0.03 * scale and abs(p.std().item() - scale / 12**0.5) < 0.03 * scale


@pytest.mark.parametrize("variant", ["log", "power"])
def test_one_pair_per_head_for_all_layers(variant):
    m = tiny_lm("kerple", n_layers=3, variant=variant)
    assert {n for n, _ in m.named_parameters() if "pos" in n} == {"pos_shared.r1", "pos_shared.r2"}
    assert m.pos_shared.r1.shape == (4,) and all(b.attn.pos.src is m.pos_shared for b in m.blocks)
    own = tiny_lm("kerple", n_layers=3, variant=variant, share=False)
    assert own.pos_shared is None and own.num_params() == m.num_params() + 2 * 4 * 2  # two more layers' pairs


def test_linear_note_names_the_kernel():
    """Linear attention's refusal (test_contract.py) gives the note: the kernel it would have to add to every score."""
    assert "log(1 + r₂|i-j|)" in REGISTRY["kerple"].linear_note


def test_parameters_are_score_biases_not_decayed():
    m = tiny_lm("kerple", n_layers=3, share=False)
    decayed, spared = weight_decay_split(m)
    assert {f"blocks.{i}.attn.pos.r{j}" for i in range(3) for j in (1, 2)} <= set(spared)
    assert not any(".pos." in n for n in decayed) and REGISTRY["kerple"].score_biases == ("r1", "r2")


def test_bias_under_bf16_autocast_is_float32_and_finite():
    pos = build_position("kerple", where="attention", d_model=32, n_heads=4, head_dim=8, max_len=8, variant="power")
    positions = torch.arange(300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = torch.nn.Linear(8, 8)(torch.randn(1, 4, 300, 8))
        bias = pos.score_bias(q, q, positions)
    assert q.dtype == torch.bfloat16 and bias.dtype == torch.float32 and torch.isfinite(bias).all()
    assert bias.shape == (1, 4, 300, 300) and (bias[0, :, 5, 5] == 0).all() and (bias[0, :, 299, 0] < 0).all()
    r1, r2 = pos.r1.clamp(min=0.01).tolist(), pos.r2.clamp(0.01, 2.0).tolist()
    want = torch.tensor([[kernel("power", r1[h], r2[h], 299 - j) for j in (0, 100, 299)] for h in range(4)])
    got = bias[0, :, 299][:, [0, 100, 299]]  # at float32's precision, not bf16's (distances above 256 included)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-6)


def test_variant_is_checked_in_one_line():
    with pytest.raises(ValueError, match="variant=exp: expected one of log, power"):
        tiny_lm("kerple", n_layers=3, variant="exp")
