"""apply_rope follows docs/mathematics.md#the-rotation element by element; <R_m q, R_n k> depends only on n - m."""

import math

import pytest
import torch

from linrope.ops.rope import apply_rope, rope_frequencies


def reference_rope(x, positions, base=10000.0):
    """The rotation of docs/mathematics.md#the-rotation, written out with Python loops, in float64."""
    *lead, n, d = x.shape
    out = torch.full_like(x, float("nan"), dtype=torch.float64)
    xf = x.to(torch.float64)
    for i in range(n):
        m = float(positions[i])
        for t in range(d // 2):
            th = base ** (-2.0 * t / d)
            c, s = math.cos(m * th), math.sin(m * th)
            out[..., i, 2 * t] = xf[..., i, 2 * t] * c - xf[..., i, 2 * t + 1] * s
            out[..., i, 2 * t + 1] = xf[..., i, 2 * t + 1] * c + xf[..., i, 2 * t] * s
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("d", [2, 8, 16])
def test_elementwise_against_formula(seed, d):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 11, d, generator=g, dtype=torch.float64)
    positions = torch.randint(0, 5000, (11,), generator=g)
    got = apply_rope(x, positions)
    ref = reference_rope(x, positions)
    assert not torch.isnan(ref).any()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_default_positions_and_base():
    x = torch.randn(1, 1, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x), reference_rope(x, torch.arange(7)))
    torch.testing.assert_close(apply_rope(x, base=500.0), reference_rope(x, torch.arange(7), base=500.0))
    # position 0 is the identity
    assert torch.equal(apply_rope(x[..., :1, :]), x[..., :1, :])


def test_relative_property():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(64, generator=g, dtype=torch.float64)
    k = torch.randn(64, generator=g, dtype=torch.float64)

    def dot(m, n):
        rq = apply_rope(q.view(1, 64), torch.tensor([m]))
        rk = apply_rope(k.view(1, 64), torch.tensor([n]))
        return float((rq * rk).sum())

    for delta in (0, 1, 7, 100, -13):
        values = [dot(m, m + delta) for m in (0, 5, 123, 4096)]
        assert max(values) - min(values) < 1e-9 * max(1.0, abs(values[0]))
    assert abs(dot(0, 1) - dot(0, 2)) > 1e-6  # and it does depend on the distance


def test_norm_preserved_and_low_precision_angles():
    x = torch.randn(4, 100, 32)
    pos = torch.arange(60000, 60100)
    out = apply_rope(x, pos)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    # bf16 input: angles are formed in float64/float32, so the result equals the float32 one rounded
    out_bf16 = apply_rope(x.bfloat16(), pos)
    assert out_bf16.dtype == torch.bfloat16
    ref = apply_rope(x.bfloat16().float(), pos)
    torch.testing.assert_close(out_bf16.float(), ref, rtol=1e-2, atol=1e-2)


def test_scalings():
    d = 16
    base = rope_frequencies(d)
    torch.testing.assert_close(rope_frequencies(d, scaling="pi", factor=4.0), base / 4.0)
    ntk = rope_frequencies(d, scaling="ntk", factor=4.0)
    torch.testing.assert_close(ntk, rope_frequencies(d, base=10000.0 * 4.0 ** (d / (d - 2))))
    assert ntk[0] == 1.0 and ntk[-1] < base[-1]  # highest frequency kept, lowest stretched
    # position interpolation: position m under factor f equals position m/f unscaled
    x = torch.randn(1, 1, 3, d, dtype=torch.float64)
    pos = torch.tensor([0, 4, 8])
    torch.testing.assert_close(apply_rope(x, pos, scaling="pi", factor=4.0), reference_rope(x, pos / 4.0))


def test_bad_input():
    with pytest.raises(ValueError, match="even head dimension"):
        apply_rope(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(2, 5, 8), torch.arange(4))
    with pytest.raises(ValueError, match="scaling"):
        rope_frequencies(8, scaling="longrope")
