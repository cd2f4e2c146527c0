"""Chunked linear attention: a masked C×C product inside each chunk, a running state across chunks.

Formulation (DESIGN.md §2; the semantics are exactly those of ``naive.py``)
---------------------------------------------------------------------------
Per batch row and head, with the features of ``naive.features`` (φ, rotated where the placement says;
here the interleaved rotation is one complex product, ``_rotate``):

    o_i   = num_i / (den_i + eps)
    num_i = Σ_{j≤i} γ^(i-j) (qn_i·kn_j) v_j + γ^(i+1) qn_iᵀ S0
    den_i = Σ_{j≤i} γ^(i-j) (qd_i·kd_j)     + γ^(i+1) qd_i·z0

(``qn, kn``: numerator features, rotated unless ``rope="none"``; ``qd, kd``: denominator features,
rotated only for ``rope="both"``; γ = γ_h per head, 1 without decay; the initial state (S0, z0) sits at
position -1.)

What is carried
  * ``rope="both"`` / ``"none"``: numerator and denominator share their features, so the denominator is
    folded into the numerator by appending a column of ones to v: ``v' = [v, 1]``, ``S' = [S | z]``
    (D'×(d_v+1)), ``num' = [num, den]``.  One kernel call does both.
  * ``rope="numerator"``: ``S = Σ_j γ^(n-1-j) kn_j v_jᵀ`` (rotated) runs through the matrix kernel, while
    ``z = Σ_j γ^(n-1-j) kd_j`` (unrotated) is a decayed prefix sum of vectors (``_dcumsum``):
    ``den_i = qd_i · zc_i`` with ``zc_i = Σ_{j≤i} γ^(i-j) kd_j + γ^(i+1) z0``.
  (D' = d, or d+1 for the cosine map φ(x) = [1, x̂].)

Chunks (size C; chunk c holds positions cC … cC+C-1, local index t; the last chunk has length
ℓ = N-(nc-1)C and is zero-padded to C)
  * inside a chunk:   P = (q kᵀ) ⊙ M with M[t,s] = γ^(t-s) for s ≤ t (s < t for the strict variant);
                      o_intra = P v — all chunks at once, batched matmuls.
  * chunk → state:    U_c = Σ_t γ^(ℓ_c-1-t) k_t v_tᵀ (key weights ``kw``; ℓ_c = C, or ℓ for the last
                      chunk; padded keys weigh 0).
  * state scan:       S_in[0] = S0,  S_in[c+1] = γ^(ℓ_c) S_in[c] + U_c   (a short loop over chunks, one
                      add per chunk — several times faster on CPU than ``torch.cumsum`` over the chunk axis);
                      the final state is S_in[nc].
  * state → queries:  o_inter = γ^(t+1) q_t S_in[c]  (query weights ``qw``).
Blocks: causal sequences are walked in blocks of whole chunks (``BLOCK_ELEMENTS``), the state handed from
block to block exactly as from chunk to chunk, so the temporaries (features, C×C products, chunk states)
exist for one block at a time.
Non-causal: without decay the state is one global sum (two matmuls).  With decay the weights are
γ^|i-j| = [causal part, diagonal included] + [anti-causal part, diagonal excluded]; the anti-causal part is
the strict causal kernel run on the reversed sequence.

Backward (``ChunkLinearAttentionFunction``): with g = ∂L/∂o, D = den + eps,
    ∂L/∂num_i = g_i / D_i,   ∂L/∂den_i = -(g_i·o_i) / D_i
and the numerator kernel is differentiated chunk by chunk (dnum = ∂L/∂num):
    dq = (A ⊙ M) k + γ^(t+1) (dnum S_inᵀ),   A = dnum vᵀ
    dk = (A ⊙ M)ᵀ q + γ^(ℓ_c-1-t) (v R_inᵀ),   dv = Pᵀ dnum + γ^(ℓ_c-1-t) (k R_in)
with the reverse state R_in[nc-1] = ∂L/∂S_final, R_in[c-1] = γ^(ℓ_c) R_in[c] + Σ_t γ^(t+1) q_t dnum_tᵀ,
and ∂L/∂S0 = γ^(ℓ_0) R_in[0] + Σ_{t in chunk 0} γ^(t+1) q_t dnum_tᵀ (handed to the previous block).  The
denominator's vector sums are differentiated by a reversed decayed prefix sum (∂L/∂z carried likewise).
The features are differentiated by hand (``_features_backward_``: the inverse rotation, then φ'; for elu+1
φ'(x) = min(φ(x), 1)), so the backward builds no autograd graph of its own.
Saved between forward and backward: q, k, v, the initial state, the output, the denominator (B, H, N) and
the states at block boundaries ((N/block)·D'·d_v numbers).  Features, C×C products and chunk states are
recomputed block by block, so nothing of size N·d² (nor N·C) is kept.  The output in the input precision
enters ∂L/∂den (as FlashAttention's backward uses O).

Precision: features, products and states are float32 for float16/bfloat16 inputs (float64 for float64);
the output comes back in v's dtype, the final state in float32/float64.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from einops import rearrange
from torch.autograd.function import once_differentiable

from .common import LinearAttentionState, check_args, compute_dtype, decay_log, phi, rope_tables, with_one

# --------------------------------------------------------------------------------------------------------
# buffer poisoning (tests): preallocated buffers are filled with NaN so that an unwritten element shows up
# --------------------------------------------------------------------------------------------------------
_POISON = False


@contextlib.contextmanager
def poison_buffers(enabled: bool = True):
    """Within this context every buffer the kernels preallocate starts as NaN (for tests)."""
    global _POISON
    old, _POISON = _POISON, enabled
    try:
        yield
    finally:
        _POISON = old


def _alloc(shape, *, dtype, device) -> torch.Tensor:
    if _POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------------------
# features: the same maps as ``naive.features``, with the interleaved RoPE done as one complex product
# --------------------------------------------------------------------------------------------------------
_ROTORS: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_ROTOR_CACHE_SIZE = 4


def _rope_rotors(positions, n: int, d: int, theta, device, dtype) -> torch.Tensor:
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


def _rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE: pairs (x[2t], x[2t+1]) as complex numbers times e^{i m θ_t} (= ``rope.rotate``);
    with ``rot.conj()`` the inverse rotation."""
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(st % 2 for st in x.stride()[:-1]):
        x = x.contiguous()
    xc = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * rot).flatten(-2)


