"""Partial rotary (``model.position.rotary_fraction``, GPT-NeoX's ``rotary_pct``): against NeoX's formula written
out here independently of linrope's rotation (half-split ``rotate_half`` on the first r dimensions, the others passed
through, frequencies ``base^(-2t/r)``), in float64, for softmax attention and for every float64 form of linear
attention.  linrope's interleaved pairs with θ = 0 beyond the first r/2 are NeoX's layout up to the fixed permutation
``neox_to_ours`` of each head's dimensions."""

import pytest
import torch
import torch.nn.functional as F

from linrope.evaluation.extrapolation import row_scaling
from linrope.models.attention import SoftmaxAttention
from linrope.ops import linear_attention
from linrope.ops.rope import rope_frequencies
from linrope.positions import build_position
from tests.helpers import gen, rel

pytestmark = pytest.mark.usefixtures("kernel_env")

D, H, HD, BASE = 64, 2, 32, 10000.0


def rope(**opts):
    return build_position("rope", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=64, **opts)


def neox_rotate(x, positions, r, base=BASE):
    """GPT-NeoX's partial rotary on x (..., N, d): rotate_half on x[..., :r], x[..., r:] untouched."""
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    return torch.cat((rot * cos + half * sin, rest), dim=-1)


def neox_to_ours(d, r):
    """perm with x_ours = x_neox[..., perm]: our pair t (dims 2t, 2t+1) is NeoX's (t, t + r/2) for t < r/2; the
    dimensions from r on are the unrotated ones in both."""
    perm = []
    for t in range(r // 2):
        perm += [t, t + r // 2]
    return torch.tensor(perm + list(range(r, d)))


def test_fraction_one_is_todays_rope_bit_for_bit():
    assert torch.equal(rope().theta, rope_frequencies(HD))
    assert torch.equal(rope(rotary_fraction=1.0).theta, rope_frequencies(HD))
    q, k = torch.randn(2, 1, H, 9, HD, generator=gen("one")).unbind(0)
    pos = torch.arange(3, 12)
    qa, ka = rope().rotate_qk(q, k, pos)
    from linrope.ops.rope import apply_rope

    assert torch.equal(qa, apply_rope(q, pos)) and torch.equal(ka, apply_rope(k, pos))


@pytest.mark.parametrize("fraction, r", [(0.25, 8), (0.5, 16), (0.3, 8)])  # int(32·0.3) = 9 is odd: refused below
def test_frequencies_are_neoxs_then_zero(fraction, r):
    if fraction == 0.3:
        with pytest.raises(ValueError, match=r"int\(32·0.3\) = 9 .* even number >= 2"):
            rope(rotary_fraction=fraction)
        return
    s = rope(rotary_fraction=fraction)
    assert s.rotary_dims == r
    want = 1.0 / (BASE ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    assert torch.allclose(s.theta[: r // 2], want, rtol=1e-15, atol=0)
    assert torch.equal(s.theta[r // 2 :], torch.zeros(HD // 2 - r // 2, dtype=torch.float64))
    # the extrapolation's rows scale the turned pairs only (NTK over r dimensions, as NeoX would) and keep θ = 0
    for row in ("pi", "ntk", "yarn"):
        theta = row_scaling(s, row, 4.0, train_context=64)["theta"]
        assert torch.equal(theta[r // 2 :], torch.zeros(HD // 2 - r // 2, dtype=torch.float64))
        kw = {"original_context": 64} if row == "yarn" else {}
        assert torch.allclose(theta[: r // 2], rope_frequencies(r, BASE, scaling=row, factor=4.0, **kw), rtol=1e-14)
    # dynamic NTK at a forward of 4 × the context rescales the turned pairs over r dimensions, the rest stay 0
    d = rope(rotary_fraction=fraction, scaling="dynamic", factor=1.0)
    theta = d.frequencies(4 * d.original_context)
    assert torch.equal(theta[r // 2 :], torch.zeros(HD // 2 - r // 2, dtype=torch.float64))
    assert torch.allclose(theta[: r // 2], rope_frequencies(r, BASE, scaling="ntk", factor=4.0), rtol=1e-14)


def test_too_small_a_fraction_is_one_line():
    with pytest.raises(ValueError, match=r"^rope: rotary_fraction=0.05 rotates int\(32·0.05\) = 1 of head_dim=32"):
        rope(rotary_fraction=0.05)
    from linrope.positions import option_errors

    (line,) = option_errors("rope", {"rotary_fraction": 0})
    assert line.startswith("model.position.rotary_fraction=0: expected a number > 0 and <= 1")


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_softmax_attention_is_neoxs_partial_rotary(fraction):
    """The whole layer (SDPA path) against NeoX's formula: q, k, v read from the layer's projection, q and k
    taken to NeoX's layout, rotated as NeoX, attended by a causal softmax loop, merged by the layer's output."""
    r = int(HD * fraction)
    att = SoftmaxAttention(D, H, rope(rotary_fraction=fraction)).double()
    x = torch.randn(2, 11, D, generator=gen("softmax", fraction), dtype=torch.float64)
    pos = torch.arange(5, 16)  # not from 0: the offset must not matter to a relative scheme, nor to NeoX
    out, _ = att(x, pos)

    q, k, v = att.split(x)
    inv = torch.argsort(neox_to_ours(HD, r))
    qn, kn = neox_rotate(q[..., inv], pos, r), neox_rotate(k[..., inv], pos, r)
    o = torch.zeros_like(v)
    for i in range(x.shape[1]):
        s = torch.einsum("bhd,bhjd->bhj", qn[:, :, i], kn[:, :, : i + 1]) / HD**0.5
        o[:, :, i] = torch.einsum("bhj,bhjd->bhd", s.softmax(-1), v[:, :, : i + 1])
    want = att.merge(o)
    assert rel(out, want) < 1e-13
    # and the pairs beyond r/2 are really left alone: rotating every pair instead changes the output
    full = SoftmaxAttention(D, H, rope()).double()
    full.load_state_dict(att.state_dict())
    assert rel(full(x, pos)[0], want) > 1e-3


@pytest.mark.parametrize("impl", ["naive", "chunk", "recurrent"])
@pytest.mark.parametrize("placement", ["numerator", "both"])
def test_linear_attention_takes_it_unchanged_in_every_form(impl, placement):
    """linear_rope_theta is the padded θ: every float64 form against linear attention written with NeoX's
    rotation (φ = elu + 1 first, then NeoX's partial rotary on φ(q), φ(k) in the numerator, or in both)."""
    fraction, n = 0.25, 13  # 13: not a multiple of the chunk size
    r = int(HD * fraction)
    s = rope(rotary_fraction=fraction)
    g = gen("linear", impl, placement)
    q, k, v = (torch.randn(2, H, n, HD, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(7, 7 + n)
    out = linear_attention(q, k, v, impl=impl, chunk_size=4, positions=pos, rope=placement,
                           rope_theta=s.linear_rope_theta(), feature_map="elu")  # fmt: skip

    inv = torch.argsort(neox_to_ours(HD, r))
    fq, fk = F.elu(q[..., inv]) + 1, F.elu(k[..., inv]) + 1
    rq, rk = neox_rotate(fq, pos, r), neox_rotate(fk, pos, r)
    dq, dk = (rq, rk) if placement == "both" else (fq, fk)
    want = torch.zeros_like(v)
    for i in range(n):
        num = torch.einsum("bhd,bhjd->bhj", rq[:, :, i], rk[:, :, : i + 1])
        den = torch.einsum("bhd,bhjd->bhj", dq[:, :, i], dk[:, :, : i + 1]).sum(-1, keepdim=True)
        want[:, :, i] = torch.einsum("bhj,bhjd->bhd", num, v[:, :, : i + 1]) / (den + 1e-6)
    assert torch.isfinite(out).all()
    assert rel(out, want) < 1e-12
    # the fraction matters: full rotary gives another output
    full = linear_attention(q, k, v, impl=impl, chunk_size=4, positions=pos, rope=placement,
                            rope_theta=rope().linear_rope_theta(), feature_map="elu")  # fmt: skip
    assert rel(full, want) > 1e-3
