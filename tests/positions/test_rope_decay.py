"""RoPE with a per-head decay (``model.position.decay``): RetNet's retention γ_h = 1 - 2^(-5-h), or ALiBi's slopes
as a decay.  Linear attention takes γ_h as its kernel's decay (every form against a formula written out in
float64), softmax attention the score bias log γ_h·(i - j) (against the explicit softmax); the decay is a float64
buffer (no parameter, nothing saved) and survives the extrapolation's swap of RoPE's frequencies."""

import pytest
import torch
import torch.nn.functional as F

from linrope.evaluation.extrapolation import rope_row
from linrope.models.attention import LinearAttention, SoftmaxAttention
from linrope.ops.rope import apply_rope
from linrope.positions import alibi_slopes, build_position
from tests import helpers
from tests.helpers import gen, rel

D, H, HD = 32, 4, 8

pytestmark = pytest.mark.usefixtures("kernel_env")


def rope(**opts):
    return build_position("rope", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=64, **opts)


def test_the_decays_are_retnets_and_alibis_and_stay_float64_buffers():
    retnet = rope(decay="retnet")
    want = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=torch.float64)
    assert torch.equal(retnet.linear_decay(), want)
    assert torch.equal(retnet.rate, -torch.log(want))
    alibi = rope(decay="alibi")
    assert torch.equal(alibi.linear_decay(), torch.exp(-alibi_slopes(H)))
    assert torch.equal(alibi.rate, alibi_slopes(H))
    for convert in (lambda m: m.float(), lambda m: m.bfloat16(), lambda m: m.half()):
        assert convert(retnet).gamma.dtype == torch.float64 and retnet.rate.dtype == torch.float64
    assert torch.equal(retnet.gamma, want)
    # a buffer: no parameter (nothing weight-decayed or trained), nothing in a checkpoint
    assert not list(retnet.parameters()) and not retnet.state_dict()
    # no decay: the scheme is plain RoPE (no buffer, no bias, no decay)
    plain = rope()
    assert plain.linear_decay() is None and not hasattr(plain, "gamma")
    q = torch.randn(1, H, 5, HD)
    assert plain.score_bias(q, q, torch.arange(5)) is None


def test_a_bad_decay_is_one_line():
    from linrope.positions import option_errors

    (line,) = option_errors("rope", {"decay": "retnett"})
    assert line == "model.position.decay=retnett: expected one of retnet, alibi, null (null: no decay)"


def rotated_features(att, x, positions, feature_map):
    q, k, v = att.split(x)
    if feature_map == "elu":
        q, k = F.elu(q) + 1, F.elu(k) + 1
    return q, k, v


@pytest.mark.parametrize("decay", ["retnet", "alibi"])
def test_softmax_takes_the_decay_as_the_score_bias_log_gamma_times_distance(decay):
    att = SoftmaxAttention(D, H, rope(decay=decay)).double()
    n = 21
    x = torch.randn(2, n, D, dtype=torch.float64, generator=gen("softmax-decay", decay))
    positions = torch.arange(n) + 7
    got, _ = att(x, positions)
    q, k, v = att.split(x)
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    dist = (positions[:, None] - positions[None, :]).double()
    s = (q @ k.transpose(-1, -2)) / HD**0.5 + torch.log(att.pos.gamma)[:, None, None] * dist
    s = s.masked_fill(dist < 0, float("-inf"))
    torch.testing.assert_close(got, att.merge(s.softmax(-1) @ v), rtol=1e-11, atol=1e-12)
    plain = SoftmaxAttention(D, H, rope()).double()
    plain.load_state_dict(att.state_dict())
    assert (plain(x, positions)[0] - got).abs().max() > 1e-4  # the decay acts


