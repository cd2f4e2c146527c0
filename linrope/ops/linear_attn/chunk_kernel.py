"""The chunk form's forward and backward passes: a masked C×C product inside each chunk, a running state
across chunks, walked block by block.  (``chunk.py`` registers them as operators.)

The semantics are exactly those of ``naive.py``.  Per batch row and head, with the features of
``features.py`` (φ, rotated where the placement says):

    o_i   = num_i / (den_i + eps)
    num_i = Σ_{j≤i} γ^(i-j) (qn_i·kn_j) v_j + γ^(i+1) qn_iᵀ S0
    den_i = Σ_{j≤i} γ^(i-j) (qd_i·kd_j)     + γ^(i+1) qd_i·z0

(``qn, kn``: numerator features, rotated unless ``rope="none"``; ``qd, kd``: denominator features,
rotated only for ``rope="both"``; γ = γ_h per head, 1 without decay; the initial state (S0, z0) sits at
position -1.)  With ``normalize=False`` o_i = num_i: no denominator is formed, no eps, no guard; z is still
carried (a causal call's final state keeps its shape), and the backward passes ∂L/∂num = g and no ∂L/∂den.

What is carried
  * ``rope="both"`` / ``"none"``: numerator and denominator share their features, so the denominator is
    folded into the numerator by appending a column of ones to v: ``v' = [v, 1]``, ``S' = [S | z]``
    (D'×(d_v+1)), ``num' = [num, den]``.  One call of the matrix kernel (``matrix.py``) does both.
  * ``rope="numerator"``: ``S = Σ_j γ^(n-1-j) kn_j v_jᵀ`` (rotated) runs through the matrix kernel, while
    ``z = Σ_j γ^(n-1-j) kd_j`` (unrotated) is a decayed prefix sum of vectors (``scans.dcumsum``):
    ``den_i = qd_i · zc_i`` with ``zc_i = Σ_{j≤i} γ^(i-j) kd_j + γ^(i+1) z0``.
  (D' = d, or d+1 for the cosine map φ(x) = [1, x̂].)
Causal sequences are walked in blocks of whole chunks (``tables.plan_blocks``, through ``chunk.plan``), the state handed from
block to block exactly as from chunk to chunk.
For elu+1 with RoPE in the numerator, causal, normalised, without decay or packed documents, in float32/float64 on
a CPU, forward and backward are native loops per head instead (``native_chunk.py``), on the same block states; in
bfloat16 too, with the precision below, on a CPU with AVX-512 BF16 (``native_bf16.py``).

Backward: with g = ∂L/∂o and D = den + eps,
    ∂L/∂num_i = g_i / D_i,   ∂L/∂den_i = -(g_i·o_i) / D_i,
the numerator kernel is differentiated by ``matrix.matrix_bwd`` block by block in reverse, carrying
∂L/∂state; the denominator's vector sums by a reversed decayed prefix sum (∂L/∂z carried likewise); the
features by hand (``features.features_backward_``: the inverse rotation, then φ'), so the backward builds
no autograd graph of its own.  Saved between forward and backward: q, k, v, the initial state, the output,
the denominator (B, H, N) and the states at block boundaries ((N/block)·D'·d_v numbers).  Features, C×C
products and chunk states are recomputed block by block, so nothing of size N·d² (nor N·C) is kept.  The
output in the input precision enters ∂L/∂den (as FlashAttention's backward uses O).

Precision: features, scans, states and the denominators are float32 for float16/bfloat16 inputs (float64
for float64).  The large products (QKᵀ, PV, KᵀV, Q·S_in and their backward twins) run in ``matmul_dtype``:
bfloat16 operands with float32 accumulation for bfloat16 inputs (except placement "both"), the compute
dtype otherwise (docs/mathematics.md, "Precision").  The output comes back in v's dtype, the final state in
float32/float64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from linrope.ops.rope import compute_dtype

from . import native, native_chunk
from .buffers import alloc
from .common import feature_width, guard_denominator_, shared_features, unclamped
from .features import Features, features_backward_, rotors_for, split_features
from .matrix import matrix_bwd, matrix_fwd
from .scans import dcumsum, dcumsum_reverse, dsum_symmetric
from .tables import Chunks, Tables


def matmul_dtype(dtype: torch.dtype, rope: str) -> torch.dtype:
    """The dtype of the chunk kernel's large products for inputs of ``dtype`` and a placement: bfloat16 for
    bfloat16 inputs (float32 accumulation inside each matmul), otherwise the compute dtype.

    Two exceptions stay float32.  float16 inputs: the state entering a chunk grows with the number of keys
    and leaves float16's range (65504) within a few thousand positions, and it is an operand of Q·S_in.
    Placement "both": its denominator is a sum of terms of either sign, folded into the products, and when
    it cancels a bfloat16 rounding of its terms is amplified without bound (measured: 0.11 relative error
    of the output against 1.7e-3 with float32 products; docs/mathematics.md, "Precision")."""
    return torch.bfloat16 if (dtype == torch.bfloat16 and rope != "both") else compute_dtype(dtype)


def _lowp(x: torch.Tensor, mm: torch.dtype) -> torch.Tensor:
    return x if x.dtype == mm else x.to(mm)


class Cfg(NamedTuple):
    feature_map: str
    rope: str
    causal: bool
    eps: float
    chunk_size: int
    normalize: bool = True


def _values(v: torch.Tensor, shared: bool, ch: Chunks, dtype) -> torch.Tensor:
    """v (or [v, 1] when the denominator is folded in), zero-padded to whole chunks: (B,H,nc·C,E)."""
    if not shared:  # one contiguous copy (a block of v is a strided slice; batched matmuls want it whole)
        return v if (not ch.pad and v.dtype == dtype and v.is_contiguous()) else ch.padded(v, dtype=dtype)
    return ch.padded(v, v.new_ones(()).expand(*v.shape[:-1], 1), dtype=dtype)


def block_documents(documents, s: int, e: int):
    """The ids of the block s … e-1 and the id before it (None for the row's first block), or None."""
    if documents is None:
        return None
    return documents[:, s:e], (documents[:, s - 1] if s > 0 else None)


def _features(q, k, cfg: Cfg, rot, dtype) -> Features:
    """The block's features (``features.split_features``): for elu+1 with RoPE on a CPU in one pass each
    (``native.elu_rope``)."""
    if rot is None or not native.features_usable(q, cfg.feature_map, cfg.rope, dtype):
        return split_features(q, k, feature_map=cfg.feature_map, rope=cfg.rope, rot=rot, dtype=dtype)
    (qf, qn), (kf, kn) = native.elu_rope(q, rot, dtype), native.elu_rope(k, rot, dtype)
    return Features(qf, kf, qn, kn, *((qn, kn) if cfg.rope == "both" else (qf, kf)))


def chunk_forward(q, k, v, S0, z0, positions, theta, log_gamma, cfg: Cfg, documents, blocks, out=None,
                  denom=None):  # fmt: skip
    """-> (out, denom, S_final, z_final, states entering blocks 1, 2, … (S, and z unless shared)).

    ``denom`` is the guarded den + eps (B, H, N), None without normalising; the final state is None when not
    causal, a saved state None when there is a single block.  ``blocks``: the walk's blocks (``chunk.plan``: the
    whole call's, or those planned for a task's group of ``heads.py``).  ``out`` and
    ``denom``, when given, are the buffers (views of the caller's) the output and the denominator are written
    into."""
    dtype, mm = compute_dtype(q.dtype), matmul_dtype(q.dtype, cfg.rope)
    B, H, N, _ = q.shape
    dv = v.shape[-1]
    shared = shared_features(cfg.rope)  # fold the denominator in as a column of ones
    tables = Tables(cfg.chunk_size, log_gamma, dtype, q.device)
    rot = rotors_for(q, cfg.rope, positions, theta, dtype)
    if native_chunk.usable(q, k, v, cfg, log_gamma, documents):  # the whole walk in one native loop
        return native_chunk.forward(q, k, v, S0, z0, rot, cfg, blocks, out, denom)
    S = None if S0 is None else S0.to(dtype)
    z = None if z0 is None else z0.to(dtype)
    if shared and S is not None:  # the denominator rides along as the last value column: S' = [S | z]
        S = torch.cat((S, z.unsqueeze(-1)), dim=-1)
    if out is None:
        out = alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
    if denom is None and cfg.normalize:
        denom = alloc((B, H, N), dtype=dtype, device=q.device)
    starts_S, starts_z = [], []  # states entering blocks 1, 2, … (saved for backward)
    for b, (s, e) in enumerate(blocks):
        if b > 0:
            starts_S.append(S)
            starts_z.append(z)
        ch = tables(e - s, block_documents(documents, s, e))
        _, _, qn, kn, qd, kd = _features(q[:, :, s:e], k[:, :, s:e], cfg, None if rot is None else rot[s:e], dtype)
        num, S = matrix_fwd(_lowp(qn, mm), _lowp(kn, mm), _values(v[:, :, s:e], shared, ch, mm), ch, cfg.causal, S)
        den = None
        if shared:
            den, num = num[..., dv], num[..., :dv]
        elif cfg.causal and native.usable(kd, ch):  # one pass: the running sum and its dot (native.py)
            den, z = native.denominator(qd, kd, z)
        elif cfg.causal or cfg.normalize:  # (without normalising, z only for the state it carries)
            if cfg.causal:
                zc = dcumsum(kd, ch, z)
                z = zc[:, :, -1].contiguous()
            else:
                zc = dsum_symmetric(kd, ch)
            den = torch.linalg.vecdot(qd, zc) if cfg.normalize else None
            del zc
        del qn, kn, qd, kd
        if cfg.normalize:
            torch.add(den, cfg.eps, out=denom[:, :, s:e])
            guard_denominator_(denom[:, :, s:e], cfg.rope)
            torch.div(num, denom[:, :, s:e].unsqueeze(-1), out=out[:, :, s:e])
        else:
            out[:, :, s:e].copy_(num)
        del num, den
    saved_S = torch.stack(starts_S) if starts_S else None
    saved_z = torch.stack(starts_z) if (starts_z and not shared) else None
    if not cfg.causal:
        return out, denom, None, None, saved_S, saved_z
    if shared:
        S, z = S[..., :dv], S[..., dv]
    return out, denom, S.contiguous(), z.contiguous(), saved_S, saved_z


def _carried_back(dkd: torch.Tensor, ch) -> torch.Tensor:
    """∂L/∂z entering a block from the reversed prefix sum r of its keys' gradients: γ·r_0, and 0 in a row whose
    block starts a new document (the state entering it reaches none of its queries)."""
    dz = dkd[:, :, 0] if ch.gamma is None else dkd[:, :, 0] * ch.gamma[:, None]
    if ch.docs is not None:
        dz = dz * ch.docs.first_continues().to(dz.dtype)[:, None, None]
    return dz


def chunk_backward(
    g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, log_gamma, out, denom, saved_S, saved_z, cfg: Cfg, needs,
    documents, blocks, grads=None,
):  # fmt: skip
    """-> (dq, dk, dv, dS0, dz0), None where ``needs`` (five booleans) or the inputs say no gradient; ``blocks`` as
    in ``chunk_forward``; ``grads``, when given, the buffers (dq, dk, dv) the gradients are written into."""
    shared = shared_features(cfg.rope)
    dtype, mm = compute_dtype(q.dtype), matmul_dtype(q.dtype, cfg.rope)
    B, H, N, _ = q.shape
    dv = v.shape[-1]
    E = dv + 1 if shared else dv
    need_q, need_k, need_v = needs[:3]
    tables = Tables(cfg.chunk_size, log_gamma, dtype, q.device)
    rot = rotors_for(q, cfg.rope, positions, theta, dtype)
    saved = 0 if saved_S is None else saved_S.shape[0]  # (a forward planned otherwise: the torch path, from S0)
    if g_out is not None and saved == len(blocks) - 1 and native_chunk.usable(q, k, v, cfg, log_gamma, documents):
        return native_chunk.backward(g_out, g_S, g_z, q, k, v, S0, z0, rot, out, denom, saved_S, saved_z, cfg, needs,
                                     blocks, grads)  # fmt: skip
    S_first = None if S0 is None else S0.to(dtype)
    z_first = None if z0 is None else z0.to(dtype)
    if shared and S_first is not None:
        S_first = torch.cat((S_first, z_first.unsqueeze(-1)), dim=-1)
    # ∂L/∂(final state), carried backwards from block to block
    dS = dz = None
    if shared:
        if g_S is not None or g_z is not None:
            Dp = feature_width(cfg.feature_map, q.shape[-1])
            dS = torch.zeros(B, H, Dp, E, dtype=dtype, device=q.device)
            if g_S is not None:
                dS[..., :dv] = g_S
            if g_z is not None:
                dS[..., dv] = g_z
    else:
        dS = None if g_S is None else g_S.to(dtype)
        dz = None if g_z is None else g_z.to(dtype)
    if grads is not None:
        dq, dk, dvl = grads
    else:
        dq = alloc(q.shape, dtype=q.dtype, device=q.device) if need_q else None
        dk = alloc(k.shape, dtype=k.dtype, device=k.device) if need_k else None
        dvl = alloc(v.shape, dtype=v.dtype, device=v.device) if need_v else None
    fused = native.features_usable(q, cfg.feature_map, cfg.rope, dtype)
    for b in range(len(blocks) - 1, -1, -1):
        s, e = blocks[b]
        n = e - s
        ch = tables(n, block_documents(documents, s, e))
        S_start = S_first if b == 0 else saved_S[b - 1]
        z_start = z_first if b == 0 else (None if saved_z is None else saved_z[b - 1])
        rot_b = None if rot is None else rot[s:e]
        unrot_b = None if (rot is None or fused) else rot_b.conj().resolve_conj()  # the inverse rotation
        qf, kf, qn, kn, qd, kd = _features(q[:, :, s:e], k[:, :, s:e], cfg, rot_b, dtype)  # recomputed
        # ∂L/∂num = g / D and ∂L/∂den = -(g·o) / D, written into a zero-padded (B,H,nc·C,E) buffer
        do = alloc((B, H, ch.nc * ch.C, E), dtype=mm, device=q.device)
        do[:, :, n:].zero_()
        if g_out is None:
            do[:, :, :n].zero_()
            dden = torch.zeros(B, H, n, dtype=dtype, device=q.device)
        elif not cfg.normalize:  # o = num: ∂L/∂num = g, and there is no denominator
            do[:, :, :n, :dv].copy_(g_out[:, :, s:e])
            dden = torch.zeros(B, H, n, dtype=dtype, device=q.device)
        elif mm == dtype:
            torch.div(g_out[:, :, s:e], denom[:, :, s:e].unsqueeze(-1), out=do[:, :, :n, :dv])
            dden = torch.linalg.vecdot(do[:, :, :n, :dv], out[:, :, s:e].to(dtype)).neg_()
        else:  # ∂L/∂den from the float32 quotient; the products' operand rounded once
            g_num = torch.div(g_out[:, :, s:e].to(dtype), denom[:, :, s:e].unsqueeze(-1))
            do[:, :, :n, :dv].copy_(g_num)
            dden = torch.linalg.vecdot(g_num, out[:, :, s:e].to(dtype)).neg_()
            del g_num
        if g_out is not None and cfg.normalize and cfg.rope == "both":  # a clamped denominator is a constant
            dden.mul_(unclamped(denom[:, :, s:e]))
        if shared:
            do[:, :, :n, dv].copy_(dden)
        dqn, dkn, dvv, dS = matrix_bwd(
            _lowp(qn, mm), _lowp(kn, mm), _values(v[:, :, s:e], shared, ch, mm), do, ch, cfg.causal, S_start, dS
        )
        if mm != dtype:  # the features' backward (rotation, φ') runs in the compute dtype
            dqn, dkn = dqn.to(dtype), dkn.to(dtype)
        del do
        dqd = dkd = None
        if not shared and not cfg.normalize:  # no denominator: z reaches only the final state
            if dz is not None:
                y = torch.zeros_like(kd)
                y[:, :, -1] += dz
                dkd = dcumsum_reverse(y, ch)
                dz = _carried_back(dkd, ch)
                del y
        elif not shared and cfg.causal and native.usable(kd, ch):  # the two scans in one call (native.py)
            dqd, dkd, dz = native.denominator_backward(qd, kd, dden, z_start, dz)
        elif not shared:  # the denominator den_i = qd_i · zc_i
            y = dden.unsqueeze(-1) * qd
            if cfg.causal:
                dqd = dcumsum(kd, ch, z_start).mul_(dden.unsqueeze(-1))
                if dz is not None:
                    y[:, :, -1] += dz
                dkd = dcumsum_reverse(y, ch)
                dz = _carried_back(dkd, ch)
            else:
                dqd = dsum_symmetric(kd, ch) * dden.unsqueeze(-1)
                dkd = dsum_symmetric(y, ch)
            del y
        if need_v:
            dvl[:, :, s:e].copy_(dvv[..., :dv])
        del dvv, qn, kn, qd, kd
        for x, f, d_num, d_den, grad in ((q, qf, dqn, dqd, dq), (k, kf, dkn, dkd, dk)):
            if grad is not None and fused:
                native.elu_rope_backward(f, d_num, d_den, rot_b, grad[:, :, s:e])
            elif grad is not None:
                features_backward_(
                    x[:, :, s:e],
                    f,
                    d_num,
                    d_den,
                    feature_map=cfg.feature_map,
                    rope=cfg.rope,
                    unrot=unrot_b,
                    out=grad[:, :, s:e],
                )
        del qf, kf, dqn, dkn, dqd, dkd
    dS0 = dz0 = None
    if S0 is not None and cfg.causal:
        if shared:
            dS0, dz0 = dS[..., :dv], dS[..., dv]
        else:
            dS0, dz0 = dS, dz
        dS0 = dS0.to(S0.dtype) if (dS0 is not None and needs[3]) else None
        dz0 = dz0.to(z0.dtype) if (dz0 is not None and needs[4]) else None
    return dq, dk, dvl, dS0, dz0


__all__ = ["Cfg", "chunk_forward", "chunk_backward"]
