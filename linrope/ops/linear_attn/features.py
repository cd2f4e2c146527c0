"""φ, the feature maps, in one place: their definition, width, the RoPE rotation of features, and the
features' hand-written backward, shared by every form.

    φ_elu(x) = elu(x) + 1                 (positive, per component)                       D' = d
    φ_cos(x) = [1, x / ‖x‖]               (so φ(q)·φ(k) = 1 + cos(q, k))                  D' = d + 1

The numerator's features are rotated by RoPE unless the placement is "none"; the denominator's only for
placement "both" (for "numerator" it keeps the unrotated ones).  RoPE is the interleaved rotation: the pair
(x[2t], x[2t+1]) at position m turns by the angle m·θ_t, so a dot product of a rotated query at i and a
rotated key at j depends on i - j only.

Two ways to build the same features live here:
  * ``reference_features``: rotation through cos/sin tables and plain autograd-friendly ops (the naive,
    recurrent and fla forms; autograd differentiates them);
  * ``split_features`` / ``features_backward_``: the rotation as one complex product with cached rotors,
    computed without an autograd graph and differentiated by hand (the chunk form, the generation step's
    backward).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from linrope.ops.rope import rope_cos_sin, rope_frequencies, rotate

FEATURE_MAPS = ("elu", "cosine")


# --------------------------------------------------------------------------------------------------------
# φ
# --------------------------------------------------------------------------------------------------------
def feature_width(feature_map: str, d: int) -> int:
    """Width D' of φ(x) for a head of size d: cosine prepends the constant feature 1."""
    return d + 1 if feature_map == "cosine" else d


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


# --------------------------------------------------------------------------------------------------------
# the reference features (naive, recurrent)
# --------------------------------------------------------------------------------------------------------
def reference_features(q, k, *, feature_map: str, rope: str, positions, theta, dtype):
    """(q_num, k_num, q_den, k_den): complete feature maps, rotated where the placement says."""
    n, d = q.shape[-2], q.shape[-1]
    qf, kf = phi(q.to(dtype), feature_map), phi(k.to(dtype), feature_map)
    if rope == "none":
        qr, kr = qf, kf
    else:
        cos, sin = rope_tables(positions, n, d, theta, q.device, dtype)
        qr, kr = rotate(qf, cos, sin), rotate(kf, cos, sin)
    q_num, k_num = with_one(qr, feature_map), with_one(kr, feature_map)
    if rope == "both":
        q_den, k_den = q_num, k_num
    else:
        q_den, k_den = with_one(qf, feature_map), with_one(kf, feature_map)
    return q_num, k_num, q_den, k_den


# --------------------------------------------------------------------------------------------------------
# rotors: e^{i m θ_t}, cached for the default positions
# --------------------------------------------------------------------------------------------------------
_ROTORS: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_ROTOR_CACHE_SIZE = 4


def rope_rotors(positions, n: int, d: int, theta, device, dtype) -> torch.Tensor:
    """e^{i m θ_t} as a complex (N, d/2) tensor (angles formed in float64); cached for default positions.

    (Nothing is cached under ``torch.inference_mode``: an inference tensor could not be saved for a later
    backward.)"""
    key = None
    if positions is None and not torch.is_inference_mode_enabled():
        key = (n, d, str(device), dtype, None if theta is None else tuple(theta.tolist()))
        hit = _ROTORS.get(key)
        if hit is not None:
            _ROTORS.move_to_end(key)
            return hit
    cos, sin = rope_tables(positions, n, d, theta, device, dtype)
    rot = torch.complex(cos, sin)
    if key is not None:
        _ROTORS[key] = rot
        while len(_ROTORS) > _ROTOR_CACHE_SIZE:
            _ROTORS.popitem(last=False)
    return rot


def rotors_for(q: torch.Tensor, rope: str, positions, theta, dtype) -> Optional[torch.Tensor]:
    """The rotors for q's length and head dimension, or None when nothing is rotated."""
    if rope == "none":
        return None
    return rope_rotors(positions, q.shape[2], q.shape[3], theta, q.device, dtype)


