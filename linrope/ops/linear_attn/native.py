"""Native loops for the chunk kernel on a CPU: the unrotated denominator's scans, and elu+1 features with RoPE.

The denominator of ``rope="numerator"`` is a running sum along the positions: den_i = qd_i · (z0 + Σ_{j≤i} kd_j),
and its backward two more (dqd_i = dden_i (z0 + Σ_{j≤i} kd_j); dkd_j = dz + Σ_{i≥j} dden_i qd_i).  torch's cumsum
along the positions of one head (4 096 × 64) takes about 280 µs on this machine and the kernel ran three of them
(and two flips) per block; these loops take about 35 µs for the forward's, each position once, its d numbers in
one SIMD pass.  ``elu_rope`` forms φ(x) = elu(x) + 1 and its rotation in one pass (torch's ops took three), and
``elu_rope_backward`` their gradient in one (four); docs/mathematics.md, "Native scans and features on a CPU".
The C++ is csrc/scans.cpp; its features' loops and vectorised exp (csrc/features.h) are shared with the native
chunk loop (``native_chunk.py``).

Built on first use (``extensions.Extension``) and called with the GIL released, so that the heads' tasks
(``heads.py``) run side by side; inside, the loops run on the calling thread (compiled without OpenMP,
``at::parallel_for`` runs its whole range there).  Where the compiler or ninja is missing the kernel runs its torch
ops and ``why_not()`` says why (one line, printed once).  ``ENABLED = False`` runs the torch ops everywhere (the
benchmarks' old plan; the tests of both paths)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .buffers import alloc
from .extensions import Extension

ENABLED = True

SCANS = Extension(
    "linrope_native_scans",
    ["scans.cpp"],
    ["denominator", "denominator_backward", "elu_rope", "elu_rope_backward"],
    what="native scans",
    fallback="the chunk kernel uses torch's cumsum",
    cflags=["-O3", "-fopenmp-simd"],
)


def why_not() -> Optional[str]:
    """Why the native scans do not run (None when they do, or have not been tried)."""
    return SCANS.why if ENABLED else "native.ENABLED is False"


def usable(x: torch.Tensor, ch) -> bool:
    """The native scans serve this block: a CPU tensor of float32 or float64, no decay, no packed documents."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not ch.decay
        and ch.docs is None
        and SCANS.get() is not None
    )


def _state_copy(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """A (B, H, d) state of ``like``'s dtype the scan may overwrite: a copy of ``t``, or zeros."""
    shape = like.shape[:2] + like.shape[-1:]
    return like.new_zeros(shape) if t is None else t.to(like.dtype, copy=True).contiguous()


def _dense(*ts: torch.Tensor) -> None:
    for t in ts:  # the loops index rows · n · d: no other layout
        if not t.is_contiguous():
            raise ValueError(f"native scans need contiguous tensors, got strides {t.stride()} for {tuple(t.shape)}")


def denominator(qd: torch.Tensor, kd: torch.Tensor, z0: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(den, z): den_i = qd_i · (z0 + Σ_{j≤i} kd_j) (B, H, n) and the state after the block (B, H, d); z0 None: 0."""
    qd, kd = qd.contiguous(), kd.contiguous()
    _dense(qd, kd)
    z = _state_copy(z0, kd)
    den = alloc(qd.shape[:3], dtype=qd.dtype, device=qd.device)
    SCANS.get().denominator(qd, kd, z, den)
    return den, z


def denominator_backward(
    qd: torch.Tensor, kd: torch.Tensor, dden: torch.Tensor, z0: Optional[torch.Tensor], dz: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dqd, dkd, dz0) for ``denominator``'s den (∂L/∂den = ``dden``) and its final state (∂L/∂z = ``dz``, None: 0):
    dqd_i = dden_i (z0 + Σ_{j≤i} kd_j), dkd_j = dz + Σ_{i≥j} dden_i qd_i, and dz0 = dkd_0."""
    qd, kd, dden = qd.contiguous(), kd.contiguous(), dden.to(qd.dtype).contiguous()
    z, acc = _state_copy(z0, kd), _state_copy(dz, kd)
    dqd = alloc(qd.shape, dtype=qd.dtype, device=qd.device)
    dkd = alloc(kd.shape, dtype=kd.dtype, device=kd.device)
    SCANS.get().denominator_backward(qd, kd, dden, z, acc, dqd, dkd)
    return dqd, dkd, acc


def features_usable(x: torch.Tensor, feature_map: str, rope: str, dtype: torch.dtype) -> bool:
    """The fused elu+1 features and rotation serve this block (``elu_rope``): elu+1 with RoPE on a CPU, computed in
    float32 or float64, the last dimension dense."""
    return (
        ENABLED
        and feature_map == "elu"
        and rope != "none"
        and x.device.type == "cpu"
        and dtype in (torch.float32, torch.float64)
        and x.stride(-1) == 1
        and SCANS.get() is not None
    )


def _cos_sin(rot: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, d): the rotors' (cos, sin) of every pair, in pair order."""
    return torch.view_as_real(rot).to(dtype).reshape(rot.shape[0], -1).contiguous()


def elu_rope(x: torch.Tensor, rot: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(f, r): f = elu(x) + 1 and r = f rotated by ``rot`` (complex (n, d/2), interleaved pairs), both (B, H, n, d)
    of ``dtype``, in one pass over x (``split_features`` for elu+1 with RoPE)."""
    if x.dtype != dtype:
        x = x.to(dtype)  # 16-bit inputs: converted by torch first (read in the loop, bfloat16 at d = 16 ran 10x slower)
    f = alloc(x.shape, dtype=dtype, device=x.device)
    r = alloc(x.shape, dtype=dtype, device=x.device)
    SCANS.get().elu_rope(x, _cos_sin(rot, dtype), f, r)
    return f, r


def elu_rope_backward(
    f: torch.Tensor, g_num: torch.Tensor, g_den: Optional[torch.Tensor], rot: torch.Tensor, out: torch.Tensor
) -> None:
    """out = ∂L/∂x = min(f, 1) ⊙ (R⁻¹ g_num + g_den) for f = elu(x) + 1 (``elu_rope``), from the gradients of the
    rotated features (``g_num``) and of the plain ones (``g_den``, None when the placement shares them); ``out``
    may be a strided view, of another dtype (then written through a copy)."""
    dtype = f.dtype
    g_num = g_num.to(dtype).contiguous()
    g_den = None if g_den is None else g_den.to(dtype).contiguous()
    direct = out.dtype == dtype and out.stride(-1) == 1
    target = out if direct else alloc(f.shape, dtype=dtype, device=f.device)
    SCANS.get().elu_rope_backward(f.contiguous(), g_num, g_den, _cos_sin(rot, dtype), target)
    if not direct:
        out.copy_(target)


__all__ = [
    "ENABLED",
    "usable",
    "why_not",
    "denominator",
    "denominator_backward",
    "features_usable",
    "elu_rope",
    "elu_rope_backward",
]
