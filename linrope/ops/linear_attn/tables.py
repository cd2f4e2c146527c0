"""Geometry of the chunk form: how a sequence is cut into chunks and blocks, and the decay tables.

Chunks (size C): chunk c holds positions cC … cC+C-1, local index t; the last chunk has length
ℓ = N-(nc-1)C and is zero-padded to C.  With a per-head decay γ the weight of key j seen from query i is
γ^(i-j); the tables below hold the powers of γ that the chunk kernels need, so that no kernel forms a
power itself:

    M[t,s]  = γ^(t-s) for s ≤ t, else 0   (intra-chunk mask; ``M_strict`` drops the diagonal)
    qw[t]   = γ^(t+1)                     (a query at local t reading the state entering its chunk)
    kw[c,t] = γ^(ℓ_c-1-t) for t < ℓ_c     (a key decayed to the end of its chunk; padded keys weigh 0)
    g[c]    = γ^(ℓ_c)                     (the state carried across a whole chunk)

Blocks: causal sequences are walked in blocks of whole chunks, the state handed from block to block, so
the temporaries of one block (features, C×C products, chunk states) are all that exists at a time.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from einops import rearrange

from .buffers import alloc
from .documents import ChunkDocuments

# A block holds about BLOCK_ELEMENTS[device] numbers per (·, ·, ·, d) tensor of the rows and heads walked together
# (at least one chunk): 2^18 on CPU (1 MiB in float32: 4 096 positions of one head at d = 64, 512 of eight), measured
# best because a block's temporaries then stay in cache.  Its number of blocks grows with N, and so does the number
# of operations; on a CPU long sequences run their heads as single-threaded tasks (heads.py), where an operation
# waits for no other thread.  A device without an entry (CUDA, where every operation is a launch) walks one block.
# Non-causal attention needs global sums and runs as a single block.
BLOCK_ELEMENTS = {"cpu": 1 << 18}


def plan_blocks(B: int, H: int, n: int, d: int, chunk_size: int, causal: bool, device: torch.device):
    """[(start, end), …]: the blocks of whole chunks a sequence of length n is walked in, for B·H rows and heads
    walked together."""
    target = BLOCK_ELEMENTS.get(device.type)
    if not causal or target is None:
        return [(0, n)]
    C = max(1, min(chunk_size, n))
    per = max(1, target // (B * H * max(d, 1) * C))  # chunks per block
    step = C * per
    return [(s, min(s + step, n)) for s in range(0, n, step)]


class Chunks:
    """Chunk geometry and decay tables for a sequence of length N cut into chunks of size C.

    M (H,1,C,C), qw (H,1,C,1), kw (H,nc,C,1), g (H,nc), gamma (H,): all None without decay (the mask is
    then a plain ``tril``).

    ``docs`` = (ids (B, n), id before the block (B,) or None): packed documents (``documents.py``).  Every
    table is then multiplied by its mask of ids and gains a batch dimension: M (B,H,nc,C,C), qw and kw
    (B,H,nc,C,1), g (B,H,nc); without a decay they are built with γ = 1 (exactly ones), so that the one
    decayed code path serves both; ``docs`` holds the ``ChunkDocuments``."""

    def __init__(self, n: int, chunk_size: int, log_gamma: Optional[torch.Tensor], dtype, device, docs=None):
        self._args = (n, chunk_size, log_gamma, dtype, device)
        self.docs: Optional[ChunkDocuments] = None
        if docs is not None and log_gamma is None:  # γ = 1: tables of ones, the masks carry the resets
            log_gamma = torch.zeros(1, dtype=torch.float64, device=device)
        self.C = C = max(1, min(int(chunk_size), n))
        self.nc = nc = -(-n // C)
        self.N = n
        self.dtype = dtype  # of the tables, the scans and the states
        self.pad = nc * C - n
        self.decay = log_gamma is not None
        self.M = self.M_strict = self.qw = self.kw = self.g = self.gamma = None
        self.device, self._scan = device, {}
        if not self.decay:
            return
        self.log_gamma = lg = log_gamma.to(device=device, dtype=torch.float64)
        H = lg.shape[0]
        t = torch.arange(C, device=device, dtype=torch.float64)
        diff = t[:, None] - t[None, :]
        zero = torch.zeros((), dtype=torch.float64, device=device)
        M = torch.where(diff >= 0, torch.exp(lg[:, None, None] * diff.clamp_min(0)), zero)
        self.M = M[:, None].to(dtype)
        self.M_strict = (M * (diff > 0)).to(dtype)[:, None]
        self.qw = torch.exp(lg[:, None] * (t + 1))[:, None, :, None].to(dtype)
        lengths = torch.full((nc,), float(C), device=device, dtype=torch.float64)
        lengths[-1] = n - (nc - 1) * C
        kexp = lengths[:, None] - 1 - t[None, :]  # (nc, C)
        kw = torch.where(kexp >= 0, torch.exp(lg[:, None, None] * kexp.clamp_min(0)), zero)
        self.kw = kw.reshape(H, nc, C, 1).to(dtype)
        self.g = torch.exp(lg[:, None] * lengths[None, :]).to(dtype)  # (H, nc)
        self.gamma = torch.exp(lg).to(dtype)  # (H,)
        if docs is not None:
            self.docs = d = ChunkDocuments(docs[0], docs[1], n, C, nc, dtype)
            self.M = self.M.unsqueeze(0) * d.same  # (B, H, nc, C, C)
            self.M_strict = None  # causal only
            self.qw = self.qw.unsqueeze(0) * d.keep_q  # (B, H, nc, C, 1)
            self.kw = self.kw.unsqueeze(0) * d.keep_k  # (B, H, nc, C, 1)
            self.g = self.g.unsqueeze(0) * d.carry  # (B, H, nc)
            self._flipped: Optional["Chunks"] = None

    def flipped(self) -> "Chunks":
        """These chunks over the block read backwards (``scans.dcumsum_reverse`` with documents)."""
        if self._flipped is None:
            self._flipped = Chunks(*self._args, docs=(self.docs.ids.flip(1), None))
        return self._flipped

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
        buf = alloc((B, H, self.nc * self.C, width), dtype=dtype, device=parts[0].device)
        buf[:, :, self.N :].zero_()
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
            M = self.M_strict if strict else self.M
            return P.mul_(M if M.dtype == P.dtype else M.to(P.dtype))
        return P.tril_(-1 if strict else 0)

    def g_at(self, c: int, ndim_rest: int) -> torch.Tensor:
        g = self.g[..., c]  # (H,), or (B, H) with documents
        return g.reshape(*g.shape, *([1] * ndim_rest))

    # the scans' tables (``scans._prefix``): powers of γ^step, step = C or C·GROUP^k ----------------------
    def scan_table(self, n: int, step: int, reverse: bool) -> torch.Tensor:
        """L[t,s] = γ^(step·(t-s)) for s ≤ t, else 0 (reverse: the transpose): (H,n,n), or (n,n) of ones
        without decay."""
        key = ("L", n, step, reverse)
        if key not in self._scan:
            t = torch.arange(n, device=self.device, dtype=torch.float64)
            diff = t[:, None] - t[None, :]
            if reverse:
                diff = -diff
            if not self.decay:
                L = (diff >= 0).to(self.dtype)
            else:
                w = torch.exp(self.log_gamma[:, None, None] * (step * diff.clamp_min(0)))
                L = torch.where(diff >= 0, w, torch.zeros((), dtype=w.dtype, device=w.device)).to(self.dtype)
            self._scan[key] = L
        return self._scan[key]

    def scan_weights(self, m: int, step: int, reverse: bool) -> Optional[torch.Tensor]:
        """γ^(step·(t+1)) for t < m (reverse: γ^(step·(m-t))) as (H,1,m,1); None without decay."""
        if not self.decay:
            return None
        key = ("w", m, step, reverse)
        if key not in self._scan:
            t = torch.arange(m, device=self.device, dtype=torch.float64)
            e = (m - t) if reverse else (t + 1)
            w = torch.exp(self.log_gamma[:, None] * (step * e))
            self._scan[key] = w.reshape(-1, 1, m, 1).to(self.dtype)
        return self._scan[key]


class Tables:
    """One ``Chunks`` per distinct block length (all blocks but the last share one)."""

    def __init__(self, chunk_size, log_gamma, dtype, device):
        self.args, self.cache = (chunk_size, log_gamma, dtype, device), {}

    def __call__(self, n: int, docs=None) -> Chunks:
        if docs is not None:  # the block's own ids: nothing to share with another block
            return Chunks(n, *self.args, docs=docs)
        if n not in self.cache:
            self.cache[n] = Chunks(n, *self.args)
        return self.cache[n]


__all__ = ["BLOCK_ELEMENTS", "plan_blocks", "Chunks", "Tables"]
