"""linear_attention(impl="naive") equals the quadratic formula of linear attention written out by hand:
numerator over denominator, each a sum over keys, RoPE where the placement says."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from linrope.ops import linear_attention
from linrope.ops.rope import apply_rope


def by_hand(q, k, v, feature_map, placement, causal, eps=1e-6):
    """o_i = Σ_j num_ij v_j / (Σ_j den_ij + eps), each weight computed pair by pair."""
    B, H, N, d = q.shape
    out = torch.full((B, H, N, v.shape[-1]), float("nan"), dtype=torch.float64)
    pos = torch.arange(N)
    if feature_map == "elu":
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
    else:
        fq, fk = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    rq, rk = apply_rope(fq, pos), apply_rope(fk, pos)
    one = 1.0 if feature_map == "cosine" else 0.0
    for b, h, i in itertools.product(range(B), range(H), range(N)):
        num = torch.zeros(v.shape[-1], dtype=torch.float64)
        den = 0.0
        for j in range(N):
            if causal and j > i:
                continue
            plain = one + fq[b, h, i] @ fk[b, h, j]
            rotated = one + rq[b, h, i] @ rk[b, h, j]
            w_num = plain if placement == "none" else rotated
            w_den = rotated if placement == "both" else plain
            num += w_num * v[b, h, j]
            den += w_den
        out[b, h, i] = num / (den + eps)
    return out


@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
@pytest.mark.parametrize("placement", ["numerator", "both", "none"])
@pytest.mark.parametrize("causal", [True, False])
def test_naive_matches_hand_written(feature_map, placement, causal):
    g = torch.Generator().manual_seed(hash((feature_map, placement, causal)) % 2**31)
    q, k, v = (torch.randn(2, 2, 9, 6, generator=g, dtype=torch.float64) for _ in range(3))
    got = linear_attention(q, k, v, feature_map=feature_map, rope=placement, causal=causal, impl="naive")
    ref = by_hand(q, k, v, feature_map, placement, causal)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_rope_numerator_changes_output_and_cosine_weights_nonnegative():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g, dtype=torch.float64) for _ in range(3))
    a = linear_attention(q, k, v, rope="numerator", impl="naive")
    b = linear_attention(q, k, v, rope="none", impl="naive")
    assert (a - b).abs().max() > 1e-3