def _phi(x: torch.Tensor, feature_map: str, dtype) -> torch.Tensor:
    """φ without its constant feature (``common.phi``), in the compute precision; no autograd graph."""
    if feature_map == "elu":
        return F.elu(x.to(dtype)).add_(1.0)
    return phi(x.to(dtype), feature_map)


def _phi_backward_(g: torch.Tensor, x: torch.Tensor, f: torch.Tensor, feature_map: str, out: torch.Tensor) -> None:
    """out = ∂L/∂x given g = ∂L/∂f for f = φ(x) (``_phi``); g and f may be overwritten.

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


class _Features(NamedTuple):
    """φ(q), φ(k) before rotation (``qf, kf``) and the features of the numerator and the denominator
    exactly as ``naive.features`` (the denominator's are the numerator's, same objects, unless the
    placement is "numerator")."""

    qf: torch.Tensor
    kf: torch.Tensor
    qn: torch.Tensor
    kn: torch.Tensor
    qd: torch.Tensor
    kd: torch.Tensor


def _features(q, k, *, feature_map: str, rope: str, rot: Optional[torch.Tensor], dtype) -> _Features:
    qf, kf = _phi(q, feature_map, dtype), _phi(k, feature_map, dtype)
    if rope == "none":
        q_num, k_num = with_one(qf, feature_map), with_one(kf, feature_map)
        return _Features(qf, kf, q_num, k_num, q_num, k_num)
    q_num, k_num = with_one(_rotate(qf, rot), feature_map), with_one(_rotate(kf, rot), feature_map)
    if rope == "both":
        return _Features(qf, kf, q_num, k_num, q_num, k_num)
    return _Features(qf, kf, q_num, k_num, with_one(qf, feature_map), with_one(kf, feature_map))


def _features_backward_(x, f, d_num, d_den, *, feature_map: str, rope: str, unrot: Optional[torch.Tensor],
                        out: torch.Tensor) -> None:
    """out = ∂L/∂x from the gradients of x's numerator and denominator features (``d_den`` None when they
    are shared), given the inverse rotors ``unrot``; ``f`` = φ(x) before rotation and ``d_num`` are
    overwritten."""
    one = 1 if feature_map == "cosine" else 0  # the constant feature of the cosine map gets no gradient
    g = d_num[..., one:]
    if rope != "none":
        g = _rotate(g, unrot)
    if d_den is not None:
        g = g.add_(d_den[..., one:])
    _phi_backward_(g, x, f, feature_map, out)


# --------------------------------------------------------------------------------------------------------
# chunk tables: masks and decay weights
# --------------------------------------------------------------------------------------------------------
class _Chunks:
    """Chunk geometry and decay tables for a sequence of length N cut into chunks of size C.

    M (H,1,C,C): γ^(t-s) for s ≤ t (None without decay: plain ``tril``);  qw (H,1,C,1): γ^(t+1);
    kw (H,nc,C,1): γ^(ℓ_c-1-t) for t < ℓ_c, else 0;  g (H,nc): γ^(ℓ_c).  All None without decay.
    """

    def __init__(self, n: int, chunk_size: int, log_gamma: Optional[torch.Tensor], dtype, device):
        self.C = C = max(1, min(int(chunk_size), n))
        self.nc = nc = -(-n // C)
        self.N = n
        self.pad = nc * C - n
        self.decay = log_gamma is not None
        self.M = self.M_strict = self.qw = self.kw = self.g = self.gamma = None
        if not self.decay:
            return
        lg = log_gamma.to(device=device, dtype=torch.float64)
        H = lg.shape[0]
        t = torch.arange(C, device=device, dtype=torch.float64)
        diff = t[:, None] - t[None, :]
        M = torch.where(diff >= 0, torch.exp(lg[:, None, None] * diff.clamp_min(0)), torch.zeros((), dtype=torch.float64, device=device))
        self.M = M[:, None].to(dtype)
        self.M_strict = (M * (diff > 0)).to(dtype)[:, None]
        self.qw = torch.exp(lg[:, None] * (t + 1))[:, None, :, None].to(dtype)
        lengths = torch.full((nc,), float(C), device=device, dtype=torch.float64)
        lengths[-1] = n - (nc - 1) * C
        kexp = lengths[:, None] - 1 - t[None, :]  # (nc, C)
        kw = torch.where(kexp >= 0, torch.exp(lg[:, None, None] * kexp.clamp_min(0)), torch.zeros((), dtype=torch.float64, device=device))
        self.kw = kw.reshape(H, nc, C, 1).to(dtype)
        self.g = torch.exp(lg[:, None] * lengths[None, :]).to(dtype)  # (H, nc)
        self.gamma = torch.exp(lg).to(dtype)  # (H,)

    # (B,H,N,D) <-> (B,H,nc,C,D) -------------------------------------------------------------------------
    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B,H,N,D) (zero-padded here) or already padded (B,H,nc·C,D) -> (B,H,nc,C,D)."""
        if x.shape[2] != self.nc * self.C:
            x = F.pad(x, (0, 0, 0, self.nc * self.C - x.shape[2]))
        return rearrange(x, "b h (n c) d -> b h n c d", c=self.C)

    def padded(self, *parts: torch.Tensor, dtype) -> torch.Tensor:
        """Concatenate (B,H,N,·) parts along the last dim into a zero-padded (B,H,nc·C,Σ·) buffer, one copy."""
        B, H = parts[0].shape[:2]
        width = sum(p.shape[-1] for p in parts)
        buf = _alloc((B, H, self.nc * self.C, width), dtype=dtype, device=parts[0].device)
        buf[:, :, self.N:].zero_()
        col = 0
        for p in parts:
            buf[:, :, : self.N, col : col + p.shape[-1]].copy_(p)
            col += p.shape[-1]
        return buf

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(x, "b h n c d -> b h (n c) d")[:, :, : self.N]

    def mask_(self, P: torch.Tensor, strict: bool) -> torch.Tensor:
        """In place: P ⊙ M (causal mask with decay) on the last two dims of (B,H,nc,C,C)."""
        if self.decay:
            return P.mul_(self.M_strict if strict else self.M)
        return P.tril_(-1 if strict else 0)

    def g_at(self, c: int, ndim_rest: int) -> torch.Tensor:
        return self.g[:, c].reshape(-1, *([1] * ndim_rest))


