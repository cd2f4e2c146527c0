"""TUPE, untied positional encoding (Ke, He, Liu 2021), the TUPE-R form::

    s_ij = (x_iW_Q)(x_jW_K)ᵀ / sqrt(2d) + (p̂_iU_Q + c_Q)(p̂_jU_K + c_K)ᵀ / sqrt(2d) + b_{j-i},   p̂ = LN(p)

p a learned absolute table of max_len rows, b a per-head bias over T5 buckets of j - i.  The positional term
lives in the attention role, never added to the tokens (docs/schemes.md, "`tupe`").
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .base import InitStd, register
from .functional import check_table_positions
from .t5 import BucketBias


@register
class TUPE(BucketBias):
    name = "tupe"
    linear_note = "adds the positional correlation (p_iU_Q)(p_jU_K)ᵀ and a bias b_{j-i} to every score"
    paper = "Ke, He, Liu 2021, Rethinking positional encoding in language pre-training"
    shares = "everything: the table p, its layer norm, U_Q, U_K and the bucket bias b (one correlation for all layers)"
    tables = ("table",)
    absolute_terms = True  # p_i, p_j: packed documents give each document's own positions
    variants = ({"share": False},)
    max_len_table = True

    def __init__(self, *, init_std: InitStd = 0.02, **options):
        super().__init__(**options)
        if self.owns_shared():
            d, hd = self.d_model, self.n_heads * self.head_dim
            self.table = nn.Parameter(torch.randn(self.max_len, d) * init_std)  # p_i
            self.ln = nn.LayerNorm(d)
            self.u_q, self.u_k = nn.Linear(d, hd), nn.Linear(d, hd)
            for u in (self.u_q, self.u_k):
                nn.init.normal_(u.weight, std=init_std)
                nn.init.zeros_(u.bias)
            self.bias = self.bucket_table(init_std)

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.head_dim)

    def position_bias(self, positions: torch.Tensor, dtype) -> torch.Tensor:
        """(1, H, N, N): the positional correlation, scaled, plus the bucket bias; (B, H, N, N) for each row's
        own positions (B, N) (packed documents)."""
        check_table_positions(self.span(positions), self.max_len, "tupe")
        p = self.ln(self.table[positions]).to(dtype)  # (N, D) or (B, N, D)
        pq, pk = (
            rearrange(F.linear(p, u.weight.to(dtype), u.bias.to(dtype)), "... n (h d) -> ... h n d", h=self.n_heads)
            for u in (self.u_q, self.u_k)
        )
        absolute = (pq @ pk.transpose(-1, -2)) * self.score_scale()
        absolute = absolute.unsqueeze(0) if positions.dim() == 1 else absolute
        return absolute + super().position_bias(positions, dtype)

    def extra_repr(self):
        return f"{super().extra_repr()}, max_len={self.max_len}"