def rotate_complex(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE: pairs (x[2t], x[2t+1]) as complex numbers times e^{i m θ_t} (= ``rope.rotate``);
    with ``rot.conj()`` the inverse rotation."""
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(st % 2 for st in x.stride()[:-1]):
        x = x.clone(memory_format=torch.contiguous_format)  # a copy (a one-position view at an odd offset is
        # already "contiguous", and .contiguous() would hand it back as it is)
    xc = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * rot).flatten(-2)


# --------------------------------------------------------------------------------------------------------
# features without a graph, and their backward (chunk)
# --------------------------------------------------------------------------------------------------------
def phi_no_grad(x: torch.Tensor, feature_map: str, dtype) -> torch.Tensor:
    """φ without its constant feature (``common.phi``), in the compute precision; no autograd graph."""
    if feature_map == "elu":
        return F.elu(x.to(dtype)).add_(1.0)
    return phi(x.to(dtype), feature_map)


def phi_backward_(g: torch.Tensor, x: torch.Tensor, f: torch.Tensor, feature_map: str, out: torch.Tensor) -> None:
    """out = ∂L/∂x given g = ∂L/∂f for f = φ(x) (``phi_no_grad``); g and f may be overwritten.

    elu+1: φ(x) = x + 1 > 1 for x > 0 and exp(x) ≤ 1 otherwise, so φ'(x) = min(φ(x), 1).
    cosine: f = x / r with r = max(‖x‖, m): ∂L/∂x = (g - f (f·g) [‖x‖ ≥ m]) / r."""
    if feature_map == "elu":
        d = f.clamp_max_(1.0)
    else:
        m = torch.finfo(f.dtype).tiny ** 0.5
        norm = torch.linalg.vector_norm(x.to(f.dtype), dim=-1, keepdim=True)
        fg = torch.linalg.vecdot(f, g).unsqueeze(-1).mul_(norm >= m)
        g = g.sub_(f.mul_(fg))
        d = norm.clamp_min_(m).reciprocal_()
    if out.dtype == g.dtype:
        torch.mul(g, d, out=out)
    else:
        out.copy_(g.mul_(d))


class Features(NamedTuple):
    """φ(q), φ(k) before rotation (``qf, kf``) and the features of the numerator and the denominator
    exactly as ``reference_features`` (the denominator's are the numerator's, same objects, unless the
    placement is "numerator")."""

    qf: torch.Tensor
    kf: torch.Tensor
    qn: torch.Tensor
    kn: torch.Tensor
    qd: torch.Tensor
    kd: torch.Tensor


def split_features(q, k, *, feature_map: str, rope: str, rot: Optional[torch.Tensor], dtype) -> Features:
    qf, kf = phi_no_grad(q, feature_map, dtype), phi_no_grad(k, feature_map, dtype)
    if rope == "none":
        q_num, k_num = with_one(qf, feature_map), with_one(kf, feature_map)
        return Features(qf, kf, q_num, k_num, q_num, k_num)
    q_num, k_num = with_one(rotate_complex(qf, rot), feature_map), with_one(rotate_complex(kf, rot), feature_map)
    if rope == "both":
        return Features(qf, kf, q_num, k_num, q_num, k_num)
    return Features(qf, kf, q_num, k_num, with_one(qf, feature_map), with_one(kf, feature_map))


def features_backward_(
    x, f, d_num, d_den, *, feature_map: str, rope: str, unrot: Optional[torch.Tensor], out: torch.Tensor
) -> None:
    """out = ∂L/∂x from the gradients of x's numerator and denominator features (``d_den`` None when they
    are shared), given the inverse rotors ``unrot``; ``f`` = φ(x) before rotation and ``d_num`` are
    overwritten."""
    one = 1 if feature_map == "cosine" else 0  # the constant feature of the cosine map gets no gradient
    g = d_num[..., one:]
    if rope != "none":
        g = rotate_complex(g, unrot)
    if d_den is not None:
        g = g.add_(d_den[..., one:])
    phi_backward_(g, x, f, feature_map, out)


__all__ = [
    "FEATURE_MAPS",
    "feature_width",
    "phi",
    "with_one",
    "rope_tables",
    "reference_features",
    "rope_rotors",
    "rotors_for",
    "rotate_complex",
    "phi_no_grad",
    "phi_backward_",
    "Features",
    "split_features",
    "features_backward_",
]
