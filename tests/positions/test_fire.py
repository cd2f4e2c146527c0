"""FIRE (docs/schemes.md#fire): its bias and its attention against the paper's formula written as a scalar loop in
float64, the one shift property it has (none once a query passes the threshold L), its init, per-layer parameters
and the paper's FIRE-S sharing.  The pairings it refuses (linear attention, bidirectional attention), FIRE-S's one bias
per forward, bf16 training and compile: the contract suite (test_contract.py)."""

from __future__ import annotations

import math

import pytest
import torch

import linrope.positions.fire as fire_module
from linrope.models.attention import SoftmaxAttention
from linrope.models.model import TransformerLM, weight_decay_split
from tests.positions.contract import HD, D, H, attention


def layer(threshold: float, *, width: int = 6, **opts) -> SoftmaxAttention:
    """A float64 FIRE attention layer, its parameters drawn large (every term moves the output), c negative and
    L = ``threshold`` reached through a negative multiplier (the scheme uses |c| and |m·L₀|)."""
    att = attention("fire", max_len=64, randomize=False, mlp_width=width, **opts)
    pos = att.pos
    with torch.no_grad():
        for p in (pos.w1, pos.b1, pos.w2, pos.b2):
            p.normal_(0.0, 1.0)
        pos.c.fill_(-float(torch.empty(()).uniform_(0.2, 2.0)))
        pos.l_mult.fill_(-threshold / pos.init_threshold)
    return att


def paper_bias(pos, h: int, i: int, j: int) -> float:
    """b_h(i, j) = f_θ(ψ(i - j) / (ψ(max(L, i)) + eps)), ψ(x) = log(c·x + 1), f_θ(u) = W2 relu(w1 u + b1) + b2: the
    paper's formula (with its code's eps), one scalar at a time from the parameters' values."""
    c = abs(pos.c.item())
    L = abs(pos.l_mult.item() * pos.init_threshold)

    def psi(x):
        return math.log(c * x + 1.0)

    u = psi(i - j) / (psi(max(L, i)) + pos.eps)
    w1, b1, w2, b2 = (t.tolist() for t in (pos.w1, pos.b1, pos.w2, pos.b2))
    return sum(w2[h][k] * max(0.0, w1[k] * u + b1[k]) for k in range(len(w1))) + b2[h]


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["code", "paper"])
def test_bias_and_attention_follow_the_formula(eps):
    """Queries on both sides of L (positions 14..25, L = 19.5): the bias of every visible (i, j) and the attention
    output, s_ij = q_i·k_j / sqrt(d) + b_h(i, j) through a scalar softmax, match the loop."""
    att = layer(19.5, eps=eps)
    pos, n = att.pos, 12
    x = torch.randn(2, n, D, dtype=torch.float64)
    positions = torch.arange(n) + 14
    p = positions.tolist()
    with torch.no_grad():
        q, k, v = att.split(x)
        bias = pos.score_bias(q, k, positions)
    assert bias.shape == (1, H, n, n) and bias.dtype == torch.float64
    b_, q_, k_, v_ = bias[0].tolist(), q.tolist(), k.tolist(), v.tolist()
    want = [[[[0.0] * HD for _ in range(n)] for _ in range(H)] for _ in range(2)]
    for h in range(H):
        for i in range(n):
            paper = [paper_bias(pos, h, p[i], p[j]) for j in range(i + 1)]
            for j in range(i + 1):
                assert abs(b_[h][i][j] - paper[j]) < 1e-12, (h, i, j)
            for b in range(2):
                s = [
                    sum(a * c for a, c in zip(q_[b][h][i], k_[b][h][j])) / math.sqrt(HD) + paper[j]
                    for j in range(i + 1)
                ]
                e = [math.exp(t - max(s)) for t in s]
                for j in range(i + 1):
                    for d in range(HD):
                        want[b][h][i][d] += e[j] / sum(e) * v_[b][h][j][d]
    want = torch.tensor(want, dtype=torch.float64)
    torch.testing.assert_close(att(x, positions)[0], att.merge(want), rtol=1e-10, atol=1e-12)


def test_shift_invariant_only_while_every_query_is_below_the_threshold():
    """While max(L, i) = L for every query, the bias is f_θ(ψ(i - j)/ψ(L)): a function of i - j, so shifting the
    window changes nothing.  Past L the normaliser is ψ(i): a shift changes the output (FIRE is not relative)."""
    att = layer(40.0)
    x = torch.randn(2, 10, D, dtype=torch.float64)
    positions = torch.arange(10)
    out = att(x, positions)[0]
    torch.testing.assert_close(att(x, positions + 30)[0], out, rtol=1e-10, atol=1e-12)  # last query 39 < 40
    assert (att(x, positions + 45)[0] - out).abs().max() > 1e-3  # every query past L
    assert (att(x, positions * 2)[0] - out).abs().max() > 1e-3  # other distances, other output


