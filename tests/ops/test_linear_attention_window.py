"""The context-limited control in the kernels: linear attention that sees only the last ``window`` keys.

The naive form against a reference built pair by pair from the window's definition (key j visible to query i iff
i - window < j <= i), and the chunk form (the blocked windowed computation, O(N·window)) against the naive form:
float64, forward and backward, every feature map / placement, with and without a decay, lengths that are not
multiples of the window or the chunk, buffers poisoned with NaN (tests/conftest.py ``kernel_env``)."""

import itertools

import pytest
import torch

from linrope.ops import BACKENDS, chunk_linear_attention, linear_attention, naive_linear_attention
from linrope.ops.linear_attn.common import Args, LinearAttentionState
from linrope.ops.linear_attn.features import reference_features
from tests.helpers import gen, rel

B, H, D, DV = 2, 2, 8, 6
DECAY = torch.tensor([0.93, 0.55], dtype=torch.float64)

pytestmark = pytest.mark.usefixtures("kernel_env")


def inputs(n, g, dtype=torch.float64):
    return tuple(torch.randn(B, H, n, d, generator=g, dtype=dtype) for d in (D, D, DV))


def by_definition(q, k, v, *, window, feature_map, rope, decay, positions=None, eps=1e-6):
    """o_i = Σ_{i-W<j≤i} w^num_ij v_j / (Σ_{i-W<j≤i} w^den_ij + eps), pair by pair, in float64."""
    qn, kn, qd, kd = reference_features(
        q, k, feature_map=feature_map, rope=rope, positions=positions, theta=None, dtype=torch.float64
    )
    n = q.shape[2]
    out = torch.full(v.shape, float("nan"), dtype=torch.float64)
    for i in range(n):
        num = torch.zeros(B, H, v.shape[-1], dtype=torch.float64)
        den = torch.zeros(B, H, dtype=torch.float64)
        for j in range(max(0, i - window + 1), i + 1):
            g = torch.ones(H, dtype=torch.float64) if decay is None else decay.double() ** (i - j)
            w_num = (qn[:, :, i] * kn[:, :, j]).sum(-1) * g
            w_den = (qd[:, :, i] * kd[:, :, j]).sum(-1) * g
            num += w_num[..., None] * v[:, :, j]
            den += w_den
        den = den + eps
        if rope == "both":  # the guard every form applies to a denominator of either sign
            den = torch.copysign(den.abs().clamp_min(1e-2), den)
        out[:, :, i] = num / den[..., None]
    return out


@pytest.mark.parametrize("n,window", [(1, 1), (11, 1), (13, 4), (16, 4), (9, 9), (7, 30)])
@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
@pytest.mark.parametrize("rope", ["numerator", "both", "none"])
def test_naive_window_is_the_definition(n, window, feature_map, rope):
    for decayed in (False, True):
        q, k, v = inputs(n, gen("window-def", n, window, feature_map, rope, decayed))
        positions = torch.arange(n) + 5  # an offset: RoPE and the decay see only differences
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None)
        got = naive_linear_attention(q, k, v, window=window, positions=positions, **kw)
        want = by_definition(q, k, v, window=window, positions=positions, **kw)
        assert got.dtype == torch.float64
        assert rel(got, want) < 1e-12, f"decay={decayed}: {rel(got, want):.2e}"


def with_grads(fn, q, k, v, weights, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **kw)
    return out.detach(), torch.autograd.grad((out * weights).sum(), leaves)