def _scan_states(U: torch.Tensor, ch: _Chunks, S0: Optional[torch.Tensor]):
    """Exclusive scan over chunks: S_in[0] = S0, S_in[c+1] = γ^(ℓ_c) S_in[c] + U_c.

    U: (B, H, nc, *rest) -> (S_in (B, H, nc, *rest), S_final (B, H, *rest)).  A short loop over chunks:
    on CPU it is several times faster than ``torch.cumsum`` along the chunk axis, and it is exact for decay.
    """
    nc, rest = U.shape[2], U.dim() - 3
    S_in = _alloc(U.shape, dtype=U.dtype, device=U.device)
    if S0 is None:
        S_in[:, :, 0].zero_()
    else:
        S_in[:, :, 0].copy_(S0)
    for c in range(nc - 1):
        if ch.decay:
            torch.addcmul(U[:, :, c], S_in[:, :, c], ch.g_at(c, rest), out=S_in[:, :, c + 1])
        else:
            torch.add(U[:, :, c], S_in[:, :, c], out=S_in[:, :, c + 1])
    if ch.decay:
        return S_in, torch.addcmul(U[:, :, -1], S_in[:, :, -1], ch.g_at(nc - 1, rest))
    return S_in, U[:, :, -1] + S_in[:, :, -1]


