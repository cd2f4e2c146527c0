"""Chunked linear attention: a masked C×C product inside each chunk, a running state across chunks.

The semantics are exactly those of ``naive.py``.  Per batch row and head, with the features of
``features.py`` (φ, rotated where the placement says):

    o_i   = num_i / (den_i + eps)
    num_i = Σ_{j≤i} γ^(i-j) (qn_i·kn_j) v_j + γ^(i+1) qn_iᵀ S0
    den_i = Σ_{j≤i} γ^(i-j) (qd_i·kd_j)     + γ^(i+1) qd_i·z0

(``qn, kn``: numerator features, rotated unless ``rope="none"``; ``qd, kd``: denominator features,
rotated only for ``rope="both"``; γ = γ_h per head, 1 without decay; the initial state (S0, z0) sits at
position -1.)

What is carried
  * ``rope="both"`` / ``"none"``: numerator and denominator share their features, so the denominator is
    folded into the numerator by appending a column of ones to v: ``v' = [v, 1]``, ``S' = [S | z]``
    (D'×(d_v+1)), ``num' = [num, den]``.  One call of the matrix kernel (``matrix.py``) does both.
  * ``rope="numerator"``: ``S = Σ_j γ^(n-1-j) kn_j v_jᵀ`` (rotated) runs through the matrix kernel, while
    ``z = Σ_j γ^(n-1-j) kd_j`` (unrotated) is a decayed prefix sum of vectors (``scans.dcumsum``):
    ``den_i = qd_i · zc_i`` with ``zc_i = Σ_{j≤i} γ^(i-j) kd_j + γ^(i+1) z0``.
  (D' = d, or d+1 for the cosine map φ(x) = [1, x̂].)
Causal sequences are walked in blocks of whole chunks (``tables.plan_blocks``), the state handed from
block to block exactly as from chunk to chunk.

Backward: with g = ∂L/∂o and D = den + eps,
    ∂L/∂num_i = g_i / D_i,   ∂L/∂den_i = -(g_i·o_i) / D_i,
the numerator kernel is differentiated by ``matrix.matrix_bwd`` block by block in reverse, carrying
∂L/∂state; the denominator's vector sums by a reversed decayed prefix sum (∂L/∂z carried likewise); the
features by hand (``features.features_backward_``: the inverse rotation, then φ'), so the backward builds
no autograd graph of its own.  Saved between forward and backward: q, k, v, the initial state, the output,
the denominator (B, H, N) and the states at block boundaries ((N/block)·D'·d_v numbers).  Features, C×C
products and chunk states are recomputed block by block, so nothing of size N·d² (nor N·C) is kept.  The
output in the input precision enters ∂L/∂den (as FlashAttention's backward uses O).

Precision: features, products and states are float32 for float16/bfloat16 inputs (float64 for float64);
the output comes back in v's dtype, the final state in float32/float64.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from .buffers import alloc
from .common import LinearAttentionState, check_args, compute_dtype, decay_log
from .features import features_backward_, rotors_for, split_features
from .matrix import matrix_bwd, matrix_fwd
from .scans import dcumsum, dcumsum_reverse, dsum_symmetric
from .tables import Chunks, Tables, plan_blocks


class _Cfg(NamedTuple):
    feature_map: str
    rope: str
    causal: bool
    eps: float
    chunk_size: int


def _shared_features(rope: str) -> bool:
    """Numerator and denominator use the same features: fold the denominator in as a column of ones."""
    return rope in ("both", "none")


def _values(v: torch.Tensor, shared: bool, ch: Chunks, dtype) -> torch.Tensor:
    """v (or [v, 1] when the denominator is folded in), zero-padded to whole chunks: (B,H,nc·C,E)."""
    if not shared:  # one contiguous copy (a block of v is a strided slice; batched matmuls want it whole)
        return v if (not ch.pad and v.dtype == dtype and v.is_contiguous()) else ch.padded(v, dtype=dtype)
    return ch.padded(v, v.new_ones(()).expand(*v.shape[:-1], 1), dtype=dtype)


class ChunkLinearAttentionFunction(torch.autograd.Function):
    """Chunked linear attention with a recomputing backward.

    Saved for backward: q, k, v, the initial state, the output, the denominator (B, H, N) and the state at
    each block boundary ((N / block)·d² numbers).  Features, C×C products and chunk states are
    recomputed block by block in backward, which walks the blocks in reverse carrying ∂L/∂state.
    """

    @staticmethod
    def forward(ctx, q, k, v, S0, z0, positions, theta, log_gamma, cfg: _Cfg):
        dtype = compute_dtype(q.dtype)
        B, H, N, _ = q.shape
        dv = v.shape[-1]
        shared = _shared_features(cfg.rope)
        tables = Tables(cfg.chunk_size, log_gamma, dtype, q.device)
        rot = rotors_for(q, cfg.rope, positions, theta, dtype)
        S = None if S0 is None else S0.to(dtype)
        z = None if z0 is None else z0.to(dtype)
        if shared and S is not None:  # the denominator rides along as the last value column: S' = [S | z]
            S = torch.cat((S, z.unsqueeze(-1)), dim=-1)
        out = alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
        denom = alloc((B, H, N), dtype=dtype, device=q.device)
        starts_S, starts_z = [], []  # states entering blocks 1, 2, … (saved for backward)
        blocks = plan_blocks(B, H, N, max(q.shape[-1], dv), cfg.chunk_size, cfg.causal, q.device)
        for b, (s, e) in enumerate(blocks):
            if b > 0:
                starts_S.append(S)
                starts_z.append(z)
            ch = tables(e - s)
            _, _, qn, kn, qd, kd = split_features(q[:, :, s:e], k[:, :, s:e], feature_map=cfg.feature_map, rope=cfg.rope,
                                             rot=None if rot is None else rot[s:e], dtype=dtype)
            num, S = matrix_fwd(qn, kn, _values(v[:, :, s:e], shared, ch, dtype), ch, cfg.causal, S)
            if shared:
                den, num = num[..., dv], num[..., :dv]
            else:
                if cfg.causal:
                    zc = dcumsum(kd, ch, z)
                    z = zc[:, :, -1].contiguous()
                else:
                    zc = dsum_symmetric(kd, ch)
                den = torch.linalg.vecdot(qd, zc)
                del zc
            del qn, kn, qd, kd
            torch.add(den, cfg.eps, out=denom[:, :, s:e])
            torch.div(num, denom[:, :, s:e].unsqueeze(-1), out=out[:, :, s:e])
            del num, den
        ctx.cfg, ctx.shared, ctx.blocks = cfg, shared, blocks
        saved_S = torch.stack(starts_S) if starts_S else None
        saved_z = torch.stack(starts_z) if (starts_z and not shared) else None
        ctx.save_for_backward(q, k, v, S0, z0, positions, theta, log_gamma, out, denom, saved_S, saved_z)
        ctx.set_materialize_grads(False)
        if not cfg.causal:
            return out
        if shared:
            S, z = S[..., :dv], S[..., dv]
        return out, S.contiguous(), z.contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out, g_S=None, g_z=None):
        q, k, v, S0, z0, positions, theta, log_gamma, out, denom, saved_S, saved_z = ctx.saved_tensors
        cfg, shared, blocks = ctx.cfg, ctx.shared, ctx.blocks
        dtype = compute_dtype(q.dtype)
        B, H, N, _ = q.shape
        dv = v.shape[-1]
        E = dv + 1 if shared else dv
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        tables = Tables(cfg.chunk_size, log_gamma, dtype, q.device)
        rot = rotors_for(q, cfg.rope, positions, theta, dtype)
        S_first = None if S0 is None else S0.to(dtype)
        z_first = None if z0 is None else z0.to(dtype)
        if shared and S_first is not None:
            S_first = torch.cat((S_first, z_first.unsqueeze(-1)), dim=-1)
        # ∂L/∂(final state), carried backwards from block to block
        dS = dz = None
        if shared:
            if g_S is not None or g_z is not None:
                Dp = q.shape[-1] + (1 if cfg.feature_map == "cosine" else 0)
                dS = torch.zeros(B, H, Dp, E, dtype=dtype, device=q.device)
                if g_S is not None:
                    dS[..., :dv] = g_S
                if g_z is not None:
                    dS[..., dv] = g_z
        else:
            dS = None if g_S is None else g_S.to(dtype)
            dz = None if g_z is None else g_z.to(dtype)
        dq = alloc(q.shape, dtype=q.dtype, device=q.device) if need_q else None
        dk = alloc(k.shape, dtype=k.dtype, device=k.device) if need_k else None
        dvl = alloc(v.shape, dtype=v.dtype, device=v.device) if need_v else None
        for b in range(len(blocks) - 1, -1, -1):
            s, e = blocks[b]
            n = e - s
            ch = tables(n)
            S_start = S_first if b == 0 else saved_S[b - 1]
            z_start = z_first if b == 0 else (None if saved_z is None else saved_z[b - 1])
            rot_b = None if rot is None else rot[s:e]
            unrot_b = None if rot is None else rot_b.conj().resolve_conj()  # the inverse rotation
            qf, kf, qn, kn, qd, kd = split_features(q[:, :, s:e], k[:, :, s:e], feature_map=cfg.feature_map,
                                               rope=cfg.rope, rot=rot_b, dtype=dtype)  # recomputed
            # ∂L/∂num = g / D and ∂L/∂den = -(g·o) / D, written into a zero-padded (B,H,nc·C,E) buffer
            do = alloc((B, H, ch.nc * ch.C, E), dtype=dtype, device=q.device)
            do[:, :, n:].zero_()
            if g_out is None:
                do[:, :, :n].zero_()
                dden = torch.zeros(B, H, n, dtype=dtype, device=q.device)
            else:
                torch.div(g_out[:, :, s:e], denom[:, :, s:e].unsqueeze(-1), out=do[:, :, :n, :dv])
                dden = torch.linalg.vecdot(do[:, :, :n, :dv], out[:, :, s:e].to(dtype)).neg_()
            if shared:
                do[:, :, :n, dv].copy_(dden)
            dqn, dkn, dvv, dS = matrix_bwd(qn, kn, _values(v[:, :, s:e], shared, ch, dtype), do, ch, cfg.causal,
                                            S_start, dS)
            del do
            dqd = dkd = None
            if not shared:  # the denominator den_i = qd_i · zc_i
                y = dden.unsqueeze(-1) * qd
                if cfg.causal:
                    dqd = dcumsum(kd, ch, z_start).mul_(dden.unsqueeze(-1))
                    if dz is not None:
                        y[:, :, -1] += dz
                    dkd = dcumsum_reverse(y, ch)
                    dz = dkd[:, :, 0] if ch.gamma is None else dkd[:, :, 0] * ch.gamma[:, None]
                else:
                    dqd = dsum_symmetric(kd, ch) * dden.unsqueeze(-1)
                    dkd = dsum_symmetric(y, ch)
                del y
            if need_v:
                dvl[:, :, s:e].copy_(dvv[..., :dv])
            del dvv, qn, kn, qd, kd
            for x, f, d_num, d_den, grad in ((q, qf, dqn, dqd, dq), (k, kf, dkn, dkd, dk)):
                if grad is not None:
                    features_backward_(x[:, :, s:e], f, d_num, d_den, feature_map=cfg.feature_map, rope=cfg.rope,
                                        unrot=unrot_b, out=grad[:, :, s:e])
            del qf, kf, dqn, dkn, dqd, dkd
        dS0 = dz0 = None
        if S0 is not None and cfg.causal:
            if shared:
                dS0, dz0 = dS[..., :dv], dS[..., dv]
            else:
                dS0, dz0 = dS, dz
            dS0 = dS0.to(S0.dtype) if (dS0 is not None and ctx.needs_input_grad[3]) else None
            dz0 = dz0.to(z0.dtype) if (dz0 is not None and ctx.needs_input_grad[4]) else None
        return dq, dk, dvl, dS0, dz0, None, None, None, None


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------
def check_state(state: Optional[LinearAttentionState], q: torch.Tensor, v: torch.Tensor, feature_map: str) -> None:
    if state is None:
        return
    B, H, _, d = q.shape
    D = d + 1 if feature_map == "cosine" else d
    want_S, want_z = (B, H, D, v.shape[-1]), (B, H, D)
    if tuple(state.S.shape) != want_S or tuple(state.z.shape) != want_z:
        raise ValueError(f"initial_state has S{tuple(state.S.shape)} z{tuple(state.z.shape)}; "
                         f"expected S{want_S} z{want_z} for feature_map={feature_map!r}")


def chunk_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: str = "elu",
    rope: str = "numerator",
    causal: bool = True,
    positions: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    decay: Optional[torch.Tensor] = None,
    rope_theta: Optional[torch.Tensor] = None,
    initial_state: Optional[LinearAttentionState] = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
):
    """Chunked linear attention (same semantics as ``naive_linear_attention``; see the module docstring).

    q, k: (B, H, N, d); v: (B, H, N, d_v) -> (B, H, N, d_v), plus the final ``LinearAttentionState`` when
    ``output_final_state``.  Memory is linear in N in forward and backward.
    """
    check_args(q, k, v, feature_map, rope, "chunk", chunk_size)
    if not causal and (initial_state is not None or output_final_state):
        raise ValueError("initial/final states only make sense for causal linear attention")
    check_state(initial_state, q, v, feature_map)
    B, H, N, d = q.shape
    if positions is not None:
        positions = positions.to(q.device)
        if positions.dim() != 1 or positions.shape[0] != N:
            raise ValueError(f"positions must be a 1-D tensor of length N={N}; got shape {tuple(positions.shape)}")
    for name, t in (("decay", decay), ("rope_theta", rope_theta)):
        if torch.is_tensor(t) and t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"chunk linear attention does not differentiate {name}; pass a fixed tensor "
                             f"({name}.detach()) or use impl='naive'")
    log_gamma = decay_log(decay, H, q.device)
    if N == 0:
        out = v.new_empty(v.shape)
        if not output_final_state:
            return out
        dtype = compute_dtype(q.dtype)
        D = d + 1 if feature_map == "cosine" else d
        if initial_state is None:
            return out, LinearAttentionState(q.new_zeros(B, H, D, v.shape[-1], dtype=dtype), q.new_zeros(B, H, D, dtype=dtype))
        return out, LinearAttentionState(initial_state.S.to(dtype), initial_state.z.to(dtype))
    S0 = z0 = None
    if initial_state is not None:
        S0, z0 = initial_state.S, initial_state.z
    cfg = _Cfg(feature_map, rope, bool(causal), float(eps), int(chunk_size))
    res = ChunkLinearAttentionFunction.apply(q, k, v, S0, z0, positions, rope_theta, log_gamma, cfg)
    if not causal:
        return res
    out, S, z = res
    if not output_final_state:
        return out
    return out, LinearAttentionState(S, z)


__all__ = ["chunk_linear_attention", "ChunkLinearAttentionFunction"]
