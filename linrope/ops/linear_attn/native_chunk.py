"""The chunk form's forward and backward as native loops on a CPU: each (batch row, head) walked chunk by chunk in C++.

For the case studies train — elu+1 features, RoPE in the numerator only, causal, no decay, no packed documents,
normalised, float32 or float64 (bfloat16: ``native_bf16.py``'s walks) on a CPU — ``chunk_kernel.chunk_forward``
hands the whole walk to ``forward`` and ``chunk_kernel.chunk_backward`` to ``backward``.  Forward, per chunk of C positions, with every temporary in a few
small buffers of the thread's own (about 100 KiB at C = d = 64, so they stay in L1/L2):

    qf, kf = elu(q) + 1, elu(k) + 1;  qn, kn = qf, kf rotated       (one pass, csrc/features.h)
    P   = tril(qn knᵀ)                                                (C×C)
    num = [P | qn] · [v ; S]                                          (one product, inner size C + d)
    den_i = qf_i · (z + Σ_{j≤i} kf_j);   o_i = num_i / (den_i + eps)
    S  += knᵀ v;   z += Σ_j kf_j

and the states entering every block of ``chunk.plan`` (whole chunks) are saved as the torch path saves them.
Backward, block by block in reverse: the states entering each chunk of the block recomputed from the saved one, then
the chunks in reverse carrying R = ∂L/∂S and r = ∂L/∂z (g = ∂L/∂o, D = den + eps, features recomputed):

    dnum = g / D;   dden_i = -(dnum_i · o_i);   dP = tril(dnum vᵀ)
    dqn = dP kn + dnum Sᵀ;   dkn = dPᵀ qn + v Rᵀ;   dv = Pᵀ dnum + kn R;   R += qnᵀ dnum
    dqf_i = dden_i (z + Σ_{j≤i} kf_j);   dkf_j = r + Σ_{i≥j} dden_i qf_i;   r += Σ_i dden_i qf_i
    dq = min(qf, 1) ⊙ (R⁻¹ dqn + dqf), dk likewise                   (``native.elu_rope_backward``'s formula)

The products call the BLAS's ``sgemm_``/``dgemm_`` (MKL's, exported by torch's libtorch_cpu here) on the chunk's
buffers; torch's batched products over a block of 4 096 positions kept ~10 tensors of 1 MiB live and ran from the
shared L3, and each block paid ~30 operators' dispatch.  The rows run on OpenMP threads (torch's thread count in a
call run whole, one inside the heads' tasks of ``heads.py``; MKL held to one thread inside), the GIL released.
Either direction works on the other path's saved states.

The C++ is csrc/chunk.cpp, built on first use (``extensions.Extension``).  Where the build fails, or the BLAS symbols are
missing (a torch without MKL or OpenBLAS exporting them), the torch path runs and ``why_not()`` says why (one
line, printed once).  ``ENABLED = False`` (or ``native.ENABLED = False``) runs the torch path everywhere."""

from __future__ import annotations

from typing import Optional

import torch

from linrope.ops.rope import compute_dtype

from . import native, native_bf16
from .buffers import alloc
from .extensions import Extension

ENABLED = True


def _blas(module) -> Optional[str]:
    return None if module.have_blas() else "torch's libraries export no sgemm_/dgemm_"


WALK = Extension(
    "linrope_native_chunk",
    ["chunk.cpp"],
    ["have_blas", "forward", "backward"],
    what="native chunk loop",
    fallback="the chunk kernel uses torch ops",
    cflags=["-O3", "-fopenmp"],  # the rows' parallel region (forward)
    ldflags=["-fopenmp"],  # libgomp.so.1: the runtime torch has already loaded
    check=_blas,
)


def why_not() -> Optional[str]:
    """Why the native chunk loop does not run (None when it does, or has not been tried)."""
    if not (ENABLED and native.ENABLED):
        return "native_chunk.ENABLED or native.ENABLED is False"
    return WALK.why


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg, log_gamma, documents) -> bool:
    """The one predicate for the native walk: elu+1 features, RoPE in the numerator, causal, normalised, no decay,
    no packed documents, q, k, v of one dtype, float32 or float64 (or bfloat16 where ``native_bf16.serves``), on a
    CPU, and the extension built."""
    return (
        ENABLED
        and native.ENABLED
        and cfg.feature_map == "elu"
        and cfg.rope == "numerator"
        and cfg.causal
        and cfg.normalize
        and log_gamma is None
        and documents is None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64, torch.bfloat16)
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and q.shape[-1] % 2 == 0
        and WALK.get() is not None
        and (q.dtype != torch.bfloat16 or native_bf16.serves(q, v, min(cfg.chunk_size, q.shape[2])))
    )


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _geometry(N: int, cfg, blocks) -> tuple:
    """(C, chunks per block) of the walk: the torch path's chunks, and its blocks (whole chunks, all but the last of
    one size)."""
    C = max(1, min(cfg.chunk_size, N))
    per = (blocks[0][1] - blocks[0][0]) // C if len(blocks) > 1 else -(-N // C)
    if len(blocks) > 1 and any(s != i * per * C for i, (s, _) in enumerate(blocks)):
        raise ValueError(f"blocks of whole chunks expected, got {blocks[:3]}…")
    return C, per


