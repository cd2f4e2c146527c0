"""TUPE, untied positional encoding (Ke, He, Liu 2021), DESIGN.md §3:

    s_ij = (x_iW_Q)(x_jW_K)ᵀ / sqrt(2d) + (p_iU_Q)(p_jU_K)ᵀ / sqrt(2d) + b_{j-i}

p_i is a learned absolute table of max_len rows (positions ≥ max_len are refused),
U_Q, U_K per layer and head, b a per-head bias over T5 buckets of j - i
(bidirectional for encoders).  The positional correlation lives in the attention
role, never added to the tokens.  p starts unit-scale (like the layer-normed x that
feeds W_Q), U at std 0.02.  One table per layer (TUPE shares p across layers).
TUPE's [CLS] untying is not modelled (no [CLS] token here).
"""
import math
from typing import Optional

import torch
from einops import rearrange
from torch import nn

from .base import PositionScheme, register, relative_distance
from .learned import check_table_positions
from .t5 import t5_bucket


@register
class TUPE(PositionScheme):
    name = "tupe"
    kind = "relative"
    linear_ok = False
    linear_note = "adds the positional correlation (p_iU_Q)(p_jU_K)ᵀ and a bias b_{j-i} to every score"
    paper = "Ke, He, Liu 2021, Rethinking positional encoding in language pre-training"

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: Optional[bool] = None,
                 init_std: float = 0.02, **dims):
        super().__init__(**dims)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = (not self.causal) if bidirectional is None else bidirectional
        if self.where == "attention":
            hd = self.n_heads * self.head_dim
            self.table = nn.Parameter(torch.randn(self.max_len, self.d_model))  # p_i
            self.u_q = nn.Parameter(torch.randn(self.d_model, hd) * init_std)
            self.u_k = nn.Parameter(torch.randn(self.d_model, hd) * init_std)
            self.bias = nn.Parameter(torch.randn(num_buckets, self.n_heads) * self.d_model ** -0.5)

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.head_dim)

    def score_bias(self, q, k, positions):
        check_table_positions(positions, self.max_len, "tupe")
        p = self.table[positions].to(q.dtype)  # (N, D)
        pq = rearrange(p @ self.u_q.to(q.dtype), "n (h d) -> h n d", h=self.n_heads)
        pk = rearrange(p @ self.u_k.to(q.dtype), "n (h d) -> h n d", h=self.n_heads)
        absolute = (pq @ pk.transpose(-1, -2)) * self.score_scale()
        buckets = t5_bucket(relative_distance(positions), bidirectional=self.bidirectional,
                            num_buckets=self.num_buckets, max_distance=self.max_distance)
        return (absolute + self.bias.T.to(q.dtype)[:, buckets]).unsqueeze(0)  # (1, H, N, N)

    def extra_repr(self):
        return (f"where={self.where}, max_len={self.max_len}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")
