"""Recurrent linear attention: one position at a time, carrying the state (S, z).

    S_i = γ S_{i-1} + kn_i v_iᵀ          (kn: numerator features, rotated unless rope="none")
    z_i = γ z_{i-1} + kd_i               (kd: denominator features, rotated only for rope="both")
    o_i = (qn_i S_i) / (qd_i · z_i + eps)

with S_{-1}, z_{-1} the initial state (zero by default), so that S_i = Σ_{j≤i} γ^(i-j) kn_j v_jᵀ + γ^(i+1) S0
exactly as ``naive.py`` defines it.  This is the generation form: ``recurrent_step`` costs O(d·d_v) time
and memory per token whatever the position (the RoPE angle is formed from the position itself).
Causal only.  States are float32 (float64 for float64 inputs) whatever the input precision.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .buffers import alloc
from .common import LinearAttentionState, check_args, compute_dtype, decay_log, guard_denominator
from .features import reference_features


def _zero_state(B: int, H: int, D: int, dv: int, dtype, device) -> LinearAttentionState:
    return LinearAttentionState(torch.zeros(B, H, D, dv, dtype=dtype, device=device),
                                torch.zeros(B, H, D, dtype=dtype, device=device))


def _check_state(state: LinearAttentionState, B: int, H: int, D: int, dv: int, feature_map: str) -> None:
    want_S, want_z = (B, H, D, dv), (B, H, D)
    if tuple(state.S.shape) != want_S or tuple(state.z.shape) != want_z:
        raise ValueError(f"state has S{tuple(state.S.shape)} z{tuple(state.z.shape)}; "
                         f"expected S{want_S} z{want_z} for feature_map={feature_map!r}")


def recurrent_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: Optional[LinearAttentionState] = None,
    *,
    position: Union[int, torch.Tensor] = 0,
    feature_map: str = "elu",
    rope: str = "numerator",
    eps: float = 1e-6,
    decay: Optional[torch.Tensor] = None,
    rope_theta: Optional[torch.Tensor] = None,
):
    """One generation step.  q_t, k_t: (B, H, d); v_t: (B, H, d_v); ``position``: the token's index.

    Returns (o_t (B, H, d_v) in v_t's dtype, new LinearAttentionState).  Also accepts (B, H, 1, ·) inputs
    and then returns (B, H, 1, d_v).
    """
    squeeze = q_t.dim() == 3
    if squeeze:
        q_t, k_t, v_t = q_t.unsqueeze(2), k_t.unsqueeze(2), v_t.unsqueeze(2)
    check_args(q_t, k_t, v_t, feature_map, rope)
    if q_t.shape[2] != 1:
        raise ValueError(f"recurrent_step takes one position; got {q_t.shape[2]}")
    B, H, _, d = q_t.shape
    dv = v_t.shape[-1]
    dtype = compute_dtype(q_t.dtype)
    pos = torch.as_tensor(position, device=q_t.device).reshape(1)
    qn, kn, qd, kd = reference_features(q_t, k_t, feature_map=feature_map, rope=rope, positions=pos, theta=rope_theta, dtype=dtype)
    qn, kn, qd, kd = qn[:, :, 0], kn[:, :, 0], qd[:, :, 0], kd[:, :, 0]
    D = qn.shape[-1]
    if state is None:
        state = _zero_state(B, H, D, dv, dtype, q_t.device)
    else:
        _check_state(state, B, H, D, dv, feature_map)
    S, z = state.S.to(dtype), state.z.to(dtype)
    log_gamma = decay_log(decay, H, q_t.device)
    if log_gamma is not None:
        gamma = torch.exp(log_gamma).to(dtype)
        S = S * gamma[:, None, None]
        z = z * gamma[:, None]
    S = S + kn.unsqueeze(-1) * v_t[:, :, 0].to(dtype).unsqueeze(-2)
    z = z + kd
    num = (qn.unsqueeze(-2) @ S).squeeze(-2)
    den = (qd * z).sum(-1)
    o = (num / guard_denominator(den + eps, rope).unsqueeze(-1)).to(v_t.dtype)
    if not squeeze:
        o = o.unsqueeze(2)
    return o, LinearAttentionState(S, z)


def recurrent_linear_attention(
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
):
    """Linear attention as a recurrence over positions (causal only); continues from ``initial_state``.

    q, k: (B, H, N, d); v: (B, H, N, d_v) -> (B, H, N, d_v) [, final LinearAttentionState].
    Differentiable through plain autograd (which keeps every step's state: a reference, not a trainer).
    """
    check_args(q, k, v, feature_map, rope)
    if not causal:
        raise ValueError("recurrent linear attention is causal only; use impl='chunk' or 'naive' for causal=False")
    B, H, N, _ = q.shape
    dv = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    qn, kn, qd, kd = reference_features(q, k, feature_map=feature_map, rope=rope, positions=positions, theta=rope_theta, dtype=dtype)
    D = qn.shape[-1]
    if initial_state is None:
        S, z = _zero_state(B, H, D, dv, dtype, q.device)
    else:
        _check_state(initial_state, B, H, D, dv, feature_map)
        S, z = initial_state.S.to(dtype), initial_state.z.to(dtype)
    log_gamma = decay_log(decay, H, q.device)
    gamma = None if log_gamma is None else torch.exp(log_gamma).to(dtype)
    vv = v.to(dtype)
    track = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, S, z))
    outs = [] if track else None
    out = None if track else alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
    for t in range(N):
        if gamma is not None:
            S = S * gamma[:, None, None]
            z = z * gamma[:, None]
        S = S + kn[:, :, t].unsqueeze(-1) * vv[:, :, t].unsqueeze(-2)
        z = z + kd[:, :, t]
        num = (qn[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
        o_t = num / guard_denominator((qd[:, :, t] * z).sum(-1) + eps, rope).unsqueeze(-1)
        if track:
            outs.append(o_t)
        else:
            out[:, :, t] = o_t
    if track:
        out = torch.stack(outs, dim=2).to(v.dtype) if N else v.new_empty(v.shape)
    if not output_final_state:
        return out
    return out, LinearAttentionState(S, z)


__all__ = ["recurrent_linear_attention", "recurrent_step"]
