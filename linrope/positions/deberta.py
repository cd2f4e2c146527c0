"""DeBERTa disentangled attention (He et al. 2021), DESIGN.md §3:

    s_ij = (q_i·k_j + q_i·K^r_{δ(i,j)} + k_j·Q^r_{δ(j,i)}) / sqrt(3d)

with K^r = P W_{K,r}, Q^r = P W_{Q,r}, P a table of 2k relative-position rows and
δ(i, j) = clip(i - j, -k, k - 1) + k (content→position and position→content).
``log_buckets`` maps distances first as DeBERTa-v2 does: exact within ±k/2,
log-spaced from k/2 out to ``max_distance`` over the remaining rows.

P lives in model space and starts unit-scale (like the layer-normed x that feeds
W_Q), the projections at std 0.02, so the position terms start at the size of the
content term.  One table per layer (DeBERTa shares P across layers).
"""
import math

import torch
from einops import rearrange
from torch import nn

from .base import PositionScheme, register, relative_distance
from .lookup import gather_rows, used_rows


def log_bucket_distance(rel: torch.Tensor, k: int, max_distance: int) -> torch.Tensor:
    """Signed distance -> signed bucket: |r| <= k/2 exact; beyond, k/2 + ceil(log(|r|/(k/2)) /
    log(max_distance/(k/2)) · (k/2 - 1)), at most k - 1."""
    mid = max(k // 2, 1)
    a = rel.abs()
    if max_distance <= mid or mid < 2:
        return rel.clamp(-k, k - 1)
    logd = torch.ceil(torch.log(a.clamp_min(1).double() / mid) / math.log(max_distance / mid) * (mid - 1)).long()
    far = (mid + logd).clamp_max(k - 1)
    return torch.where(a <= mid, rel, torch.sign(rel) * far)


@register
class DeBERTa(PositionScheme):
    name = "deberta"
    kind = "relative"
    linear_ok = False
    linear_note = "adds content→position and position→content terms q_i·K^r_{δ(i,j)} + k_j·Q^r_{δ(j,i)} to every score"
    paper = "He, Liu, Gao, Chen 2021, DeBERTa: decoding-enhanced BERT with disentangled attention"

    def __init__(self, *, k: int = 128, log_buckets: bool = False, max_distance: int = 512,
                 init_std: float = 0.02, **dims):
        super().__init__(**dims)
        if k < 1:
            raise ValueError(f"deberta relative distance k must be >= 1; got {k}")
        self.k, self.log_buckets, self.max_distance = k, log_buckets, max_distance
        if self.where == "attention":
            hd = self.n_heads * self.head_dim
            self.table = nn.Parameter(torch.randn(2 * k, self.d_model))  # P
            self.w_kr = nn.Parameter(torch.randn(self.d_model, hd) * init_std)
            self.w_qr = nn.Parameter(torch.randn(self.d_model, hd) * init_std)

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(3 * self.head_dim)

    def delta(self, positions: torch.Tensor) -> torch.Tensor:
        """(N, N) matrix δ(i, j) = clip(bucket(i - j), -k, k - 1) + k, in 0 … 2k-1."""
        rel = -relative_distance(positions)  # i - j
        if self.log_buckets:
            rel = log_bucket_distance(rel, self.k, self.max_distance)
        return rel.clamp(-self.k, self.k - 1) + self.k

    def score_bias(self, q, k, positions):
        idx, lo, hi = used_rows(self.delta(positions))
        p = self.table[lo:hi].to(q.dtype)
        k_r = rearrange(p @ self.w_kr.to(q.dtype), "r (h d) -> h r d", h=self.n_heads)
        q_r = rearrange(p @ self.w_qr.to(q.dtype), "r (h d) -> h r d", h=self.n_heads)
        c2p = gather_rows(q @ k_r.transpose(-1, -2), idx)  # q_i·K^r_{δ(i,j)}
        # δ(j, i) read as a matrix over (j, i) is the same function: gather key j's rows with idx, transpose
        p2c = gather_rows(k @ q_r.transpose(-1, -2), idx).transpose(-1, -2)  # k_j·Q^r_{δ(j,i)}
        return (c2p + p2c) * self.score_scale()

    def extra_repr(self):
        return f"where={self.where}, k={self.k}, log_buckets={self.log_buckets}, max_distance={self.max_distance}"
