"""Reference linear attention: the N×N weights materialised.

    o_i = Σ_{j≤i} w^num_ij v_j / (Σ_{j≤i} w^den_ij + eps)
    w^num_ij = (R_i φ(q_i))·(R_j φ(k_j)) γ^(i-j),   w^den_ij = φ(q_i)·φ(k_j) γ^(i-j)

(the denominator rotated too for placement "both"; nothing rotated for "none"); with a ``window`` only the keys
i - window < j <= i (``window.py``).  With ``normalize=False`` o_i is the numerator alone: no denominator, no
eps, no guard.
Quadratic in N; float64 capable.  Every faster form is tested against this one.
"""

from __future__ import annotations

import torch

from linrope.ops.rope import compute_dtype

from .common import Args, LinearAttentionState, decay_log, guard_denominator, without_autocast
from .documents import same_document
from .features import reference_features
from .window import band


def decay_matrix(log_gamma: torch.Tensor, n: int, device) -> torch.Tensor:
    """(H, N, N) matrix γ_h^|i-j| (float64)."""
    idx = torch.arange(n, device=device, dtype=torch.float64)
    dist = (idx[:, None] - idx[None, :]).abs()
    return torch.exp(log_gamma[:, None, None] * dist)


@without_autocast
def naive_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Args):
    """The reference form: ``Args`` checked (``linrope.ops.linear_attention`` calls it with impl="naive")."""
    feature_map, rope, causal, positions, eps = a.feature_map, a.rope, a.causal, a.positions, a.eps
    decay, initial_state = a.decay, a.initial_state
    dtype = compute_dtype(q.dtype)
    B, H, N, _ = q.shape
    q_num, k_num, q_den, k_den = reference_features(
        q, k, feature_map=feature_map, rope=rope, positions=positions, theta=a.rope_theta, dtype=dtype
    )
    vv = v.to(dtype)
    w_num = q_num @ k_num.transpose(-1, -2)
    mask = torch.ones(N, N, dtype=dtype, device=q.device)
    if causal:
        mask = torch.tril(mask)
    if a.window is not None:
        mask = mask * band(N, a.window, q.device, dtype)
    docs = a.documents
    if docs is not None:  # packed documents: no key of another document (B, 1, N, N)
        mask = mask * same_document(docs, docs).to(dtype)
    log_gamma = decay_log(decay)
    if log_gamma is not None:
        mask = mask * decay_matrix(log_gamma, N, q.device).to(dtype)
    num = (w_num * mask) @ vv
    den = (q_den @ k_den.transpose(-1, -2) * mask).sum(-1) if a.normalize else None
    if initial_state is not None:
        S0, z0 = initial_state.S.to(dtype), initial_state.z.to(dtype)
        # the state sits at position -1: a query at i sees it through γ^(i+1)
        carry = torch.ones(H, N, dtype=dtype, device=q.device)
        if log_gamma is not None:
            carry = torch.exp(log_gamma[:, None] * torch.arange(1, N + 1, device=q.device, dtype=torch.float64)).to(
                dtype
            )
        carry = carry[None]  # (1, H, N); with documents the state reaches the first document only
        if docs is not None:
            carry = carry * (docs == docs[:, :1]).to(dtype)[:, None]
        num = num + (q_num @ S0) * carry[..., None]
        if den is not None:
            den = den + (q_den @ z0.unsqueeze(-1)).squeeze(-1) * carry
    out = (num if den is None else num / guard_denominator(den + eps, rope).unsqueeze(-1)).to(v.dtype)
    if not a.output_final_state:
        return out
    # final state: Σ_j γ^(N-1-j) k_j v_jᵀ (+ γ^N S0)
    w = torch.ones(H, N, dtype=dtype, device=q.device)
    if log_gamma is not None:
        w = torch.exp(log_gamma[:, None] * torch.arange(N - 1, -1, -1, device=q.device, dtype=torch.float64)).to(dtype)
    w = w.expand(B, H, N)
    if docs is not None:  # the last document's keys only
        w = w * (docs == docs[:, -1:]).to(dtype)[:, None]
    S = torch.einsum("bhnd,bhne,bhn->bhde", k_num, vv, w)
    z = torch.einsum("bhnd,bhn->bhd", k_den, w)
    if initial_state is not None:
        tail = torch.ones(H, dtype=dtype, device=q.device) if log_gamma is None else torch.exp(log_gamma * N).to(dtype)
        tail = tail.expand(B, H)
        if docs is not None and N:  # the state crosses the row only if the row is one document (an empty row: it does)
            tail = tail * (docs[:, 0] == docs[:, -1]).to(dtype)[:, None]
        S = S + initial_state.S.to(dtype) * tail[:, :, None, None]
        z = z + initial_state.z.to(dtype) * tail[:, :, None]
    return out, LinearAttentionState(S, z)


__all__ = ["naive_form", "decay_matrix"]
