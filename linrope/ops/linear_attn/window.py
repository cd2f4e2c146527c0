"""Linear attention limited to the last ``window`` keys: the context-limited control.

Key j is visible to query i iff i - window < j <= i (causal only), so

    o_i = Σ_{i-W<j≤i} w^num_ij v_j / (Σ_{i-W<j≤i} w^den_ij + eps)

with the weights of ``naive.py`` (RoPE where the placement says, γ^(i-j) where there is a decay).  The naive
form multiplies its N×N weights by ``band``; this module's ``windowed_form`` computes the same sums in blocks of
W = window queries, each block against its own keys and the previous block's (the only keys a query of the block
can see), with the band written as a (W, 2W) mask: O(N·W) time and memory, plain torch (autograd, float64).
The chunk form runs it whenever window < N (``chunk.chunk_form``); window >= N is no window at all.

A window carries no state from one call to the next (the keys that fall out of it would have to be kept), so
``Args.checked`` refuses ``initial_state`` / ``output_final_state`` with a window, and the forms that only
exist to carry a state (recurrent, the generation step) refuse a window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linrope.ops.rope import compute_dtype

from .common import Args, decay_log, guard_denominator, without_autocast
from .features import reference_features


def band(n: int, window: int, device, dtype=torch.bool) -> torch.Tensor:
    """(N, N) mask of the visible pairs, 1 where i - window < j <= i (causality included)."""
    idx = torch.arange(n, device=device)
    dist = idx[:, None] - idx[None, :]
    return ((dist >= 0) & (dist < window)).to(dtype)


def _block_weights(window: int, log_gamma, dtype, device) -> torch.Tensor:
    """The (W, 2W) band of one block of queries (local index a, global bW + a) against the keys of the previous
    block and its own (local index c, global (b-1)W + c): distance i - j = W + a - c, visible iff 0 <= it < W;
    times γ_h^(i-j) with a decay, then (H, W, 2W)."""
    a = torch.arange(window, device=device, dtype=torch.float64)[:, None]
    c = torch.arange(2 * window, device=device, dtype=torch.float64)[None, :]
    dist = window + a - c
    visible = ((dist >= 0) & (dist < window)).to(torch.float64)
    if log_gamma is None:
        return visible.to(dtype)
    return (visible * torch.exp(log_gamma[:, None, None] * dist.clamp_min(0))).to(dtype)


def _key_blocks(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, nb·W, F) -> (B, H, nb, 2W, F): for block b the rows (b-1)W … (b+1)W - 1 (zeros before the first)."""
    padded = F.pad(x, (0, 0, window, 0))
    return padded.unfold(2, 2 * window, window).transpose(-1, -2)


@without_autocast
def windowed_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Args):
    """Causal linear attention over the last ``a.window`` keys, blocked (``Args`` checked, window set)."""
    W = int(a.window)
    dtype = compute_dtype(q.dtype)
    B, H, N, _ = q.shape
    qn, kn, qd, kd = reference_features(
        q, k, feature_map=a.feature_map, rope=a.rope, positions=a.positions, theta=a.rope_theta, dtype=dtype
    )
    nb = -(-N // W)
    pad = nb * W - N  # padded keys are zero features: they add nothing (and lie after every real query)

    def blocks(x):  # (B, H, N, F) -> (B, H, nb, W, F)
        return F.pad(x, (0, 0, 0, pad)).reshape(B, H, nb, W, x.shape[-1])

    def context(x):  # (B, H, N, F) -> (B, H, nb, 2W, F)
        return _key_blocks(F.pad(x, (0, 0, 0, pad)), W)

    mask = _block_weights(W, decay_log(a.decay), dtype, q.device)
    mask = mask[None, None] if mask.dim() == 2 else mask[None, :, None]  # (1, 1|H, 1, W, 2W)
    if a.documents is not None:  # packed documents: only keys of the query's own document (B, 1, nb, W, 2W)
        ids = torch.cat((a.documents, a.documents[:, -1:].expand(-1, pad)), dim=1)  # padded queries: discarded
        keys = torch.cat((ids[:, :1].expand(-1, W), ids), dim=1).unfold(1, 2 * W, W)  # keys before 0: zero features
        mask = mask * (ids.reshape(B, nb, W)[..., None] == keys[:, :, None, :]).unsqueeze(1).to(dtype)
    w_num = (blocks(qn) @ context(kn).transpose(-1, -2)) * mask
    num = w_num @ context(v.to(dtype))
    if a.normalize:
        w_den = (blocks(qd) @ context(kd).transpose(-1, -2)) * mask
        out = num / guard_denominator(w_den.sum(-1) + a.eps, a.rope).unsqueeze(-1)
    else:  # the numerator alone (normalize=False)
        out = num
    return out.reshape(B, H, nb * W, -1)[:, :, :N].to(v.dtype)


__all__ = ["band", "windowed_form"]
