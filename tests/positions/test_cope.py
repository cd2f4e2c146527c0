"""CoPE (Golovneva, Wang, Weston, Sukhbaatar 2024; docs/schemes.md#cope): the paper's formula as a scalar loop in
float64, its independence of the positions, its reduction to plain attention (e = 0) and to relative positions
(every gate 1), its gradients, bf16 autocast, and why it refuses linear and bidirectional attention (the refusals themselves: the
contract suite, test_contract.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linrope.models.attention import SoftmaxAttention
from linrope.models.model import TransformerLM
from linrope.positions import REGISTRY, build_position
from linrope.positions.cope import contextual_positions, interpolated_logits

D, H, HD = 16, 2, 8  # d_model, heads, head dim


def cope_attention(*, max_len=32, table_std=1.5, **opts):
    """A float64 softmax layer with CoPE; its table drawn large (std 1.5) and its q, k projections scaled so that
    the gates spread over (0, 1) rather than sitting at 1/2."""
    pos = build_position("cope", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=max_len, **opts)
    att = SoftmaxAttention(D, H, pos, causal=True).double()
    with torch.no_grad():
        att.pos.table.normal_(0.0, table_std)
        att.qkv.weight[: 2 * D].mul_(2.0)
    return att


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b))


def paper_attention(q, k, v, table, npos_max: int, divide_position: bool):
    """o_i = Σ_{j≤i} softmax_j(s_ij) v_j, the paper's formula element by element in Python floats:
    g_it = σ(q_i·k_t/√d), p_ij = min(Σ_{t=j..i} g_it, npos_max - 1),
    e[p] = (p - ⌊p⌋)·e[⌈p⌉] + (1 - p + ⌊p⌋)·e[⌊p⌋]  (the embedding interpolated, then dotted with q_i),
    s_ij = q_i·k_j/√d + c·q_i·e[p_ij], c = 1/√d (the release) or 1 (the paper's listing)."""
    q, k, v, e = q.tolist(), k.tolist(), v.tolist(), table.tolist()
    B, Hh, N, d = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])
    root = math.sqrt(d)
    out = torch.zeros(B, Hh, N, len(v[0][0][0]), dtype=torch.float64)
    for b in range(B):
        for h in range(Hh):
            for i in range(N):
                qi = q[b][h][i]
                scores = []
                for j in range(i + 1):
                    p = min(sum(sigmoid(dot(qi, k[b][h][t]) / root) for t in range(j, i + 1)), npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    ep = [(p - lo) * e[hi][c] + (1 - p + lo) * e[lo][c] for c in range(d)]
                    pos_term = dot(qi, ep) / (root if divide_position else 1.0)
                    scores.append(dot(qi, k[b][h][j]) / root + pos_term)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j, w in enumerate(weights):
                    out[b, h, i] += torch.tensor(v[b][h][j], dtype=torch.float64) * (w / total)
    return out


@pytest.mark.parametrize(
    "opts,n",
    [
        ({}, 10),
        ({"npos_max": 4}, 10),
        ({"position_scale": "paper"}, 9),
        ({"npos_max": 3, "position_scale": "paper"}, 11),
    ],
    ids=["release", "release-clamped", "paper", "paper-clamped"],
)
def test_formula_against_the_paper_float64(opts, n):
    torch.manual_seed(n + len(opts))
    att = cope_attention(**opts)
    x = torch.randn(2, n, D, dtype=torch.float64) * 1.5
    positions = torch.arange(n) + 5
    q, k, v = att.split(x)
    npos_max = opts.get("npos_max", 33)  # default: max_len + 1
    assert att.pos.npos_max == npos_max and att.pos.table.shape == (npos_max, HD)
    want = att.merge(paper_attention(q, k, v, att.pos.table, npos_max, opts.get("position_scale") != "paper"))
    torch.testing.assert_close(att(x, positions)[0], want, rtol=1e-9, atol=1e-10)
    # the inputs reach every regime: gates far from 1/2, fractional positions, the clamp where npos_max is small
    seen = torch.ones(n, n, dtype=torch.bool).tril().expand(2, H, n, n)
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(HD))[seen]
    assert gates.std() > 0.3 and (gates - 0.5).abs().gt(0.2).float().mean() > 0.5
    p = contextual_positions(q, k, HD**-0.5, npos_max)[seen]
    free = p[p < npos_max - 1]
    assert ((free - free.floor() - 0.5).abs() < 0.45).float().mean() > 0.5
    if "npos_max" in opts:
        assert p.eq(npos_max - 1).float().mean() > 0.2


def test_the_position_term_moves_the_output_and_reduces_to_plain_attention_at_zero():
    att = cope_attention()
    x = torch.randn(2, 9, D, dtype=torch.float64)
    positions = torch.arange(9)
    q, k, v = att.split(x)
    plain = att.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert (att(x, positions)[0] - plain).abs().max() > 1e-3
    with torch.no_grad():
        att.pos.table.zero_()  # as both codes start it: CoPE adds nothing
    torch.testing.assert_close(att(x, positions)[0], plain, rtol=1e-12, atol=1e-12)


def test_forms_differ_by_the_scale_of_the_position_term():
    """release: (q·k + q·e[p]) / √d; paper: q·k / √d + q·e[p]: the paper's bias is √d times the release's."""
    release, paper = cope_attention(), cope_attention(position_scale="paper")
    paper.load_state_dict(release.state_dict())
    assert release.pos.position_scale == "release"  # the default: the released code's
    q, k = release.split(torch.randn(2, 7, D, dtype=torch.float64))[:2]
    want = release.pos.score_bias(q, k, torch.arange(7)) * math.sqrt(HD)
    torch.testing.assert_close(paper.pos.score_bias(q, k, torch.arange(7)), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="position_scale=both: expected one of release, paper"):
        cope_attention(position_scale="both")