def test_diagonal_is_f_of_zero_at_every_position():
    """Distance 0 maps to 0 whatever the normaliser: b_h(i, i) = f_θ(0)_h on both sides of L."""
    att = layer(5.0)
    positions = torch.arange(12) * 3
    bias = att.pos.position_bias(positions, torch.float64)[0]
    f0 = att.pos.w2.double() @ torch.relu(att.pos.b1.double()) + att.pos.b2.double()
    torch.testing.assert_close(torch.diagonal(bias, dim1=-2, dim2=-1), f0[:, None].expand(H, 12))


def test_blocks_of_query_rows_give_the_same_bias(monkeypatch):
    att = layer(7.0)
    positions = torch.arange(13) + 2
    whole = att.pos.position_bias(positions, torch.float64)
    monkeypatch.setattr(fire_module, "HIDDEN_BUDGET", 13 * 6 * 3)  # 3 rows at a time: 5 blocks
    torch.testing.assert_close(att.pos.position_bias(positions, torch.float64), whole, rtol=0, atol=0)


def test_bias_is_float32_under_bf16_autocast_and_learns_c_and_l():
    """Under bf16 autocast f_θ still runs in float32 (its bias is rounded once, by the attention's mask cast)."""
    att = layer(6.0).float()
    x = torch.randn(1, 9, D)
    positions = torch.arange(9)
    q, k, _ = att.split(x)
    exact = att.pos.score_bias(q, k, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, _ = att.split(x)
        bias = att.pos.score_bias(q, k, positions)
        out = att(x, positions)[0]
    assert bias.dtype == torch.float32
    torch.testing.assert_close(bias, exact, rtol=1e-6, atol=1e-6)
    out.float().pow(2).sum().backward()
    for name, p in att.pos.named_parameters():  # queries on both sides of L = 6: L's multiplier moves too
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def tiny(n_layers=2, **opts):
    return TransformerLM(
        dict(
            vocab_size=32,
            d_model=32,
            n_layers=n_layers,
            n_heads=4,
            d_ff=64,
            max_len=64,
            position={"name": "fire", **opts},
        )  # fmt: skip
    )


def test_init_is_torch_linear_and_survives_the_model_init():
    """The paper's code builds f_θ from nn.Linear: weights and biases uniform in ±1/sqrt(fan_in); c = 0.1, L = 512.
    The model's blanket std-0.02 init (nn.Linear, nn.Embedding) does not reach these raw parameters."""
    torch.manual_seed(0)
    pos = tiny(mlp_width=64).blocks[1].attn.pos
    for p, bound in ((pos.w1, 1.0), (pos.b1, 1.0), (pos.w2, 64**-0.5), (pos.b2, 64**-0.5)):
        assert p.abs().max() <= bound and p.abs().max() > 0.6 * bound  # spread over the interval, not std 0.02
    assert pos.c.item() == pytest.approx(0.1) and pos.threshold().item() == 512.0


def test_per_layer_by_default_and_fire_s_shares_one():
    """The paper's FIRE: f_θ, c and L per layer (the default); its FIRE-S (share: true) one set for all layers."""
    own, shared = tiny(3), tiny(3, share=True)
    assert own.pos_shared is None and own.blocks[0].attn.pos.w2 is not own.blocks[1].attn.pos.w2
    per_fire = 32 + 32 + 4 * 32 + 4 + 2  # w1, b1, w2, b2, c and L's multiplier
    assert own.num_params() - shared.num_params() == 2 * per_fire
    assert all(b.attn.pos.src is shared.pos_shared for b in shared.blocks)
    assert sum(p.numel() for p in shared.pos_shared.parameters()) == per_fire
    assert not list(shared.blocks[0].attn.pos.parameters())


def test_f_theta_is_spared_by_weight_decay_and_the_attention_is_not():
    decay, spared = weight_decay_split(tiny(2))
    mine = {f"blocks.{i}.attn.pos.{a}" for i in range(2) for a in ("w1", "b1", "w2", "b2", "c", "l_mult")}
    assert mine <= set(spared) and not mine & set(decay)
    assert "blocks.0.attn.qkv.weight" in decay
