"""Relative position representations (Shaw et al. 2018) and the unclipped variants of Huang et al. 2020:

* ``shaw``:  s_ij += q_i·a^K_{clip(i-j,-k,k)} / sqrt(d);  o_i += Σ_j a_ij a^V_{clip(i-j,-k,k)}
* ``relative_key``:        s_ij += q_i·D_{i-j} / sqrt(d)
* ``relative_key_query``:  s_ij += (q_i·D_{i-j} + k_j·D_{i-j}) / sqrt(d)

Only ``shaw`` needs the probabilities (explicit attention); the variants go through SDPA
(docs/schemes.md, "`shaw`").
"""

import math
from typing import Literal, Optional

import torch
from torch import nn

from .base import InitStd, PositionScheme, Positive, register
from .functional import clipped_rows, gather_rows, relative_distance, scatter_rows, used_rows

VARIANTS = ("shaw", "relative_key", "relative_key_query")


@register
class Shaw(PositionScheme):
    name = "shaw"
    kind = "relative"
    linear_note = "adds q_i·a^K_{i-j} to every score and a^V_{i-j} to every value"
    tables = ("key_table", "value_table")
    has_value_term = True  # the variant "shaw"; the instance says False for the other variants
    paper = (
        "Shaw, Uszkoreit, Vaswani 2018, Self-attention with relative position representations; "
        "Huang, Liang, Xu, Xiang 2020, Improve transformer models with better relative position embeddings"
    )
    variants = ({"k": 3}, {"variant": "relative_key"}, {"variant": "relative_key_query"})
    differences_only = True

    def __init__(
        self, *, variant: Literal[VARIANTS] = "shaw", k: Positive = 16, init_std: Optional[InitStd] = None, **dims
    ):
        super().__init__(**dims)
        self.variant = variant
        self.has_value_term = variant == "shaw"
        self.clip = k if variant == "shaw" else self.max_len - 1
        # tables live in head space: start them at the size of a content q/k component
        self.init_std = 0.02 * math.sqrt(self.d_model) if init_std is None else init_std
        if self.where == "attention":
            rows = 2 * self.clip + 1
            self.key_table = nn.Parameter(torch.randn(rows, self.head_dim) * self.init_std)
            if self.has_value_term:
                self.value_table = nn.Parameter(torch.randn(rows, self.head_dim) * self.init_std)

    def table_index(self, positions: torch.Tensor) -> torch.Tensor:
        """(N, N) table row of clip(i - j, -k, k) for query i, key j."""
        return (-relative_distance(positions)).clamp(-self.clip, self.clip) + self.clip

    def rows(self, positions: torch.Tensor):
        """(index (N, N) into the used rows, lo, hi): the rows lo … hi - 1 the positions' distances use."""
        return used_rows(self.table_index(positions), *clipped_rows(self.span(positions), -self.clip, self.clip))

    def score_bias(self, q, k, positions):
        idx, lo, hi = self.rows(positions)
        table = self.key_table[lo:hi].to(q.dtype)
        s = gather_rows(q @ table.T, idx)
        if self.variant == "relative_key_query":  # k_j·D_{i-j}: key j against row idx[i, j]
            s = s + gather_rows(k @ table.T, idx.T).transpose(-1, -2)
        return s * self.score_scale()

    def value_term(self, probs, positions):
        if not self.has_value_term:
            return None
        idx, lo, hi = self.rows(positions)
        return scatter_rows(probs, idx, hi - lo) @ self.value_table[lo:hi].to(probs.dtype)

    def extra_repr(self):
        return f"where={self.where}, variant={self.variant}, clip={self.clip}"