def test_saturated_gates_count_tokens():
    """Every gate 1 (q·k large): p_ij = i - j + 1, token-based relative positions, clamped at npos_max - 1."""
    n = 7
    q = torch.full((1, 1, n, 4), 10.0, dtype=torch.float64)
    p = contextual_positions(q, q, 0.5, 100)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    torch.testing.assert_close(p[0, 0], torch.where(j <= i, i - j + 1, 0).double())
    torch.testing.assert_close(
        contextual_positions(q, q, 0.5, 4)[0, 0], torch.where(j <= i, (i - j + 1).clamp(max=3), 0).double()
    )


def test_interpolation_between_rows():
    z = torch.tensor([[0.0, 10.0, 30.0, 70.0]], dtype=torch.float64)  # one query, four rows
    p = torch.tensor([[0.0, 0.25, 1.5, 2.0, 2.75, 3.0]], dtype=torch.float64)
    want = torch.tensor([[0.0, 2.5, 20.0, 30.0, 60.0, 70.0]], dtype=torch.float64)
    torch.testing.assert_close(interpolated_logits(z, p), want)


def test_gradients_through_gates_interpolation_and_table():
    """Analytic gradients (through the gates, the interpolation weight and the table) match finite differences."""
    torch.manual_seed(3)
    scheme = build_position("cope", where="attention", d_model=4, n_heads=1, head_dim=4, max_len=5, npos_max=4)
    del scheme.table  # the table becomes an input of the check
    q = (torch.randn(1, 1, 5, 4, dtype=torch.float64) * 1.5).requires_grad_()
    k = (torch.randn(1, 1, 5, 4, dtype=torch.float64) * 1.5).requires_grad_()
    table = torch.randn(4, 4, dtype=torch.float64).requires_grad_()

    def bias(q, k, table):
        scheme.table = table
        return scheme.score_bias(q, k, torch.arange(5))

    assert torch.autograd.gradcheck(bias, (q, k, table))
    out = bias(q, k, table)
    (out * torch.randn_like(out)).sum().backward()
    assert table.grad.abs().sum() > 0 and k.grad.abs().sum() > 0  # k only through the gates


@pytest.mark.parametrize("n", [9, 40])
def test_it_ignores_the_positions(n):
    """CoPE counts with gates, never with positions: any positions, shifted or not, give the same output."""
    att = cope_attention(max_len=64)
    x = torch.randn(2, n, D, dtype=torch.float64)
    out = att(x, torch.arange(n))[0]
    assert torch.equal(att(x, torch.arange(n) + 1000)[0], out)
    assert torch.equal(att(x, torch.randperm(5 * n)[:n].sort().values)[0], out)
    m = TransformerLM(
        dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, position={"name": "cope"})
    ).double()
    with torch.no_grad():
        for b in m.blocks:
            b.attn.pos.table.normal_()
    tokens = torch.randint(0, 32, (2, 10))
    assert torch.equal(m(tokens, offset=23), m(tokens))


def test_longer_than_max_len_clamps():
    """No table of max_len positions: a longer window clamps its positions at npos_max - 1 and runs."""
    assert not REGISTRY["cope"].bounded_by_max_len({"npos_max": None, "position_scale": "release"})
    m = TransformerLM(
        dict(vocab_size=32, d_model=32, n_layers=1, n_heads=4, d_ff=64, max_len=8, position={"name": "cope"})
    )
    assert m.blocks[0].attn.pos.table.shape == (9, 8) and m.blocks[0].attn.pos.table.abs().sum() == 0
    assert torch.isfinite(m(torch.randint(0, 32, (1, 40)))).all()


def test_bf16_autocast_counts_in_float32():
    """Under bf16 autocast the gates, their sums and the bias are float32: the bias is the float32 computation of
    the bf16 q and k, bit for bit, not a bf16 one."""
    scheme = build_position("cope", where="attention", d_model=64, n_heads=4, head_dim=16, max_len=128)
    with torch.no_grad():
        scheme.table.normal_()
    x = torch.randn(1, 128, 64)
    lin = torch.nn.Linear(64, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qk = lin(x)
        assert qk.dtype == torch.bfloat16
        q, k = qk.view(1, 128, 2, 4, 16).permute(2, 0, 3, 1, 4)
        bias = scheme.score_bias(q, k, torch.arange(128))
    assert bias.dtype == torch.float32
    assert torch.equal(bias, scheme.score_bias(q.float(), k.float(), torch.arange(128)))
    p = contextual_positions(q.float(), k.float(), 0.25, 129)
    assert p[0, 0, -1, 0] > 40  # sums that bf16 (8 bits) could not hold to the interpolation's precision


def test_the_refusals_say_why():
    """Linear attention's and a bidirectional model's refusals (test_contract.py) give these reasons."""
    assert "gates σ(q_i·k_t) of every query-key pair" in REGISTRY["cope"].linear_note
    assert REGISTRY["cope"].causal_only == (
        "its positions p_ij = Σ_{t=j..i} σ(q_i·k_t) count from the key up to the query, defined for keys at or behind "
        "it (the paper and its release train decoders); use a causal model"
    )
