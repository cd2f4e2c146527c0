"""DeBERTa disentangled attention (He et al. 2021)::

    s_ij = (q_i·k_j + q_i·K^r_{δ(i,j)} + k_j·Q^r_{δ'}) / sqrt(3d)

with K^r = P W_{K,r}, Q^r = P W_{Q,r}, P a table of 2k relative-position rows and
δ(i, j) = clip(i - j, -k, k - 1) + k.  The position→content row δ' is ``p2c``: ``release`` (default)
δ' = δ(i, j), what the released code computes (its p2c gathers with the negated relative positions and
transposes back); ``paper`` δ' = δ(j, i), the paper's formula.  ``log_buckets`` maps distances first exactly
as DeBERTa-v2 does (``log_bucket_distance``, float32).  P starts unit-scale, the projections at std 0.02
(docs/schemes.md, "`deberta`").
"""

import math
from typing import List, Literal, Mapping

import torch
from einops import rearrange
from torch import nn

from .base import InitStd, PositionScheme, Positive, register
from .functional import clipped_rows, gather_rows, relative_distance, used_rows

P2C = ("release", "paper")


def log_bucket_distance(rel: torch.Tensor, k: int, max_distance: int) -> torch.Tensor:
    """DeBERTa-v2's ``make_log_bucket_position(rel, bucket_size=k, max_position=max_distance)``:
    signed distance -> signed bucket.  With mid = k // 2: |r| <= mid stays exact; beyond,
    sign(r) · (mid + ceil(log(|r| / mid) / log((max_distance - 1) / mid) · (mid - 1))), no clip here
    (the table index clips to [-k, k-1] afterwards, so the far left reaches row 0 and the far right
    row 2k-1).  Computed in float32 in the order of operations of the release (Hugging Face's
    DeBERTa-v2 port); a float64 evaluation differs only where the quotient rounds across an integer."""
    mid = k // 2
    a = rel.abs()
    span = torch.log(torch.tensor((max_distance - 1) / mid, dtype=torch.float32))
    logd = torch.ceil(torch.log(a.clamp_min(1).float() / mid) / span.to(a.device) * (mid - 1))
    return torch.where(a <= mid, rel, torch.sign(rel) * (mid + logd.long()))


@register
class DeBERTa(PositionScheme):
    name = "deberta"
    kind = "relative"
    linear_note = "adds content→position and position→content terms q_i·K^r_{δ(i,j)} + k_j·Q^r_{δ(i,j)} to every score"
    paper = "He, Liu, Gao, Chen 2021, DeBERTa: decoding-enhanced BERT with disentangled attention"
    tables = ("table",)  # P
    shares = "the relative-embedding table P (2k × d_model); the projections W_{K,r}, W_{Q,r} stay per layer"
    variants = ({"k": 4}, {"k": 8, "log_buckets": True, "max_distance": 32})  # clipped, log buckets
    differences_only = True

    def __init__(
        self,
        *,
        k: Positive = 128,
        log_buckets: bool = False,
        max_distance: Positive = 512,
        p2c: Literal[P2C] = "release",
        init_std: InitStd = 0.02,
        **dims,
    ):
        super().__init__(**dims)
        self.k, self.log_buckets, self.max_distance, self.p2c = k, log_buckets, max_distance, p2c
        if self.owns_shared():
            self.table = nn.Parameter(torch.randn(2 * k, self.d_model))  # P
        if self.where == "attention":
            hd = self.n_heads * self.head_dim
            self.w_kr = nn.Parameter(torch.randn(self.d_model, hd) * init_std)
            self.w_qr = nn.Parameter(torch.randn(self.d_model, hd) * init_std)

    @classmethod
    def option_problems(cls, options: Mapping) -> List[str]:
        k, far = options["k"], options["max_distance"]
        if options["log_buckets"] and (k < 2 or far - 1 <= k // 2):
            return [f"deberta log_buckets need k >= 2 and max_distance > k/2 + 1; got k={k}, max_distance={far}"]
        return super().option_problems(options)

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(3 * self.head_dim)

    def delta(self, positions: torch.Tensor) -> torch.Tensor:
        """(N, N) matrix δ(i, j) = clip(bucket(i - j), -k, k - 1) + k, in 0 … 2k-1."""
        rel = -relative_distance(positions)  # i - j
        if self.log_buckets:
            rel = log_bucket_distance(rel, self.k, self.max_distance)
        return rel.clamp(-self.k, self.k - 1) + self.k

    def score_bias(self, q, k, positions):
        # the rows the distances use, from the positions' span; log buckets: the whole table (their rows
        # would come from a float32 log on the host, which need not round as the device's does)
        rows = (0, 2 * self.k) if self.log_buckets else clipped_rows(self.span(positions), -self.k, self.k - 1)
        idx, lo, hi = used_rows(self.delta(positions), *rows)
        p = self.src.table[lo:hi].to(q.dtype)
        k_r = rearrange(p @ self.w_kr.to(q.dtype), "r (h d) -> h r d", h=self.n_heads)
        q_r = rearrange(p @ self.w_qr.to(q.dtype), "r (h d) -> h r d", h=self.n_heads)
        c2p = gather_rows(q @ k_r.transpose(-1, -2), idx)  # q_i·K^r_{δ(i,j)}
        # key j against its rows, as a matrix over (j, i), then transposed to (i, j):
        # release: row δ(i, j) = idx.T[j, i]; paper: row δ(j, i) = idx[j, i]
        p2c = gather_rows(k @ q_r.transpose(-1, -2), idx.T if self.p2c == "release" else idx).transpose(-1, -2)
        return (c2p + p2c) * self.score_scale()

    def extra_repr(self):
        return (
            f"{super().extra_repr()}, k={self.k}, log_buckets={self.log_buckets}, "
            f"max_distance={self.max_distance}, p2c={self.p2c}"
        )
