"""Scans over chunks: the running state handed from chunk to chunk, forwards and backwards, and the decayed
prefix sums of vectors that the unrotated denominator needs.

    state scan:   S_in[0] = S0,  S_in[c+1] = γ^(ℓ_c) S_in[c] + U_c        (S_in[nc] is the final state)
    reverse:      R_in[nc-1] = R_last,  R_in[c-1] = γ^(ℓ_c) R_in[c] + W_c
    prefix sum:   zc_i = Σ_{j≤i} γ^(i-j) x_j + γ^(i+1) z0

Every chunk but the last of a sequence is whole, so the weight across a chunk is one number per head,
γ^C, and a scan over n chunks is a decayed prefix sum with that weight:

    Y_c = Σ_{j≤c} γ^(C(c-j)) X_j

It is computed the way the chunk form computes attention, one level up (``_prefix``): the n items are cut
into groups of ``GROUP``, a matmul with the lower-triangular table L[t,s] = γ^(C(t-s)) sums inside every
group at once, the group totals (each an item of a scan with weight γ^(C·GROUP)) are scanned the same way,
and γ^(C(t+1)) times the total entering a group is added to its items.  A scan is then a fixed handful of
operations per level, and there are log_GROUP(n) levels, where a loop over chunks was two operations per
chunk.  Every weight is a power γ^k with k ≥ 0 formed from log γ (never a rescaling by γ^(-k), which
overflows), and every sum adds terms of one decay pattern, so the rounding is that of a float32 sum.

``SEQUENTIAL = True`` restores the loop over chunks (one add per chunk), the plan before issue 31; it stays
as the reference the tests hold the scans to and for the benchmark's old-against-new comparison.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .buffers import alloc
from .tables import Chunks

GROUP = 16  # items per group of the scan's matmul (an L of GROUP×GROUP; up to 2·GROUP scanned in one matmul)
SEQUENTIAL = False  # True: the loop over chunks, one add per chunk (the plan before issue 31)


def _prefix(X: torch.Tensor, ch: Chunks, step: int, reverse: bool) -> torch.Tensor:
    """Y_c = Σ_{j≤c} γ^(step·(c-j)) X_j (reverse: Σ_{j≥c} γ^(step·(j-c)) X_j) along dim 2 of X (B, H, n, R)."""
    B, H, n, R = X.shape
    if n <= 2 * GROUP:
        return torch.matmul(ch.scan_table(n, step, reverse), X)  # (H,n,n) or (n,n) on (B,H,n,R)
    m, G = GROUP, -(-n // GROUP)
    if G * m != n:  # zero items at the end change no sum before them (nor, reversed, any sum)
        Xp = alloc((B, H, G * m, R), dtype=X.dtype, device=X.device)
        Xp[:, :, :n].copy_(X)
        Xp[:, :, n:].zero_()
        X = Xp
    L = ch.scan_table(m, step, reverse)
    Y = torch.matmul(L.unsqueeze(1) if L.dim() == 3 else L, X.reshape(B, H, G, m, R))  # inside each group
    T = _prefix(Y[:, :, :, 0 if reverse else -1], ch, step * m, reverse)  # group totals, scanned
    w = ch.scan_weights(m, step, reverse)  # γ^(step·(t+1)) (reverse: γ^(step·(m-t))), or None
    tail, head = (Y[:, :, :-1], T[:, :, 1:]) if reverse else (Y[:, :, 1:], T[:, :, :-1])
    if w is None:
        tail.add_(head.unsqueeze(3))
    else:
        tail.addcmul_(head.unsqueeze(3), w)
    Y = Y.view(B, H, G * m, R)
    return Y if G * m == n else Y[:, :, :n]


def _across(x: torch.Tensor, state: torch.Tensor, ch: Chunks, c: int, ndim_rest: int, out=None) -> torch.Tensor:
    """x + γ^(ℓ_c)·state: a state carried across chunk c and added to x (into ``out`` when given)."""
    if ch.decay:
        return torch.addcmul(x, state, ch.g_at(c, ndim_rest), out=out)
    return torch.add(x, state, out=out)


def _with_start(like: torch.Tensor, start: Optional[torch.Tensor], at: int) -> torch.Tensor:
    """A buffer shaped like ``like`` whose slot ``at`` along dim 2 holds ``start`` (zeros when None)."""
    buf = alloc(like.shape, dtype=like.dtype, device=like.device)
    if start is None:
        buf[:, :, at].zero_()
    else:
        buf[:, :, at].copy_(start)
    return buf


def _doc_table(ch: Chunks, counts: torch.Tensor, reverse: bool) -> torch.Tensor:
    """With documents: L[t,s] = γ^(C·|t-s|) for s ≤ t (reverse: s ≥ t) where ``counts`` (B, n) of chunks holding
    a boundary agree at t and s (no boundary crossed), else 0: (B, H|1, n, n).  One dense matmul over the
    chunks of a block (O(nc²), against the O(nc·C) of the chunks' own products) in place of ``_prefix``'s
    tables of one weight per head; ids are compared, no state is subtracted."""
    n = counts.shape[1]
    t = torch.arange(n, device=ch.device, dtype=torch.float64)
    diff = t[:, None] - t[None, :]
    if reverse:
        diff = -diff
    w = torch.where(diff >= 0, torch.exp(ch.log_gamma[:, None, None] * (ch.C * diff.clamp_min(0))), 0.0)
    same = (counts[:, :, None] == counts[:, None, :]).unsqueeze(1)
    return (w.unsqueeze(0) * same).to(ch.dtype)


def _scan_states_documents(U: torch.Tensor, ch: Chunks, S0: Optional[torch.Tensor]):
    """``scan_states`` where a chunk holding a boundary passes no state on: S_in[c] = Σ_{j≤c} γ^(C(c-j)) X_j
    over the X_j = [S0, U_0, …][j] that no boundary in the chunks j … c-1 separates from chunk c."""
    B, H, nc = U.shape[:3]
    rest = U.shape[3:]
    X = _with_start(U, S0, 0)
    X[:, :, 1:].copy_(U[:, :, :-1])
    before = F.pad(ch.docs.cuts[:, :-1], (1, 0))  # chunks holding a boundary among 0 … c-1
    S_in = torch.matmul(_doc_table(ch, before, False), X.view(B, H, nc, -1)).view(B, H, nc, *rest)
    return S_in, _across(U[:, :, -1], S_in[:, :, -1], ch, nc - 1, len(rest))


def _scan_states_reverse_documents(W: torch.Tensor, ch: Chunks, R_last: Optional[torch.Tensor]):
    """``scan_states_reverse`` with documents: R_in[c-1] = W_c + γ^(ℓ_c)·[chunk c holds no boundary]·R_in[c]."""
    B, H, nc = W.shape[:3]
    rest = W.shape[3:]
    R_in = _with_start(W, R_last, -1)
    if nc > 1:
        X = _reverse_operand(W, ch, R_last)
        # item c (R_in[c]) takes X_j, j ≥ c, when chunks c+1 … j hold no boundary: equal inclusive counts
        L = _doc_table(ch, ch.docs.cuts[:, :-1], True)
        R_in[:, :, :-1].copy_(torch.matmul(L, X.view(B, H, nc - 1, -1)).view(X.shape))
    return R_in, _across(W[:, :, 0], R_in[:, :, 0], ch, 0, len(rest))


def _reverse_operand(W: torch.Tensor, ch: Chunks, R_last: Optional[torch.Tensor]) -> torch.Tensor:
    """X = [W_1, …, W_{nc-2}, R_in[nc-2]] (B, H, nc-1, *rest), R_in[nc-2] = γ^(ℓ_{nc-1}) R_last + W_{nc-1} (the last
    chunk may be short; W_{nc-1} alone without R_last): what the reverse scans sum, ``nc`` > 1."""
    B, H, nc = W.shape[:3]
    rest = W.shape[3:]
    X = alloc((B, H, nc - 1, *rest), dtype=W.dtype, device=W.device)
    X[:, :, :-1].copy_(W[:, :, 1:-1])
    if R_last is None:
        X[:, :, -1].copy_(W[:, :, -1])
    else:
        _across(W[:, :, -1], R_last, ch, nc - 1, len(rest), out=X[:, :, -1])
    return X


def scan_states(U: torch.Tensor, ch: Chunks, S0: Optional[torch.Tensor]):
    """Exclusive scan over chunks.  U: (B, H, nc, *rest) -> (S_in (B, H, nc, *rest), S_final (B, H, *rest))."""
    if ch.docs is not None:
        return _scan_states_documents(U, ch, S0)
    if SEQUENTIAL:
        return _scan_states_loop(U, ch, S0)
    B, H, nc = U.shape[:3]
    rest = U.shape[3:]
    # X = [S0, U_0, …, U_{nc-2}]: then S_in is the prefix sum of X with the weight γ^C across each chunk
    X = _with_start(U, S0, 0)
    X[:, :, 1:].copy_(U[:, :, :-1])
    S_in = _prefix(X.view(B, H, nc, -1), ch, ch.C, reverse=False).view(B, H, nc, *rest)
    return S_in, _across(U[:, :, -1], S_in[:, :, -1], ch, nc - 1, len(rest))


def scan_states_reverse(W: torch.Tensor, ch: Chunks, R_last: Optional[torch.Tensor]):
    """Reverse scan -> (R_in (B, H, nc, *rest), R_before = γ^(ℓ_0) R_in[0] + W_0)."""
    if ch.docs is not None:
        return _scan_states_reverse_documents(W, ch, R_last)
    if SEQUENTIAL:
        return _scan_states_reverse_loop(W, ch, R_last)
    B, H, nc = W.shape[:3]
    rest = W.shape[3:]
    R_in = _with_start(W, R_last, -1)
    if nc > 1:
        # R_in[nc-2] is X's last item; the rest is a reverse prefix sum of X with the weight γ^C
        X = _reverse_operand(W, ch, R_last)
        R_in[:, :, :-1].copy_(_prefix(X.view(B, H, nc - 1, -1), ch, ch.C, reverse=True).view(X.shape))
    return R_in, _across(W[:, :, 0], R_in[:, :, 0], ch, 0, len(rest))


def _scan_states_loop(U, ch, S0):
    nc, rest = U.shape[2], U.dim() - 3
    S_in = _with_start(U, S0, 0)
    for c in range(nc - 1):
        _across(U[:, :, c], S_in[:, :, c], ch, c, rest, out=S_in[:, :, c + 1])
    return S_in, _across(U[:, :, -1], S_in[:, :, -1], ch, nc - 1, rest)


def _scan_states_reverse_loop(W, ch, R_last):
    nc, rest = W.shape[2], W.dim() - 3
    R_in = _with_start(W, R_last, -1)
    for c in range(nc - 1, 0, -1):
        _across(W[:, :, c], R_in[:, :, c], ch, c, rest, out=R_in[:, :, c - 1])
    return R_in, _across(W[:, :, 0], R_in[:, :, 0], ch, 0, rest)


def dcumsum(x: torch.Tensor, ch: Chunks, z0: Optional[torch.Tensor] = None) -> torch.Tensor:
    """zc_i = Σ_{j≤i} γ^(i-j) x_j + γ^(i+1) z0 for x (B, H, N, D)."""
    if not ch.decay:
        zc = x.cumsum(2)
        return zc if z0 is None else zc.add_(z0.unsqueeze(2))
    xc = ch.split(x)  # (B,H,nc,C,D)
    zc = torch.matmul(ch.M, xc)  # intra-chunk decayed sums
    T = (xc * ch.kw).sum(3)  # chunk totals decayed to the chunk's end, (B,H,nc,D)
    Z_in, _ = scan_states(T, ch, z0)
    if ch.nc > 1 or z0 is not None:
        zc.addcmul_(Z_in.unsqueeze(3), ch.qw)
    return ch.merge(zc)


def dcumsum_reverse(y: torch.Tensor, ch: Chunks) -> torch.Tensor:
    """r_j = Σ_{i≥j} γ^(i-j) y_i (with documents: over the i of j's document)."""
    return dcumsum(y.flip(2), ch if ch.docs is None else ch.flipped()).flip(2)


def dsum_symmetric(x: torch.Tensor, ch: Chunks) -> torch.Tensor:
    """Σ_j γ^|i-j| x_j (non-causal)."""
    if not ch.decay:
        return x.sum(2, keepdim=True).expand_as(x)
    return dcumsum(x, ch) + dcumsum_reverse(x, ch) - x


__all__ = ["GROUP", "SEQUENTIAL", "scan_states", "scan_states_reverse", "dcumsum", "dcumsum_reverse", "dsum_symmetric"]
