"""The matrix kernel of the chunk form and its backward:

    o_i = Σ_{j≤i} γ^(i-j) (q_i·k_j) v_j + γ^(i+1) q_iᵀ S0        (j < i for the strict variant)

for q, k (B, H, N, D) and v (B, H, N, E), chunk by chunk (tables and notation in ``tables.py``):

  * inside a chunk:   P = (q kᵀ) ⊙ M,  o_intra = P v — all chunks at once, batched matmuls;
  * chunk → state:    U_c = Σ_t γ^(ℓ_c-1-t) k_t v_tᵀ, scanned into the states entering each chunk (``scans``);
  * state → queries:  o_inter = γ^(t+1) q_t S_in[c].

Non-causal: without decay the state is one global sum (two matmuls).  With decay the weights
γ^|i-j| = [causal part, diagonal included] + [anti-causal part, diagonal excluded]; the anti-causal part is
the strict causal kernel run on the reversed sequence.

Backward, with dO = ∂L/∂o and the reverse state R (∂L/∂S_in):
    dq = (A ⊙ M) k + γ^(t+1) (dO S_inᵀ),   A = dO vᵀ
    dk = (A ⊙ M)ᵀ q + γ^(ℓ_c-1-t) (v R_inᵀ),   dv = Pᵀ dO + γ^(ℓ_c-1-t) (k R_in)
    R_in[nc-1] = ∂L/∂S_final,  R_in[c-1] = γ^(ℓ_c) R_in[c] + Σ_t γ^(t+1) q_t dO_tᵀ
and ∂L/∂S0 = γ^(ℓ_0) R_in[0] + Σ_{t in chunk 0} γ^(t+1) q_t dO_tᵀ.  The forward states are recomputed.
"""

from __future__ import annotations

import torch

from .scans import scan_states, scan_states_reverse
from .tables import Chunks


def bmm_acc_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b over the leading batch dims (contiguous 5-D tensors), without a temporary."""
    out.view(-1, *out.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))


def _weighted(x: torch.Tensor, w):
    """x ⊙ w (a decay table, broadcast) in x's dtype.  For bfloat16 x the (small) table is cast to bfloat16
    first: a product of two bfloat16 tensors is about 3× faster on CPU than one of mixed dtypes."""
    if w is None:
        return x
    return x * (w if x.dtype == w.dtype else w.to(x.dtype))


def _state(x: torch.Tensor, ch: Chunks) -> torch.Tensor:
    """A chunk summary in the states' dtype (float32 when the products ran in bfloat16; else x itself)."""
    return x if x.dtype == ch.dtype else x.to(ch.dtype)


def fwd_core(q, k, v, ch: Chunks, S0, strict: bool):
    """q, k: (B,H,nc,C,D), v: (B,H,nc,C,E) -> (o (B,H,nc,C,E), S_final (B,H,D,E)).

    The products run in q's dtype (bfloat16 on the fast path: ``chunk_kernel``, "Precision"); the chunk
    summaries U, the scan and the states are in ``ch.dtype`` (float32 there)."""
    P = ch.mask_(q @ k.transpose(-1, -2), strict)
    o = P @ v
    del P
    kk = _weighted(k, ch.kw)
    U = _state(kk.transpose(-1, -2) @ v, ch)
    S_in, S_fin = scan_states(U, ch, S0)
    if ch.nc > 1 or S0 is not None:
        qq = _weighted(q, ch.qw)
        bmm_acc_(o, qq, S_in.to(q.dtype))
    return o, S_fin


def bwd_core(q, k, v, do, ch: Chunks, S0, dS_fin, strict: bool):
    """Gradients of ``fwd_core`` given do (B,H,nc,C,E) and ∂L/∂S_final -> (dq, dk, dv, dS0)."""
    kk = _weighted(k, ch.kw)
    S_in, _ = scan_states(_state(kk.transpose(-1, -2) @ v, ch), ch, S0)  # recomputed forward states
    dq_ = _weighted(do, ch.qw)
    qq = _weighted(q, ch.qw)
    R_in, dS0 = scan_states_reverse(_state(qq.transpose(-1, -2) @ do, ch), ch, dS_fin)
    del qq
    A = ch.mask_(do @ v.transpose(-1, -2), strict)
    dq = A @ k
    bmm_acc_(dq, dq_, S_in.transpose(-1, -2).to(q.dtype))
    del S_in, dq_
    dk = A.transpose(-1, -2) @ q
    del A
    vv = _weighted(v, ch.kw)
    R_lp = R_in.to(q.dtype)
    bmm_acc_(dk, vv, R_lp.transpose(-1, -2))
    del vv
    P = ch.mask_(q @ k.transpose(-1, -2), strict)
    dv = P.transpose(-1, -2) @ do
    del P
    bmm_acc_(dv, kk, R_lp)
    return dq, dk, dv, dS0


def matrix_fwd(qn, kn, v, ch: Chunks, causal: bool, S0):
    """qn, kn (B,H,N,D), v (B,H,N or nc·C,E) -> numerator (B,H,N,E), S_final (None if not causal)."""
    N = ch.N
    if not causal and not ch.decay:
        S = kn.transpose(-1, -2) @ v[:, :, :N]
        return qn @ S, None
    o, S_fin = fwd_core(ch.split(qn), ch.split(kn), ch.split(v), ch, S0, strict=False)
    o = ch.merge(o)
    if not causal:  # anti-causal part, diagonal excluded: the strict causal kernel on the reversed sequence
        o_rev, _ = fwd_core(
            ch.split(qn.flip(2)), ch.split(kn.flip(2)), ch.split(v[:, :, :N].flip(2)), ch, None, strict=True
        )
        return o + ch.merge(o_rev).flip(2), None
    return o, S_fin


def matrix_bwd(qn, kn, v, do, ch: Chunks, causal: bool, S0, dS_fin):
    """Gradients of ``matrix_fwd`` -> (dqn, dkn (B,H,N,D), dv (B,H,N,E), dS0)."""
    N = ch.N
    if not causal and not ch.decay:
        v, do = v[:, :, :N], do[:, :, :N]
        S = kn.transpose(-1, -2) @ v
        dS = qn.transpose(-1, -2) @ do
        return do @ S.transpose(-1, -2), v @ dS.transpose(-1, -2), kn @ dS, None
    dq, dk, dv, dS0 = bwd_core(ch.split(qn), ch.split(kn), ch.split(v), ch.split(do), ch, S0, dS_fin, strict=False)
    dq, dk, dv = ch.merge(dq), ch.merge(dk), ch.merge(dv)
    if not causal:
        flip = lambda x: ch.split(x[:, :, :N].flip(2))  # noqa: E731
        rq, rk, rv, _ = bwd_core(flip(qn), flip(kn), flip(v), flip(do), ch, None, None, strict=True)
        dq, dk, dv = dq + ch.merge(rq).flip(2), dk + ch.merge(rk).flip(2), dv + ch.merge(rv).flip(2)
    return dq, dk, dv, dS0


__all__ = ["bmm_acc_", "fwd_core", "bwd_core", "matrix_fwd", "matrix_bwd"]
