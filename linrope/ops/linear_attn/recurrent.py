"""Recurrent linear attention: one position at a time, carrying the state (S, z).

    S_i = γ S_{i-1} + kn_i v_iᵀ          (kn: numerator features, rotated unless rope="none")
    z_i = γ z_{i-1} + kd_i               (kd: denominator features, rotated only for rope="both")
    o_i = (qn_i S_i) / (qd_i · z_i + eps)        (normalize=False: o_i = qn_i S_i; z_i still carried)

with S_{-1}, z_{-1} the initial state (zero by default), so that S_i = Σ_{j≤i} γ^(i-j) kn_j v_jᵀ + γ^(i+1) S0
exactly as ``naive.py`` defines it.  This is the generation form: ``recurrent_step`` costs O(d·d_v) time
and memory per token whatever the position (the RoPE angle is formed from the position itself).
Causal only.  States are float32 (float64 for float64 inputs) whatever the input precision.
"""

from typing import Optional, Union

import torch
from torch import Tensor

from linrope.ops.rope import compute_dtype

from .buffers import alloc
from .common import (
    Args,
    LinearAttentionState,
    autocast_off,
    check_args,
    check_decay,
    check_normalize,
    check_state,
    check_theta,
    decay_log,
    guard_denominator,
    without_autocast,
    zero_state,
)
from .documents import continues
from .features import feature_width, reference_features


# --------------------------------------------------------------------------------------------------------
# one step as a registered operator (``linrope::recurrent_step``, the generation step): opaque to torch.compile,
# with a fake implementation from shapes alone; its backward recomputes the step under autograd
# --------------------------------------------------------------------------------------------------------
def _gamma(decay: Optional[Tensor], dtype) -> Optional[Tensor]:
    """γ_h (H,) in the compute dtype, formed from its float64 log as every form forms it; None without decay."""
    log_gamma = decay_log(decay)
    return None if log_gamma is None else torch.exp(log_gamma).to(dtype)


