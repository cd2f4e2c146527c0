"""Rotary Position Embedding (RoFormer, Su et al. 2021), docs/mathematics.md#rope.

Interleaved pairs: for t = 0 … d/2-1, θ_t = base^(-2t/d) and

    out[2t]   = x[2t]   cos(m θ_t) - x[2t+1] sin(m θ_t)
    out[2t+1] = x[2t+1] cos(m θ_t) + x[2t]   sin(m θ_t)

so that <R_m q, R_n k> = <q, R_{n-m} k>.  Angles are always formed in float64
from integer positions and handed to the rotation in float32 (float64 for
float64 inputs), never in the input's low precision.

Length scaling reduces to a change of the frequencies θ (docs/mathematics.md#length-scaling):
  - position interpolation ("pi"):  m -> m / factor   ⇔ θ -> θ / factor
  - NTK-aware ("ntk"):              base -> base * factor^(d/(d-2))
  - YaRN ("yarn", Peng et al. 2024): θ_t -> (1 - γ_t) θ_t / factor + γ_t θ_t, the ramp γ_t measured against the
    original context L0 (NTK-by-parts), plus the attention temperature ``yarn_mscale`` (on q and k: softmax only)
  - dynamic NTK ("dynamic"): "ntk" by factor·N/L0 - (factor - 1), N the forward's length, when N > L0

Partial rotary (GPT-NeoX's ``rotary_pct``, Black et al. 2022) rotates r < d dimensions: the first r/2 pairs
carry the frequencies of an r-dimensional RoPE and the other pairs θ = 0 (a rotation by angle 0 is the identity),
``partial_frequencies``.  With NeoX's half-split layout on the first r dimensions this is NeoX's partial rotary
up to a fixed permutation of the head's dimensions (docs/mathematics.md#partial-rotary).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from einops import rearrange

SCALINGS = (None, "none", "pi", "ntk", "yarn", "dynamic")
RAMPS = ("release", "paper")  # YaRN's ramp: linear in the pair index, bounds rounded outward (the release), or in r
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # the ramp's ends, in rotations within L0 (the paper's β and α)


def check_rope_dim(dim: int) -> None:
    if dim % 2 != 0:
        raise ValueError(f"RoPE rotates pairs of features and needs an even head dimension; got head_dim={dim}")


def rope_frequencies(
    dim: int,
    base: float = 10000.0,
    *,
    scaling: Optional[str] = None,
    factor: float = 1.0,
    original_context: Optional[int] = None,
    length: Optional[int] = None,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
    ramp: str = "release",
    device=None,
) -> torch.Tensor:
    """The d/2 rotation frequencies θ_t (float64), with optional length scaling.  ``yarn`` and ``dynamic`` measure
    against ``original_context`` (L0); ``dynamic`` also takes the forward's ``length`` N (None or N <= L0:
    unscaled).  YaRN's temperature is not a frequency: ``yarn_mscale``."""
    check_rope_dim(dim)
    if scaling not in SCALINGS:
        raise ValueError(f"unknown RoPE scaling {scaling!r}; expected one of none, pi, ntk, yarn, dynamic")
    if factor <= 0:
        raise ValueError(f"RoPE scaling factor must be positive, got {factor}")
    if scaling in ("yarn", "dynamic"):
        if factor < 1:
            raise ValueError(f"RoPE scaling {scaling} extends the context: factor must be >= 1, got {factor}")
        if original_context is None or original_context < 1:
            raise ValueError(f"RoPE scaling {scaling} needs the original context (>= 1), got {original_context}")
    if scaling == "dynamic" and length is not None:
        base = ntk_base(dim, base, dynamic_ntk_scale(factor, length, original_context))
    if scaling == "ntk":
        base = ntk_base(dim, base, factor)
    t = torch.arange(dim // 2, dtype=torch.float64, device=device)
    theta = base ** (-2.0 * t / dim)
    if scaling == "pi":
        theta = theta / factor
    if scaling == "yarn" and factor != 1:
        gamma = yarn_ramp(
            dim, base, original_context, beta_fast=beta_fast, beta_slow=beta_slow, ramp=ramp, device=device
        )
        theta = theta / factor * (1 - gamma) + theta * gamma
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


def ntk_base(dim: int, base: float, scale: float) -> float:
    """NTK-aware base change: base · scale^(d/(d-2)), so that the slowest pair turns ``scale`` times slower (d = 2:
    one pair, left alone)."""
    return base * scale ** (dim / (dim - 2)) if dim > 2 else base


def ntk_rescale(theta: torch.Tensor, scale: float) -> torch.Tensor:
    """Frequencies ``theta`` (d/2 of them, pair t = 0 … d/2-1) after a further NTK base change by ``scale``:
    θ_t · scale^(-2t/(d-2)), which is (base · scale^(d/(d-2)))^(-2t/d) for θ_t = base^(-2t/d) and composes with any
    change already made (a PI division, YaRN's blend)."""
    half = theta.shape[-1]
    if scale == 1 or half < 2:
        return theta
    t = torch.arange(half, dtype=torch.float64, device=theta.device)
    return theta * float(scale) ** (-2.0 * t / (2 * half - 2))


def dynamic_ntk_scale(factor: float, length: int, original_context: int) -> float:
    """Dynamic NTK's scale for a forward of length N (the largest position + 1): factor·N/L0 - (factor - 1) when
    N > L0, else 1 (as trained).  With factor 1 it is N/L0."""
    if length <= original_context:
        return 1.0
    return factor * length / original_context - (factor - 1)


def yarn_ramp(
    dim: int,
    base: float,
    original_context: int,
    *,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
    ramp: str = "release",
    device=None,
) -> torch.Tensor:
    """YaRN's γ_t (float64, d/2 pairs): the weight of pair t's own frequency in its blend with θ_t / factor; 1 for a
    pair that turns at least ``beta_fast`` times within L0 (kept), 0 below ``beta_slow`` turns (interpolated).

    ``release`` (the authors' code and Hugging Face's): linear in the pair index t between
    floor(t(beta_fast)) and ceil(t(beta_slow)), t(r) = d·ln(L0 / (2π r)) / (2 ln base) the pair that turns r times,
    the bounds clamped to 0 and d - 1.  ``paper`` (eq. 18 of the paper): linear in r_t = L0 θ_t / (2π) itself."""
    if ramp not in RAMPS:
        raise ValueError(f"unknown YaRN ramp {ramp!r}; expected one of {', '.join(RAMPS)}")
    if not beta_fast > beta_slow > 0:
        raise ValueError(f"YaRN needs beta_fast > beta_slow > 0, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    t = torch.arange(dim // 2, dtype=torch.float64, device=device)
    if ramp == "paper":
        rotations = original_context * base ** (-2.0 * t / dim) / (2 * math.pi)
        return ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0, 1)

    def pair(rotations):
        return dim * math.log(original_context / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = max(math.floor(pair(beta_fast)), 0), min(math.ceil(pair(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as released: no division by zero
    return 1 - ((t - low) / (high - low)).clamp(0, 1)


def yarn_mscale(factor: float) -> float:
    """YaRN's attention temperature as q and k take it: sqrt(1/t) = 0.1·ln(factor) + 1 (1 for factor <= 1), so the
    logits are multiplied by its square."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


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
    """Rotate the last dimension of ``x`` (..., N, d) by position (docs/mathematics.md#the-rotation).

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
