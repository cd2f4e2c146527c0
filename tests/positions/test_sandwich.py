"""Sandwich (docs/schemes.md#sandwich): the paper's bias — the inner product of two absolute sinusoidal
embeddings, compressed per head — against a scalar float64 loop; the offset that only the softmax cannot see; no
parameters, the same bias in every layer, bit for bit at any shift.  A shift in a model, the refusal of linear
attention, one bias per forward, bf16 training and compile: the contract suite (test_contract.py)."""

from __future__ import annotations

import math

import pytest
import torch

from linrope.positions import REGISTRY, build_position
from tests.helpers import scalar_softmax
from tests.positions.contract import D, attention, tiny_lm


def embedding(m, dim):
    """The sinusoidal embedding of absolute position m (Vaswani et al.), dim entries, written out."""
    out = []
    for t in range(dim // 2):
        angle = m / 10000 ** (2 * t / dim)
        out += [math.sin(angle), math.cos(angle)]
    return out


def paper_bias(m, n, h, heads, dim):
    """The paper's bias for head h (0-based): p_m·p_n of two absolute embeddings, divided by 8(h+1)/H."""
    return sum(a * b for a, b in zip(embedding(m, dim), embedding(n, dim))) / (8 * (h + 1) / heads)


def loop_output(att, x, positions, causal, dim):
    p, heads = positions.tolist(), att.n_heads
    return scalar_softmax(att, x, causal, lambda h, i, j: paper_bias(p[i], p[j], h, heads, dim))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("dim,n_heads", [(8, 2), (128, 4)])
def test_against_the_paper_formula(dim, n_heads, causal):
    att = attention("sandwich", causal=causal, max_len=64, n_heads=n_heads, dim=dim)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    positions = torch.randperm(300)[:9].sort().values  # distinct, not contiguous, far apart
    got = att(x, positions)[0]
    torch.testing.assert_close(got, loop_output(att, x, positions, causal, dim), rtol=1e-9, atol=1e-11)
    # the bias matters: attention without it is another output
    q, k, v = att.split(x)
    plain = att.merge(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    assert (got - plain).abs().max() > 1e-2


def test_bias_is_the_papers_less_a_constant_per_head():
    """The module's bias is p_i·p_j/ρ_h less d̄/(2ρ_h): 0 on the diagonal and below elsewhere (what the softmax
    cannot tell apart); ρ_h = 8h/H."""
    pos = build_position("sandwich", where="attention", d_model=32, n_heads=4, head_dim=8, max_len=8, dim=16)
    assert pos.ratio.tolist() == [2.0, 4.0, 6.0, 8.0] and pos.ratio.dtype == torch.float64
    positions = torch.tensor([3, 4, 9, 30, 31, 200])
    q = torch.zeros(1, 4, 6, 8, dtype=torch.float64)
    bias = pos.score_bias(q, q, positions)
    for h in range(4):
        for i, m in enumerate(positions.tolist()):
            for j, n in enumerate(positions.tolist()):
                want = paper_bias(m, n, h, 4, 16) - 16 / 2 / (8 * (h + 1) / 4)
                assert abs(bias[0, h, i, j].item() - want) < 1e-12
    assert (bias[0].diagonal(dim1=-2, dim2=-1) == 0).all() and (bias <= 0).all()


def test_no_parameters_and_every_layer_the_same_bias():
    m, none = tiny_lm("sandwich", n_layers=3), tiny_lm("none", n_layers=3)
    assert m.num_params() == none.num_params() and m.state_dict().keys() == none.state_dict().keys()
    own = tiny_lm("sandwich", n_layers=3, share=False)
    own.load_state_dict(m.state_dict())
    x = torch.randint(0, 32, (2, 11))
    assert torch.equal(own(x), m(x))  # share: false: each layer builds the same bias, bit for bit


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_shift_changes_no_bit(causal):
    att = attention("sandwich", causal=causal, max_len=64)
    x = torch.randn(2, 10, D, dtype=torch.float64)
    positions = torch.randperm(50)[:10].sort().values
    assert torch.equal(att(x, positions + 1234)[0], att(x, positions)[0])  # the bias is a table of distances


def test_bias_precision():
    """float64 scores get the float64 bias; float32 and bf16 autocast the float64 value rounded once to
    float32 (SDPA's mask then takes the query's dtype)."""
    pos = build_position("sandwich", where="attention", d_model=32, n_heads=4, head_dim=8, max_len=8)
    positions = torch.arange(400) + 7
    q64 = torch.zeros(1, 4, 1, 8, dtype=torch.float64)
    exact = pos.score_bias(q64, q64, positions)
    assert exact.dtype == torch.float64
    for h, i, j in ((0, 399, 0), (1, 250, 3), (3, 17, 16)):  # float64 all the way: the paper's value, to 1e-12
        m, n = positions[i].item(), positions[j].item()
        assert abs(exact[0, h, i, j].item() - (paper_bias(m, n, h, 4, 128) - 64 / (2 * (h + 1)))) < 1e-12
    assert torch.equal(pos.score_bias(q64.float(), q64.float(), positions), exact.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qb = torch.nn.Linear(8, 8)(torch.randn(1, 4, 400, 8))
        bias = pos.score_bias(qb, qb, positions)
    assert qb.dtype == torch.bfloat16 and bias.dtype == torch.float32 and torch.equal(bias, exact.float())


def test_linear_note_names_the_inner_product():
    """Linear attention's refusal (test_contract.py) gives the note: the term it would have to add to every score."""
    assert "p_i·p_j" in REGISTRY["sandwich"].linear_note


@pytest.mark.parametrize("dim,message", [(7, "dim=7: expected an even number"), (0, "dim=0: expected an integer >= 2")])
def test_dim_is_checked_in_one_line(dim, message):
    with pytest.raises(ValueError, match=message):
        tiny_lm("sandwich", n_layers=3, dim=dim)
