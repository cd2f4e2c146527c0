"""Rotary Position Embedding (RoFormer, Su et al. 2021), docs/design.md#rope.

Interleaved pairs: for t = 0 … d/2-1, θ_t = base^(-2t/d) and

    out[2t]   = x[2t]   cos(m θ_t) - x[2t+1] sin(m θ_t)
    out[2t+1] = x[2t+1] cos(m θ_t) + x[2t]   sin(m θ_t)

so that <R_m q, R_n k> = <q, R_{n-m} k>.  Angles are always formed in float64
from integer positions and handed to the rotation in float32 (float64 for
float64 inputs), never in the input's low precision.

Length scaling reduces to a change of the frequencies θ:
  - position interpolation ("pi"):  m -> m / factor   ⇔ θ -> θ / factor
  - NTK-aware ("ntk"):              base -> base * factor^(d/(d-2))

Partial rotary (GPT-NeoX's ``rotary_pct``, Black et al. 2022) rotates r < d dimensions: the first r/2 pairs
carry the frequencies of an r-dimensional RoPE and the other pairs θ = 0 (a rotation by angle 0 is the identity),
``partial_frequencies``.  With NeoX's half-split layout on the first r dimensions this is NeoX's partial rotary
up to a fixed permutation of the head's dimensions (docs/design.md#partial-rotary).
"""

from __future__ import annotations

from typing import Optional

import torch
from einops import rearrange

SCALINGS = (None, "none", "pi", "ntk")


def check_rope_dim(dim: int) -> None:
    if dim % 2 != 0:
        raise ValueError(f"RoPE rotates pairs of features and needs an even head dimension; got head_dim={dim}")


def rope_frequencies(
    dim: int,
    base: float = 10000.0,
    *,
    scaling: Optional[str] = None,
    factor: float = 1.0,
    device=None,
) -> torch.Tensor:
    """The d/2 rotation frequencies θ_t (float64), with optional length scaling."""
    check_rope_dim(dim)
    if scaling not in SCALINGS:
        raise ValueError(f"unknown RoPE scaling {scaling!r}; expected one of none, pi, ntk")
    if factor <= 0:
        raise ValueError(f"RoPE scaling factor must be positive, got {factor}")
    if scaling == "ntk" and dim > 2:
        base = base * factor ** (dim / (dim - 2))
    t = torch.arange(dim // 2, dtype=torch.float64, device=device)
    theta = base ** (-2.0 * t / dim)
    if scaling == "pi":
        theta = theta / factor
    return theta


def rotary_dims(dim: int, fraction: float) -> int:
    """The dimensions partial rotary turns: GPT-NeoX's ``int(head_dim * rotary_pct)`` (truncated), which must be even
    (pairs) and at least 2."""
    r = int(dim * fraction)
    if r < 2 or r % 2:
        raise ValueError(
            f"rotary_fraction={fraction} rotates int({dim}·{fraction}) = {r} of head_dim={dim} dimensions; "
            "RoPE turns pairs, so that must be an even number >= 2"
        )
    return r


def partial_frequencies(theta: torch.Tensor, dim: int) -> torch.Tensor:
    """The d/2 frequencies of partial rotary: ``theta`` (the r/2 of an r-dimensional RoPE, any scaling already
    applied) followed by zeros, the pairs that are not turned."""
    return torch.cat((theta, theta.new_zeros(dim // 2 - theta.shape[0])))


def default_positions(n: int, device=None) -> torch.Tensor:
    return torch.arange(n, dtype=torch.long, device=device)


def rope_cos_sin(positions: torch.Tensor, theta: torch.Tensor, dtype: torch.dtype = torch.float32):
    """cos and sin of the angles m·θ_t, shape (..., N, d/2), computed in float64, returned in `dtype`."""
    angles = positions.to(torch.float64).unsqueeze(-1) * theta.to(device=positions.device, dtype=torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision positions and accumulations compute in: float64 stays float64, everything else
    (float32, bf16, fp16) runs in float32.  The one statement of this rule: every module uses it."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = True) -> torch.Tensor:
    """Apply precomputed rotations (cos, sin of shape broadcastable to (..., N, d/2)) to x (..., N, d)."""
    xc = x.to(cos.dtype)
    if interleaved:
        x1, x2 = xc[..., 0::2], xc[..., 1::2]
    else:  # half-split ("rotate_half") layout: pairs (t, t + d/2)
        x1, x2 = xc.chunk(2, dim=-1)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if interleaved:
        out = rearrange(torch.stack((o1, o2), dim=-1), "... t two -> ... (t two)")
    else:
        out = torch.cat((o1, o2), dim=-1)
    return out.to(x.dtype)


def apply_rope(
    x: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    *,
    base: float = 10000.0,
    scaling: Optional[str] = None,
    factor: float = 1.0,
    theta: Optional[torch.Tensor] = None,
    interleaved: bool = True,
) -> torch.Tensor:
    """Rotate the last dimension of ``x`` (..., N, d) by position (docs/design.md#the-rotation).

    ``positions`` is a 1-D integer tensor of length N (default ``0 … N-1``);
    ``theta`` overrides the frequencies computed from ``base``/``scaling``/``factor``.
    """
    d, n = x.shape[-1], x.shape[-2]
    check_rope_dim(d)
    if positions is None:
        positions = default_positions(n, device=x.device)
    if positions.shape[-1] != n:
        raise ValueError(f"apply_rope: {positions.shape[-1]} positions for a sequence of length {n}")
    if theta is None:
        theta = rope_frequencies(d, base, scaling=scaling, factor=factor, device=x.device)
    cos, sin = rope_cos_sin(positions.to(x.device), theta, compute_dtype(x.dtype))
    return rotate(x, cos, sin, interleaved=interleaved)