@pytest.mark.parametrize("n,window", [(1, 3), (37, 8), (64, 16), (100, 7), (50, 1), (20, 20), (20, 64)])
@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
@pytest.mark.parametrize("rope", ["numerator", "both", "none"])
def test_chunk_window_matches_naive_forward_and_backward(n, window, feature_map, rope):
    for decayed, chunk_size, normalize in itertools.product((False, True), (4, 64), (True, False)):
        g = gen("window-chunk", n, window, feature_map, rope, decayed, chunk_size, normalize)
        q, k, v = inputs(n, g)
        weights = torch.randn(B, H, n, DV, generator=g, dtype=torch.float64)
        # one key (n or window 1): o = v·w/(w+eps), whose gradients in q and k are O(eps) cancellations in every form (as in
        # test_linear_attention.py); a larger eps keeps them comparable to 1e-10
        eps = 0.1 if min(n, window) == 1 else 1e-6
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None, window=window, eps=eps)
        kw["normalize"] = normalize  # without a denominator too (linear_rope_norm at evaluation)
        ref, ref_grads = with_grads(naive_linear_attention, q, k, v, weights, **kw)
        got, grads = with_grads(chunk_linear_attention, q, k, v, weights, chunk_size=chunk_size, **kw)
        what = f"decay={decayed} C={chunk_size} normalize={normalize}"
        assert got.dtype == torch.float64 and torch.isfinite(got).all(), what
        assert rel(got, ref) < 1e-10, f"{what}: {rel(got, ref):.2e}"
        for name, gr, rg in zip("qkv", grads, ref_grads):
            assert rel(gr, rg) < 1e-10, f"{what}: d{name} {rel(gr, rg):.2e}"


@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_a_window_as_long_as_the_sequence_is_no_window(impl):
    q, k, v = inputs(23, gen("window-long", impl))
    for decay in (None, DECAY):
        plain = linear_attention(q, k, v, impl=impl, decay=decay, chunk_size=8)
        for window in (23, 24, 1000):
            got = linear_attention(q, k, v, impl=impl, decay=decay, chunk_size=8, window=window)
            assert rel(got, plain) < 1e-14, (window, decay)
        shorter = linear_attention(q, k, v, impl=impl, decay=decay, chunk_size=8, window=22)
        assert rel(shorter, plain) > 1e-6  # one key fewer for the last query: visibly another output


@pytest.mark.parametrize("impl", ["naive", "chunk"])
@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
def test_window_one_sees_only_itself(impl, feature_map):
    """o_i = w_ii v_i / (w'_ii + eps): the output is v_i scaled, the scale ≈ 1 without RoPE (w = w')."""
    q, k, v = inputs(19, gen("window-one", impl, feature_map))
    got = linear_attention(q, k, v, impl=impl, feature_map=feature_map, rope="none", window=1, eps=1e-9)
    torch.testing.assert_close(got, v, rtol=1e-6, atol=1e-6)
    rotated = linear_attention(q, k, v, impl=impl, feature_map=feature_map, rope="numerator", window=1)
    ratio = rotated / v  # one scalar per (b, h, i): v_i times w^num_ii / (w^den_ii + eps)
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-9, atol=1e-9)


def test_bf16_autocast_over_many_windows_matches_float64():
    """Under bf16 autocast the blocked form computes in float32 (the inputs' rule): against float64 of the same
    bf16 inputs, over 300 positions (many windows and chunks), forward and backward."""
    g = gen("window-bf16")
    q, k, v = (t.bfloat16() for t in inputs(300, g))
    weights = torch.randn(B, H, 300, DV, generator=g, dtype=torch.float64)
    ref, ref_grads = with_grads(naive_linear_attention, q.double(), k.double(), v.double(), weights, window=48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, grads = with_grads(
            chunk_linear_attention, q, k, v, weights.bfloat16(), window=48, chunk_size=16, decay=None
        )
    assert got.dtype == torch.bfloat16
    assert rel(got, ref) < 1e-2  # bf16's rounding of the output (float32 inside)
    for gr, rg in zip(grads, ref_grads):
        assert torch.isfinite(gr).all() and rel(gr, rg) < 3e-2


def test_bad_windows_are_one_line_each():
    q, k, v = inputs(5, gen("window-bad"))
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        linear_attention(q, k, v, window=0)
    with pytest.raises(ValueError, match="causal=False"):
        linear_attention(q, k, v, window=2, causal=False, impl="naive")
    with pytest.raises(ValueError, match="window carries no state"):
        linear_attention(q, k, v, window=2, output_final_state=True)
    S = torch.zeros(B, H, D, DV, dtype=torch.float64)
    with pytest.raises(ValueError, match="window carries no state"):
        linear_attention(q, k, v, window=2, initial_state=LinearAttentionState(S, S[..., 0]))
    with pytest.raises(ValueError, match="impl=recurrent takes no window"):
        linear_attention(q, k, v, window=2, impl="recurrent")
    refusal = BACKENDS["fla"].refusal(q.float(), Args(window=2))
    assert isinstance(refusal, ValueError) and "impl=fla takes no window" in str(refusal)