def by_hand(q, k, v, positions, gamma, placement, eps):
    """o_i = Σ_{j≤i} γ^(i-j) (R_i φq_i·R_j φk_j) v_j / (Σ_{j≤i} γ^(i-j) φq_i·φk_j + eps), elu+1, float64."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    rq, rk = apply_rope(fq, positions), apply_rope(fk, positions)
    dist = (positions[:, None] - positions[None, :]).double()
    w = torch.where(dist >= 0, gamma[:, None, None] ** dist.clamp_min(0), 0.0)
    num_q, num_k = (fq, fk) if placement == "none" else (rq, rk)
    den_q, den_k = (rq, rk) if placement == "both" else (fq, fk)
    num = ((num_q @ num_k.transpose(-1, -2)) * w) @ v
    den = ((den_q @ den_k.transpose(-1, -2)) * w).sum(-1) + eps
    if placement == "both":
        den = torch.copysign(den.abs().clamp_min(1e-2), den)
    return num / den[..., None]


@pytest.mark.parametrize("placement", ["numerator", "both", "none"])
def test_linear_rope_decay_in_every_form(placement):
    """naive, chunk (C=8, 45 positions: not a multiple), recurrent and the generation step equal the formula in
    float64; the gradients of chunk and recurrent equal naive's."""
    att = LinearAttention(D, H, rope(decay="retnet"), placement=placement, chunk_size=8).double()
    n = 45
    x = torch.randn(2, n, D, dtype=torch.float64, generator=gen("linear-decay", placement))
    positions = torch.arange(n) + 3
    q, k, v = att.split(x)
    want = att.merge(by_hand(q, k, v, positions, att.pos.gamma, placement, att.eps)).detach()
    grads = {}
    for impl in ("naive", "chunk", "recurrent"):
        att.impl = impl
        xx = x.clone().requires_grad_()
        out, _ = att(xx, positions)
        assert rel(out, want) < 1e-12, f"{impl}: {rel(out, want):.2e}"
        (grads[impl],) = torch.autograd.grad(out.pow(2).sum(), xx)
    for impl in ("chunk", "recurrent"):
        assert rel(grads[impl], grads["naive"]) < 1e-10, impl
    state, steps = None, []
    with torch.no_grad():
        for t in range(n):  # the generation step: one token at a time, carrying the state
            o, state = att(x[:, t : t + 1], positions[t : t + 1], state=state, return_state=True)
            steps.append(o)
    assert rel(torch.cat(steps, 1), want) < 1e-12


def test_linear_rope_decay_under_bf16_autocast_over_many_chunks():
    att = LinearAttention(D, H, rope(decay="retnet"), chunk_size=16)
    x = torch.randn(2, 200, D, generator=gen("decay-bf16"))
    positions = torch.arange(200)
    with torch.no_grad():
        att.impl = "naive"
        want, _ = att.double()(x.double(), positions)
        att.float()
        att.impl = "chunk"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, _ = att(x, positions)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert rel(got, want) < 3e-2  # the bf16 projections' rounding; the kernel computes in float32


def tiny_lm(kind, **position):
    return helpers.tiny_lm({"name": "rope", **position}, kind, max_len=16).double()


@pytest.mark.parametrize("kind", ["linear", "softmax"])
@pytest.mark.parametrize("row", ["pi", "ntk"])
def test_the_decay_survives_the_extrapolations_rope_rows(kind, row):
    """rope_row swaps RoPE's frequencies only: a decayed model inside a row equals the decayed model built with
    that scaling (the same weights), and the decay is the same tensor throughout."""
    torch.manual_seed(0)
    m = tiny_lm(kind, decay="retnet")
    scaled = tiny_lm(kind, decay="retnet", scaling=row, factor=2.0)
    scaled.load_state_dict(m.state_dict())
    undecayed = tiny_lm(kind, scaling=row, factor=2.0)
    undecayed.load_state_dict(m.state_dict())
    x = torch.randint(0, 32, (2, 32), generator=gen("rope-row", kind, row))
    schemes = [s for s in m.modules() if hasattr(s, "gamma")]
    gammas = [s.gamma for s in schemes]
    assert len(gammas) >= 2  # one per layer (and the model's own instance)
    with torch.no_grad():
        before = m(x)
        with rope_row(m, row, 2.0):
            assert all(s.gamma is g for s, g in zip(schemes, gammas))
            inside = m(x)
        after = m(x)
        torch.testing.assert_close(inside, scaled(x), rtol=1e-10, atol=1e-10)
        assert (inside - undecayed(x)).abs().max() > 1e-4  # the decay still acts inside the row
        assert (inside - before).abs().max() > 1e-6  # and the row changed the frequencies
    assert torch.equal(after, before)


def test_the_frequencies_stay_float64_when_the_model_changes_dtype():
    """θ is a function of the options, not a weight: .bfloat16() or .half() of a model must not round it (at position
    4095 a bf16 θ turns up to 1.8 rad away), so a bf16 model rotates as the float64 formula, rounded once."""
    want = rope().theta.clone()
    assert want.dtype == torch.float64
    for convert in (lambda m: m.float(), lambda m: m.bfloat16(), lambda m: m.half()):
        pos = convert(rope())
        assert pos.theta.dtype == torch.float64 and torch.equal(pos.theta, want)
        assert torch.equal(pos.linear_rope_theta(), want)
    positions = torch.arange(4000, 4096)
    q = torch.randn(1, H, positions.numel(), HD, generator=gen("theta dtype q"), dtype=torch.float64)
    got, _ = rope().bfloat16().rotate_qk(q.bfloat16(), q.bfloat16(), positions)
    exact, _ = rope().double().rotate_qk(q, q, positions)
    assert rel(got.double(), exact) < 1e-2  # bf16 rounding of q and of the product only