def _advance(S: Tensor, z: Tensor, kn: Tensor, kd: Tensor, v: Tensor, gamma: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """The state one position on: decayed by γ, then this position's key added (S += kn vᵀ, z += kd)."""
    if gamma is not None:
        S, z = S * gamma[:, None, None], z * gamma[:, None]
    return S + kn.unsqueeze(-1) * v.unsqueeze(-2), z + kd


def _output(num: Tensor, qd: Tensor, z: Tensor, eps: float, rope: str, normalize: bool) -> Tensor:
    """o = num / (qd·z + eps), the denominator guarded (``guard_denominator``); num alone without normalising."""
    if not normalize:
        return num
    return num / guard_denominator((qd * z).sum(-1) + eps, rope).unsqueeze(-1)


def _step(q, k, v, S, z, position, theta, decay, feature_map: str, rope: str, eps: float, normalize: bool = True):
    """q, k: (B, H, d); v: (B, H, d_v); S, z: the state before the step -> (o, S, z) after it."""
    dtype = compute_dtype(q.dtype)
    qn, kn, qd, kd = (
        f[:, :, 0]
        for f in reference_features(
            q.unsqueeze(2),
            k.unsqueeze(2),
            feature_map=feature_map,
            rope=rope,
            positions=position.reshape(1),
            theta=theta,
            dtype=dtype,
        )
    )
    S, z = _advance(S.to(dtype), z.to(dtype), kn, kd, v.to(dtype), _gamma(decay, dtype))
    num = (qn.unsqueeze(-2) @ S).squeeze(-2)
    return _output(num, qd, z, eps, rope, normalize).to(v.dtype), S, z


@torch.library.custom_op("linrope::recurrent_step", mutates_args=())
def recurrent_step_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    S: Tensor,
    z: Tensor,
    position: Tensor,
    theta: Optional[Tensor],
    decay: Optional[Tensor],
    feature_map: str,
    rope: str,
    eps: float,
    normalize: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    with autocast_off(q.device.type):  # autocast does not reach inside (common.autocast_off)
        # S, z: new (S + …, z + …)
        return _step(q, k, v, S, z, position, theta, decay, feature_map, rope, eps, normalize)


@recurrent_step_op.register_fake
def _(q, k, v, S, z, position, theta, decay, feature_map, rope, eps, normalize=True):
    dtype = compute_dtype(q.dtype)
    return v.new_empty(v.shape), S.new_empty(S.shape, dtype=dtype), z.new_empty(z.shape, dtype=dtype)


def _step_setup_context(ctx, inputs, output):
    q, k, v, S, z, position, theta, decay, feature_map, rope, eps, normalize = inputs
    ctx.save_for_backward(q, k, v, S, z, position, theta, decay)
    ctx.options = (feature_map, rope, eps, normalize)


def _step_backward(ctx, g_o, g_S, g_z):
    """The step recomputed with autograd on (q, k, v, S, z, θ, γ) and differentiated: one step holds O(D'·d_v)
    numbers per head, so nothing is gained by a hand-written backward (generation runs without gradients)."""
    saved = list(ctx.saved_tensors)  # q, k, v, S, z, position, theta, decay
    needs = [bool(n) for n in ctx.needs_input_grad[:8]]
    needs[5] = False  # the position
    if not any(needs):
        return (None,) * 12
    with torch.enable_grad(), autocast_off(saved[0].device.type):
        leaves = [t if t is None else t.detach().requires_grad_(need) for t, need in zip(saved, needs)]
        outs = _step(*leaves, *ctx.options)
        wrt = [t for t, need in zip(leaves, needs) if need]
        grads = iter(torch.autograd.grad(outs, wrt, (g_o, g_S, g_z), allow_unused=True, materialize_grads=True))
    return (*(next(grads) if need else None for need in needs), *(None,) * 4)


recurrent_step_op.register_autograd(_step_backward, setup_context=_step_setup_context)


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
    normalize: bool = True,
):
    """One generation step.  q_t, k_t: (B, H, d); v_t: (B, H, d_v); ``position``: the token's index.
    ``normalize=False``: the numerator alone (``linrope.ops.linear_attention``), the state as always.

    Returns (o_t (B, H, d_v) in v_t's dtype, new LinearAttentionState).  Also accepts (B, H, 1, ·) inputs
    and then returns (B, H, 1, d_v).
    """
    squeeze = q_t.dim() == 3
    if squeeze:
        q_t, k_t, v_t = q_t.unsqueeze(2), k_t.unsqueeze(2), v_t.unsqueeze(2)
    check_args(q_t, k_t, v_t, feature_map, rope)
    check_theta(rope_theta, q_t, rope)
    check_normalize(normalize)
    if q_t.shape[2] != 1:
        raise ValueError(f"recurrent_step takes one position; got {q_t.shape[2]}")
    B, H, _, d = q_t.shape
    dv, D = v_t.shape[-1], feature_width(feature_map, d)
    dtype = compute_dtype(q_t.dtype)
    check_state(state, q_t, v_t, feature_map, name="state")
    if state is None:
        state = zero_state(B, H, D, dv, dtype, q_t.device)
    pos = torch.as_tensor(position, device=q_t.device).reshape(())
    decay = check_decay(decay, H, q_t.device)
    o, S, z = recurrent_step_op(
        q_t[:, :, 0],
        k_t[:, :, 0],
        v_t[:, :, 0],
        state.S,
        state.z,
        pos,
        rope_theta,
        decay,
        feature_map,
        rope,
        float(eps),
        normalize,
    )
    if not squeeze:
        o = o.unsqueeze(2)
    return o, LinearAttentionState(S, z)


@without_autocast
def recurrent_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Args):
    """Linear attention as a recurrence over positions (causal only), ``Args`` checked; continues from
    ``a.initial_state``.  Differentiable through plain autograd, which keeps every step's state: a reference,
    not a trainer.  ``linrope.ops.linear_attention`` calls it with impl="recurrent"."""
    B, H, N, _ = q.shape
    dv = v.shape[-1]
    dtype = compute_dtype(q.dtype)
    qn, kn, qd, kd = reference_features(
        q, k, feature_map=a.feature_map, rope=a.rope, positions=a.positions, theta=a.rope_theta, dtype=dtype
    )
    D, initial_state = qn.shape[-1], a.initial_state
    if initial_state is None:
        S, z = zero_state(B, H, D, dv, dtype, q.device)
    else:
        S, z = initial_state.S.to(dtype), initial_state.z.to(dtype)
    gamma, vv = _gamma(a.decay, dtype), v.to(dtype)
    track = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, S, z))
    outs = [] if track else None
    out = None if track else alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
    keep = None if a.documents is None else continues(a.documents).to(dtype)  # 0 where a document starts
    for t in range(N):
        if keep is not None:
            S, z = S * keep[:, t, None, None, None], z * keep[:, t, None, None]
        S, z = _advance(S, z, kn[:, :, t], kd[:, :, t], vv[:, :, t], gamma)
        num = (qn[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
        o_t = _output(num, qd[:, :, t], z, a.eps, a.rope, a.normalize)
        if track:
            outs.append(o_t)
        else:
            out[:, :, t] = o_t
    if track:
        out = torch.stack(outs, dim=2).to(v.dtype) if N else v.new_empty(v.shape)
    if not a.output_final_state:
        return out
    return out, LinearAttentionState(S, z)


__all__ = ["recurrent_form", "recurrent_step", "recurrent_step_op"]
