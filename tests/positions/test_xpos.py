"""xPos (Sun et al. 2023) against its formula written out here: the score of pair t between a query at i and a key
at j is ζ_t^((i-j)/scale_base)·Re(q_t·conj(k_t)·e^{i(i-j)θ_t}), ζ_t = (2t + γd)/((1+γ)d) (a float64 loop); against
torchscale's released computation (centred scale, rotation from 0, rotate_every_two, k downscaled), written out as
numpy-style float64; relative shifts; bf16 at 16× a 256 context; the safe-length refusal; blockwise causal
attention; why linear attention refuses it (the refusal itself: the contract suite, test_contract.py)."""

import copy
import math

import pytest
import torch

from linrope.base.errors import SequenceTooLong
from linrope.models.attention import SoftmaxAttention
from linrope.positions import REGISTRY, build_position
from tests.helpers import gen, rel

D, H, HD, BASE = 32, 2, 16, 10000.0


def xpos(*, causal=True, max_len=64, **opts):
    return build_position("xpos", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=max_len,
                          causal=causal, **opts)  # fmt: skip


def layer(**opts):
    return SoftmaxAttention(D, H, xpos(**opts), causal=opts.get("causal", True)).double()


def paper_score(q, k, i, j, scale_base, gamma):
    """Σ_t ζ_t^((i-j)/scale_base) Re(q_t conj(k_t) e^{i(i-j)θ_t}), q_t = q[2t] + i q[2t+1], element by element."""
    d, total = q.shape[-1], 0.0
    for t in range(d // 2):
        theta = BASE ** (-2.0 * t / d)
        zeta = (2 * t + gamma * d) / ((1 + gamma) * d)
        a, b, c, e = q[2 * t].item(), q[2 * t + 1].item(), k[2 * t].item(), k[2 * t + 1].item()
        phi = (i - j) * theta
        total += zeta ** ((i - j) / scale_base) * ((a * c + b * e) * math.cos(phi) - (b * c - a * e) * math.sin(phi))
    return total


def loop_output(q, k, v, positions, scale_base, gamma, allowed):
    B, Hh, N, d = q.shape
    o = torch.zeros_like(v)
    for b in range(B):
        for h in range(Hh):
            for i in range(N):
                js = [j for j in range(N) if allowed(i, j)]
                s = torch.tensor([paper_score(q[b, h, i], k[b, h, j], int(positions[i]), int(positions[j]),
                                              scale_base, gamma) for j in js], dtype=torch.float64) / d**0.5  # fmt: skip
                o[b, h, i] = (s.softmax(-1)[:, None] * v[b, h, js]).sum(0)
    return o


@pytest.mark.parametrize("scale_base, gamma", [(512.0, 0.4), (4.0, 0.4), (2.0, 1.5)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_layer_is_the_formula_in_float64(scale_base, gamma, causal):
    """Small scale_base: the scale moves the output by far more than the tolerance at N = 11."""
    att = layer(scale_base=scale_base, gamma=gamma, causal=causal)
    x = torch.randn(2, 11, D, generator=gen("formula", scale_base, gamma, causal), dtype=torch.float64)
    pos = torch.arange(4, 15)
    out, _ = att(x, pos)
    q, k, v = att.split(x)
    want = att.merge(
        loop_output(q, k, v, pos, scale_base, gamma, (lambda i, j: j <= i) if causal else (lambda i, j: True))
    )
    assert rel(out, want) < 1e-12
    if scale_base < 100:  # the scale is really there: plain RoPE (ζ = 1) gives another output
        rope = SoftmaxAttention(D, H, build_position("rope", where="attention", d_model=D, n_heads=H, head_dim=HD,
                                                     max_len=64), causal=causal).double()  # fmt: skip
        rope.load_state_dict(att.state_dict())
        assert rel(rope(x, pos)[0], want) > 1e-3


def torchscale_xpos(x, scale_base=512.0, downscale=False):
    """torchscale's XPOS.forward (offset 0) on x (B·H, L, d), written out in float64."""
    L, d = x.shape[1], x.shape[2]
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    min_pos = -L // 2
    scale = zeta ** (torch.arange(min_pos, min_pos + L, dtype=torch.float64) / scale_base)[:, None]
    inv_freq = 1.0 / (BASE ** (torch.arange(0, d // 2, dtype=torch.float64) / (d // 2)))
    ang = torch.arange(0, L, dtype=torch.float64)[:, None] * inv_freq[None, :]
    sin, cos = ang.sin(), ang.cos()
    if downscale:
        scale = 1 / scale
    sin, cos = (torch.repeat_interleave(t * scale, 2, dim=-1) for t in (sin, cos))
    every_two = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos + every_two * sin


@pytest.mark.parametrize("n", [9, 10])  # odd and even: the centre is ceil(N/2) as the release's -(L) // 2
def test_rotated_q_and_k_are_torchscales(n):
    s = xpos(scale_base=8.0)  # a small base, so an off-by-one centre changes q by ζ^(1/8), far beyond tolerance
    q, k = torch.randn(2, 1, H, n, HD, generator=gen("release", n), dtype=torch.float64).unbind(0)
    qr, kr = s.rotate_qk(q, k, torch.arange(n))
    assert rel(qr[0], torchscale_xpos(q[0], 8.0)) < 1e-14
    assert rel(kr[0], torchscale_xpos(k[0], 8.0, downscale=True)) < 1e-14


def test_scores_depend_on_i_minus_j_only():
    """The same q and k at every position: each diagonal of the score matrix is constant, whatever the window's
    offset and length (the centre moves with both and cancels)."""
    s = xpos(scale_base=4.0)
    g = gen("shift")
    q0, k0 = torch.randn(2, HD, generator=g, dtype=torch.float64)
    for offset, n in ((0, 12), (37, 12), (1000, 7)):
        pos = torch.arange(offset, offset + n)
        qr, kr = s.rotate_qk(q0.expand(1, 1, n, HD), k0.expand(1, 1, n, HD), pos)
        S = (qr @ kr.transpose(-1, -2))[0, 0]
        for delta in range(-n + 1, n):
            diag = torch.diagonal(S, offset=-delta)
            want = paper_score(q0, k0, delta, 0, 4.0, 0.4)
            assert (diag - want).abs().max() < 1e-12 * max(1.0, abs(want)), (offset, n, delta)


def test_output_is_the_same_at_any_offset_and_for_any_prefix():
    att = layer(scale_base=4.0)
    x = torch.randn(1, 12, D, generator=gen("prefix"), dtype=torch.float64)
    ref, _ = att(x, torch.arange(12))
    assert rel(att(x, torch.arange(500, 512))[0], ref) < 1e-12
    assert rel(att(x[:, :7], torch.arange(7))[0], ref[:, :7]) < 1e-12  # causal: a shorter window, the same outputs


def test_bf16_at_16x_a_256_context():
    """N = 4096 under bf16 autocast (the layer's SDPA path): finite, and rows at both ends and the middle agree with
    the float64 formula to bf16's accuracy.  The scale tables themselves, float32, are the float64 ones rounded."""
    n, dims = 16 * 256, dict(d_model=16, n_heads=1, head_dim=16, max_len=256)
    pos_scheme = build_position("xpos", where="attention", **dims)
    att = SoftmaxAttention(16, 1, pos_scheme)
    x = torch.randn(1, n, 16, generator=gen("bf16"))
    pos = torch.arange(n)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = att(x, pos)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()

    tables32 = pos_scheme.scaled_tables(pos, torch.float32)
    tables64 = pos_scheme.scaled_tables(pos, torch.float64)
    for a, b in zip(tables32, tables64):
        assert torch.equal(a, b.float())
    assert tables64[2].abs().max() > 100  # the key's scale reaches ζ_0^(-4) ≈ 150 at the window's start
    # bf16 q and k rotated and scaled: torchscale's computation in float64 on the same inputs, to bf16's rounding
    qb, kb = torch.randn(2, 1, n, 16, generator=gen("bf16 qk")).bfloat16().unbind(0)
    qr, kr = pos_scheme.rotate_qk(qb[None], kb[None], pos)
    assert qr.dtype == torch.bfloat16
    assert rel(qr[0], torchscale_xpos(qb.double())) < 4e-3
    assert rel(kr[0], torchscale_xpos(kb.double(), downscale=True)) < 4e-3

    att64 = copy.deepcopy(att).double()
    q, k, v = att64.split(x.double())
    zeta = torch.tensor([(2 * t + 0.4 * 16) / (1.4 * 16) for t in range(8)], dtype=torch.float64)
    theta = BASE ** (-2.0 * torch.arange(8, dtype=torch.float64) / 16)
    rows = [0, 1, 2, 2047, 2048, n - 2, n - 1]
    o = torch.zeros(1, 1, len(rows), 16, dtype=torch.float64)
    for r, i in enumerate(rows):
        dist = (i - torch.arange(i + 1, dtype=torch.float64))[:, None]  # (j, 1)
        a, b = q[0, 0, i, 0::2], q[0, 0, i, 1::2]
        c, e = k[0, 0, : i + 1, 0::2], k[0, 0, : i + 1, 1::2]
        phi = dist * theta
        s = (zeta ** (dist / 512.0) * ((a * c + b * e) * phi.cos() - (b * c - a * e) * phi.sin())).sum(-1) / 4.0
        o[0, 0, r] = s.softmax(-1) @ v[0, 0, : i + 1]
    want = att64.merge(o)
    got = out[:, rows]
    assert rel(got, want) < 1e-2


def test_a_window_beyond_the_safe_length_is_one_line():
    s = xpos()
    q = torch.zeros(1, 1, 2, HD)
    with pytest.raises(SequenceTooLong, match=r"^xpos: a window of 20001 positions is beyond 18131, .* float32;"):
        s.rotate_qk(q, q, torch.tensor([0, 20000]))
    s.rotate_qk(q.double(), q.double(), torch.tensor([0, 20000]))  # float64 has the range
    with pytest.raises(SequenceTooLong, match=r"^xpos: a window of 3000 positions is beyond 2267, .* float16;"):
        s.rotate_qk(q.half(), q.half(), torch.tensor([0, 2999]))  # fp16 autocast: the kernel's dtype is q's


def test_zeta_and_theta_stay_float64_buffers():
    s = xpos()
    want = (torch.arange(0, HD, 2, dtype=torch.float64) + 0.4 * HD) / (1.4 * HD)
    assert torch.equal(s.zeta, want)
    s.bfloat16()
    assert s.zeta.dtype == torch.float64 and s.theta.dtype == torch.float64
    assert torch.equal(s.zeta, want) and not list(s.parameters()) and not s.state_dict()


def test_blockwise_is_the_papers_blocks_of_half_the_training_length():
    """Blocks of max_len/2 from the window's start; a query sees its own block and the previous one (and nothing
    ahead). At most max_len positions that is every earlier key; beyond, the formula with those keys."""
    att = layer(scale_base=4.0, blockwise=True, max_len=8)  # blocks of 4
    plain = layer(scale_base=4.0, max_len=8)
    plain.load_state_dict(att.state_dict())
    x = torch.randn(1, 12, D, generator=gen("blockwise"), dtype=torch.float64)
    assert rel(att(x[:, :8], torch.arange(8))[0], plain(x[:, :8], torch.arange(8))[0]) < 1e-13
    pos = torch.arange(100, 112)
    out, _ = att(x, pos)
    q, k, v = att.split(x)
    want = att.merge(loop_output(q, k, v, pos, 4.0, 0.4, lambda i, j: j <= i and j // 4 >= i // 4 - 1))
    assert rel(out, want) < 1e-12
    assert rel(plain(x, pos)[0], want) > 1e-3  # beyond max_len the blocks hide keys
    with pytest.raises(ValueError, match="blockwise .* causal=false"):
        xpos(causal=False, blockwise=True)


@pytest.mark.parametrize("max_len", [7, 8, 9, 255])
def test_blockwise_hides_nothing_within_an_odd_training_length(max_len):
    """Blocks of max_len/2 rounded up: within max_len positions a query sees every earlier key, odd max_len too
    (blocks of max_len // 2 hid 3 keys at max_len 7, 127 at 255)."""
    s = xpos(blockwise=True, max_len=max_len)
    q = torch.zeros(1, H, max_len, HD)
    pos = torch.arange(max_len) + 1000
    assert torch.equal(s.score_bias(q, q, pos), torch.zeros(max_len, max_len))
    beyond = torch.arange(2 * max_len + 1)
    assert s.score_bias(torch.zeros(1, H, beyond.numel(), HD), None, beyond).isinf().any()  # beyond: hides keys


def test_linear_note_names_the_per_dimension_decay():
    """Linear attention's refusal (test_contract.py) gives the note: the kernels carry a per-head decay only."""
    assert "per-dimension decay" in REGISTRY["xpos"].linear_note
