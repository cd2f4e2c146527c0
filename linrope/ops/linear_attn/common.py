"""Pieces shared by every form of linear attention: argument checks, feature maps, RoPE features."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from linrope.rope import check_rope_dim, rope_cos_sin, rope_frequencies

FEATURE_MAPS = ("elu", "cosine")
PLACEMENTS = ("numerator", "both", "none")


class LinearAttentionState(NamedTuple):
    """Running state of causal linear attention after a prefix.

    ``S``: (B, H, D', d_v) = Σ_j γ^(n-1-j) (R_j φ(k_j)) v_jᵀ   (rotated as the numerator wants)
    ``z``: (B, H, D')      = Σ_j γ^(n-1-j) φ_den(k_j)          (rotated only for placement "both")
    Always float32 (float64 for float64 inputs), whatever the input precision.
    """

    S: torch.Tensor
    z: torch.Tensor


def check_args(q, k, v, feature_map: str, rope: str, impl: str | None = None, chunk_size: int | None = None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"linear_attention expects (B, H, N, d) tensors; got q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape; got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must share (B, H, N) with q; got {tuple(v.shape)} vs {tuple(q.shape)}")
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {feature_map!r}; expected one of {', '.join(FEATURE_MAPS)}")
    if rope not in PLACEMENTS:
        raise ValueError(f"unknown rope placement {rope!r}; expected one of {', '.join(PLACEMENTS)}")
    if rope != "none":
        check_rope_dim(q.shape[-1])
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


# Placement "both" rotates the denominator too: den_i = Σ_j γ^(i-j) (R_i φ(q_i))·(R_j φ(k_j)) is then a sum of
# terms of either sign and can cancel to (nearly) zero while the numerator does not, so that o_i = num_i / den_i
# grows without bound (and ∂o/∂q with its square).  For that placement every form clamps the magnitude of
# den_i + eps to at least DEN_FLOOR, keeping its sign, and a clamped denominator passes no gradient.  This bounds
# |o_i| by |num_i| / DEN_FLOOR; a denominator that is small only relative to its usual size (it grows with the
# number of keys) is not caught.  The other placements' denominators are sums of positive terms and untouched.
DEN_FLOOR = 1e-2


def guard_denominator(den: torch.Tensor, rope: str) -> torch.Tensor:
    """den (= den + eps) with its magnitude clamped to >= DEN_FLOOR for placement "both" (differentiable)."""
    if rope != "both":
        return den
    return torch.copysign(den.abs().clamp_min(DEN_FLOOR), den)


def guard_denominator_(den: torch.Tensor, rope: str) -> None:
    """In place, as ``guard_denominator`` (no autograd graph)."""
    if rope == "both":
        den.copy_(torch.copysign(den.abs().clamp_min_(DEN_FLOOR), den))


def feature_width(feature_map: str, d: int) -> int:
    """Width D of φ(x) for a head of size d: cosine prepends the constant feature 1."""
    return d + 1 if feature_map == "cosine" else d


def shared_features(rope: str) -> bool:
    """Numerator and denominator use the same features (RoPE in both places, or nowhere)."""
    return rope in ("both", "none")


def phi(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """The part of the feature map that RoPE rotates: elu(x)+1, or x/||x|| for cosine."""
    if feature_map == "elu":
        return F.elu(x) + 1.0
    # cosine: x̂ = x / ||x||; the constant 1 of φ(x) = [1, x̂] is added by `with_one`.
    return x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny ** 0.5)


def with_one(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """Complete φ: for cosine prepend the constant feature 1 so that φ(q)·φ(k) = 1 + q̂·k̂."""
    if feature_map == "cosine":
        return torch.cat((torch.ones_like(x[..., :1]), x), dim=-1)
    return x


def rope_tables(positions: Optional[torch.Tensor], n: int, d: int, theta: Optional[torch.Tensor], device, dtype):
    """cos/sin tables (N, d/2) for the given positions (default 0…N-1)."""
    if positions is None:
        positions = torch.arange(n, device=device)
    positions = positions.to(device)
    if positions.dim() != 1 or positions.shape[0] != n:
        raise ValueError(f"positions must be a 1-D tensor of length N={n}; got shape {tuple(positions.shape)}")
    return rope_cos_sin(positions, theta if theta is not None else rope_frequencies(d, device=device), dtype)


def decay_log(decay: Optional[torch.Tensor], n_heads: int, device) -> Optional[torch.Tensor]:
    """log γ_h as float64 (H,), checking 0 < γ_h <= 1."""
    if decay is None:
        return None
    decay = torch.as_tensor(decay, device=device, dtype=torch.float64).reshape(-1)
    if decay.numel() != n_heads:
        raise ValueError(f"decay needs one factor per head ({n_heads}); got {decay.numel()}")
    if (decay <= 0).any() or (decay > 1).any():
        raise ValueError("decay factors γ_h must lie in (0, 1]")
    return decay.log()