def _cos_sin(rot: torch.Tensor, N: int, d: int, dtype) -> torch.Tensor:
    return torch.view_as_real(rot).to(dtype).reshape(N, d).contiguous()


def forward(q, k, v, S0, z0, rot, cfg, blocks, out=None, denom=None):
    """``chunk_kernel.chunk_forward``'s results for a call ``usable`` accepts: (out, denom, S_final, z_final,
    saved_S, saved_z), the saved states those entering ``blocks[1:]``; ``out``/``denom`` as there."""
    B, H, N, d = q.shape
    dv, dtype = v.shape[-1], compute_dtype(q.dtype)  # float32 for bfloat16 (native_bf16.py)
    C, per = _geometry(N, cfg, blocks)
    q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
    cs = _cos_sin(rot, N, d, dtype)
    if out is None:
        out = alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
    if denom is None:
        denom = alloc((B, H, N), dtype=dtype, device=q.device)
    S0 = None if S0 is None else S0.to(dtype).contiguous()
    z0 = None if z0 is None else z0.to(dtype).contiguous()
    S = alloc((B, H, d, dv), dtype=dtype, device=q.device)
    z = alloc((B, H, d), dtype=dtype, device=q.device)
    nb = len(blocks) - 1
    saved_S = alloc((nb, B, H, d, dv), dtype=dtype, device=q.device)
    saved_z = alloc((nb, B, H, d), dtype=dtype, device=q.device)
    walk = native_bf16.WALK.get().forward_bf16 if q.dtype == torch.bfloat16 else WALK.get().forward
    walk(q, k, v, cs, S0, z0, out, denom, S, z, saved_S, saved_z, C, per, float(cfg.eps))
    return out, denom, S, z, (saved_S if nb else None), (saved_z if nb else None)


def backward(g_out, g_S, g_z, q, k, v, S0, z0, rot, out, denom, saved_S, saved_z, cfg, needs, blocks, grads=None):
    """``chunk_kernel.chunk_backward``'s (dq, dk, dv, dS0, dz0) for a call ``usable`` accepts whose forward
    ``forward`` (or the torch path: the same saved states) ran; ``needs`` and ``grads`` as there."""
    B, H, N, d = q.shape
    dv, dtype = v.shape[-1], compute_dtype(q.dtype)
    C, per = _geometry(N, cfg, blocks)
    q, k, v, g_out, out = (_dense_last(t) for t in (q, k, v, g_out, out))

    def small(t):
        return None if t is None else t.to(dtype).contiguous()

    S0c, z0c, g_S, g_z = small(S0), small(z0), small(g_S), small(g_z)
    nb = len(blocks) - 1
    if saved_S is None:
        saved_S = q.new_empty((0, B, H, d, dv), dtype=dtype)
        saved_z = q.new_empty((0, B, H, d), dtype=dtype)
    given = [None, None, None] if grads is None else list(grads)
    bufs = [t if (t is not None and t.stride(-1) == 1 and t.dtype == x.dtype) else alloc(x.shape, dtype=x.dtype,
            device=x.device) for t, x in zip(given, (q, k, v))]  # fmt: skip
    dS0 = alloc((B, H, d, dv), dtype=dtype, device=q.device)
    dz0 = alloc((B, H, d), dtype=dtype, device=q.device)
    if saved_S.shape[0] != nb:
        raise ValueError(f"{saved_S.shape[0]} saved states for {nb + 1} blocks")
    walk = native_bf16.WALK.get().backward_bf16 if q.dtype == torch.bfloat16 else WALK.get().backward
    walk(q, k, v, _cos_sin(rot, N, d, dtype), g_out, out, denom, S0c, z0c, g_S, g_z, saved_S, saved_z, *bufs, dS0,
         dz0, C, per)  # fmt: skip
    for t, b in zip(given, bufs):
        if t is not None and t is not b:
            t.copy_(b)
    res = [(t if t is not None else b) if need else None for t, b, need in zip(given, bufs, needs[:3])]
    dS0 = dS0.to(S0.dtype) if (S0 is not None and needs[3]) else None
    dz0 = dz0.to(z0.dtype) if (z0 is not None and needs[4]) else None
    return (*res, dS0, dz0)


__all__ = ["ENABLED", "usable", "why_not", "forward", "backward"]