def _scan_states_reverse(W: torch.Tensor, ch: _Chunks, R_last: Optional[torch.Tensor]):
    """Reverse scan: R_in[nc-1] = R_last, R_in[c-1] = γ^(ℓ_c) R_in[c] + W_c.

    Returns (R_in (B, H, nc, *rest), R_before = γ^(ℓ_0) R_in[0] + W_0)."""
    nc, rest = W.shape[2], W.dim() - 3
    R_in = _alloc(W.shape, dtype=W.dtype, device=W.device)
    if R_last is None:
        R_in[:, :, -1].zero_()
    else:
        R_in[:, :, -1].copy_(R_last)
    for c in range(nc - 1, 0, -1):
        if ch.decay:
            torch.addcmul(W[:, :, c], R_in[:, :, c], ch.g_at(c, rest), out=R_in[:, :, c - 1])
        else:
            torch.add(W[:, :, c], R_in[:, :, c], out=R_in[:, :, c - 1])
    if ch.decay:
        return R_in, torch.addcmul(W[:, :, 0], R_in[:, :, 0], ch.g_at(0, rest))
    return R_in, W[:, :, 0] + R_in[:, :, 0]


# --------------------------------------------------------------------------------------------------------
# the matrix kernel: o_i = Σ_{j≤i} γ^(i-j) (q_i·k_j) v_j + γ^(i+1) q_iᵀ S0   (j<i if strict)
# --------------------------------------------------------------------------------------------------------
def _bmm_acc_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b over the leading batch dims (contiguous 5-D tensors), without a temporary."""
    out.view(-1, *out.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))


def _fwd_core(q, k, v, ch: _Chunks, S0, strict: bool):
    """q, k: (B,H,nc,C,D), v: (B,H,nc,C,E) -> (o (B,H,nc,C,E), S_final (B,H,D,E))."""
    P = ch.mask_(q @ k.transpose(-1, -2), strict)
    o = P @ v
    del P
    kk = k if ch.kw is None else k * ch.kw
    U = kk.transpose(-1, -2) @ v
    S_in, S_fin = _scan_states(U, ch, S0)
    if ch.nc > 1 or S0 is not None:
        qq = q if ch.qw is None else q * ch.qw
        _bmm_acc_(o, qq, S_in)
    return o, S_fin


def _bwd_core(q, k, v, do, ch: _Chunks, S0, dS_fin, strict: bool):
    """Gradients of ``_fwd_core`` given do (B,H,nc,C,E) and ∂L/∂S_final -> (dq, dk, dv, dS0)."""
    kk = k if ch.kw is None else k * ch.kw
    S_in, _ = _scan_states(kk.transpose(-1, -2) @ v, ch, S0)  # recomputed forward states
    dq_ = do if ch.qw is None else do * ch.qw
    qq = q if ch.qw is None else q * ch.qw
    R_in, dS0 = _scan_states_reverse(qq.transpose(-1, -2) @ do, ch, dS_fin)
    del qq
    A = ch.mask_(do @ v.transpose(-1, -2), strict)
    dq = A @ k
    _bmm_acc_(dq, dq_, S_in.transpose(-1, -2))
    del S_in, dq_
    dk = A.transpose(-1, -2) @ q
    del A
    vv = v if ch.kw is None else v * ch.kw
    _bmm_acc_(dk, vv, R_in.transpose(-1, -2))
    del vv
    P = ch.mask_(q @ k.transpose(-1, -2), strict)
    dv = P.transpose(-1, -2) @ do
    del P
    _bmm_acc_(dv, kk, R_in)
    return dq, dk, dv, dS0


def _matrix_fwd(qn, kn, v, ch: _Chunks, causal: bool, S0):
    """qn, kn (B,H,N,D), v (B,H,N or nc·C,E) -> numerator (B,H,N,E), S_final (None if not causal)."""
    N = ch.N
    if not causal and not ch.decay:
        S = kn.transpose(-1, -2) @ v[:, :, :N]
        return qn @ S, None
    o, S_fin = _fwd_core(ch.split(qn), ch.split(kn), ch.split(v), ch, S0, strict=False)
    o = ch.merge(o)
    if not causal:  # anti-causal part, diagonal excluded: the strict causal kernel on the reversed sequence
        o_rev, _ = _fwd_core(ch.split(qn.flip(2)), ch.split(kn.flip(2)), ch.split(v[:, :, :N].flip(2)), ch, None,
                             strict=True)
        return o + ch.merge(o_rev).flip(2), None
    return o, S_fin


def _matrix_bwd(qn, kn, v, do, ch: _Chunks, causal: bool, S0, dS_fin):
    """Gradients of ``_matrix_fwd`` -> (dqn, dkn (B,H,N,D), dv (B,H,N,E), dS0)."""
    N = ch.N
    if not causal and not ch.decay:
        v, do = v[:, :, :N], do[:, :, :N]
        S = kn.transpose(-1, -2) @ v
        dS = qn.transpose(-1, -2) @ do
        return do @ S.transpose(-1, -2), v @ dS.transpose(-1, -2), kn @ dS, None
    dq, dk, dv, dS0 = _bwd_core(ch.split(qn), ch.split(kn), ch.split(v), ch.split(do), ch, S0, dS_fin, strict=False)
    dq, dk, dv = ch.merge(dq), ch.merge(dk), ch.merge(dv)
    if not causal:
        flip = lambda x: ch.split(x[:, :, :N].flip(2))  # noqa: E731
        rq, rk, rv, _ = _bwd_core(flip(qn), flip(kn), flip(v), flip(do), ch, None, None, strict=True)
        dq, dk, dv = dq + ch.merge(rq).flip(2), dk + ch.merge(rk).flip(2), dv + ch.merge(rv).flip(2)
    return dq, dk, dv, dS0


# --------------------------------------------------------------------------------------------------------
# the vector prefix sums of the denominator (placement "numerator"): zc_i = Σ_{j≤i} γ^(i-j) x_j + γ^(i+1) z0
# --------------------------------------------------------------------------------------------------------
def _dcumsum(x: torch.Tensor, ch: _Chunks, z0: Optional[torch.Tensor] = None) -> torch.Tensor:
    if not ch.decay:
        zc = x.cumsum(2)
        return zc if z0 is None else zc.add_(z0.unsqueeze(2))
    xc = ch.split(x)  # (B,H,nc,C,D)
    zc = torch.matmul(ch.M, xc)  # intra-chunk decayed sums
    T = (xc * ch.kw).sum(3)  # chunk totals decayed to the chunk's end, (B,H,nc,D)
    Z_in, _ = _scan_states(T, ch, z0)
    if ch.nc > 1 or z0 is not None:
        zc.addcmul_(Z_in.unsqueeze(3), ch.qw)
    return ch.merge(zc)


def _dcumsum_reverse(y: torch.Tensor, ch: _Chunks) -> torch.Tensor:
    """r_j = Σ_{i≥j} γ^(i-j) y_i."""
    return _dcumsum(y.flip(2), ch).flip(2)


def _dsum_symmetric(x: torch.Tensor, ch: _Chunks) -> torch.Tensor:
    """Σ_j γ^|i-j| x_j (non-causal)."""
    if not ch.decay:
        return x.sum(2, keepdim=True).expand_as(x)
    return _dcumsum(x, ch) + _dcumsum_reverse(x, ch) - x


# --------------------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------------------
class _Cfg(NamedTuple):
    feature_map: str
    rope: str
    causal: bool
    eps: float
    chunk_size: int


# Causal sequences are processed in blocks of whole chunks, the state handed from block to block: the C×C
# products, chunk states and features then exist for one block at a time, in forward and backward, so the
# peak memory beyond inputs, output and gradients does not grow with N, and on CPU a block's working set
# stays in cache.  A block holds about BLOCK_ELEMENTS[device] numbers per (B, H, ·, d) tensor (at least one
# chunk): 2^18 (1 MiB in float32; 512 positions at B·H = 8, d = 64) measured best on CPU.  Non-causal
# attention needs global sums and runs as a single block.
BLOCK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 26}


def _blocks(B: int, H: int, n: int, d: int, chunk_size: int, causal: bool, device: torch.device):
    if not causal:
        return [(0, n)]
    C = max(1, min(chunk_size, n))
    target = BLOCK_ELEMENTS.get(device.type, BLOCK_ELEMENTS["cuda"])
    step = C * max(1, target // (B * H * max(d, 1) * C))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


class _Tables:
    """One ``_Chunks`` per distinct block length (all blocks but the last share one)."""

    def __init__(self, chunk_size, log_gamma, dtype, device):
        self.args, self.cache = (chunk_size, log_gamma, dtype, device), {}

    def __call__(self, n: int) -> _Chunks:
        if n not in self.cache:
            self.cache[n] = _Chunks(n, *self.args)
        return self.cache[n]


def _shared_features(rope: str) -> bool:
    """Numerator and denominator use the same features: fold the denominator in as a column of ones."""
    return rope in ("both", "none")


def _values(v: torch.Tensor, shared: bool, ch: _Chunks, dtype) -> torch.Tensor:
    """v (or [v, 1] when the denominator is folded in), zero-padded to whole chunks: (B,H,nc·C,E)."""
    if not shared:  # one contiguous copy (a block of v is a strided slice; batched matmuls want it whole)
        return v if (not ch.pad and v.dtype == dtype and v.is_contiguous()) else ch.padded(v, dtype=dtype)
    return ch.padded(v, v.new_ones(()).expand(*v.shape[:-1], 1), dtype=dtype)


def _rotors_for(q: torch.Tensor, rope: str, positions, theta, dtype):
    if rope == "none":
        return None
    return _rope_rotors(positions, q.shape[2], q.shape[3], theta, q.device, dtype)


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
        tables = _Tables(cfg.chunk_size, log_gamma, dtype, q.device)
        rot = _rotors_for(q, cfg.rope, positions, theta, dtype)
        S = None if S0 is None else S0.to(dtype)
        z = None if z0 is None else z0.to(dtype)
        if shared and S is not None:  # the denominator rides along as the last value column: S' = [S | z]
            S = torch.cat((S, z.unsqueeze(-1)), dim=-1)
        out = _alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
        denom = _alloc((B, H, N), dtype=dtype, device=q.device)
        starts_S, starts_z = [], []  # states entering blocks 1, 2, … (saved for backward)
        blocks = _blocks(B, H, N, max(q.shape[-1], dv), cfg.chunk_size, cfg.causal, q.device)
        for b, (s, e) in enumerate(blocks):
            if b > 0:
                starts_S.append(S)
                starts_z.append(z)
            ch = tables(e - s)
            _, _, qn, kn, qd, kd = _features(q[:, :, s:e], k[:, :, s:e], feature_map=cfg.feature_map, rope=cfg.rope,
                                             rot=None if rot is None else rot[s:e], dtype=dtype)
            num, S = _matrix_fwd(qn, kn, _values(v[:, :, s:e], shared, ch, dtype), ch, cfg.causal, S)
            if shared:
                den, num = num[..., dv], num[..., :dv]
            else:
                if cfg.causal:
                    zc = _dcumsum(kd, ch, z)
                    z = zc[:, :, -1].contiguous()
                else:
                    zc = _dsum_symmetric(kd, ch)
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
        tables = _Tables(cfg.chunk_size, log_gamma, dtype, q.device)
        rot = _rotors_for(q, cfg.rope, positions, theta, dtype)
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
        dq = _alloc(q.shape, dtype=q.dtype, device=q.device) if need_q else None
        dk = _alloc(k.shape, dtype=k.dtype, device=k.device) if need_k else None
        dvl = _alloc(v.shape, dtype=v.dtype, device=v.device) if need_v else None
        for b in range(len(blocks) - 1, -1, -1):
            s, e = blocks[b]
            n = e - s
            ch = tables(n)
            S_start = S_first if b == 0 else saved_S[b - 1]
            z_start = z_first if b == 0 else (None if saved_z is None else saved_z[b - 1])
            rot_b = None if rot is None else rot[s:e]
            unrot_b = None if rot is None else rot_b.conj().resolve_conj()  # the inverse rotation
            qf, kf, qn, kn, qd, kd = _features(q[:, :, s:e], k[:, :, s:e], feature_map=cfg.feature_map,
                                               rope=cfg.rope, rot=rot_b, dtype=dtype)  # recomputed
            # ∂L/∂num = g / D and ∂L/∂den = -(g·o) / D, written into a zero-padded (B,H,nc·C,E) buffer
            do = _alloc((B, H, ch.nc * ch.C, E), dtype=dtype, device=q.device)
            do[:, :, n:].zero_()
            if g_out is None:
                do[:, :, :n].zero_()
                dden = torch.zeros(B, H, n, dtype=dtype, device=q.device)
            else:
                torch.div(g_out[:, :, s:e], denom[:, :, s:e].unsqueeze(-1), out=do[:, :, :n, :dv])
                dden = torch.linalg.vecdot(do[:, :, :n, :dv], out[:, :, s:e].to(dtype)).neg_()
            if shared:
                do[:, :, :n, dv].copy_(dden)
            dqn, dkn, dvv, dS = _matrix_bwd(qn, kn, _values(v[:, :, s:e], shared, ch, dtype), do, ch, cfg.causal,
                                            S_start, dS)
            del do
            dqd = dkd = None
            if not shared:  # the denominator den_i = qd_i · zc_i
                y = dden.unsqueeze(-1) * qd
                if cfg.causal:
                    dqd = _dcumsum(kd, ch, z_start).mul_(dden.unsqueeze(-1))
                    if dz is not None:
                        y[:, :, -1] += dz
                    dkd = _dcumsum_reverse(y, ch)
                    dz = dkd[:, :, 0] if ch.gamma is None else dkd[:, :, 0] * ch.gamma[:, None]
                else:
                    dqd = _dsum_symmetric(kd, ch) * dden.unsqueeze(-1)
                    dkd = _dsum_symmetric(y, ch)
                del y
            if need_v:
                dvl[:, :, s:e].copy_(dvv[..., :dv])
            del dvv, qn, kn, qd, kd
            for x, f, d_num, d_den, grad in ((q, qf, dqn, dqd, dq), (k, kf, dkn, dkd, dk)):
                if grad is not None:
                    _features_backward_(x[:, :, s:e], f, d_num, d_den, feature_map=cfg.feature_map, rope=cfg.rope,
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


__all__ = ["chunk_linear_attention", "ChunkLinearAttentionFunction", "poison_buffers"]
