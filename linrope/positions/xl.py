"""Transformer-XL relative attention (Dai et al. 2019)::

    s_ij = (q_i·k_j + q_i·W_R R_{i-j} + u·k_j + v·W_R R_{i-j}) / sqrt(d)

R_{i-j} the fixed sinusoidal encoding (width d_model) of i - j, negative too for encoders; W_R, u, v trainable.
The three position terms form the additive bias, computed per distance (at most 2N-1 rows) and gathered into
N×N (docs/schemes.md, "`xl`").
"""

import torch
from einops import einsum, rearrange
from torch import nn

from .base import Base, InitStd, PositionScheme, register
from .functional import gather_rows, relative_distance, sinusoidal_table


@register
class TransformerXL(PositionScheme):
    name = "xl"
    kind = "relative"
    linear_note = "adds q_i·W_R R_{i-j} + u·k_j + v·W_R R_{i-j} to every score"
    paper = "Dai et al. 2019, Transformer-XL: attentive language models beyond a fixed-length context"
    score_biases = ("u", "v")  # the global content and position biases: not weight-decayed
    differences_only = True

    def __init__(self, *, base: Base = 10000.0, init_std: InitStd = 0.02, **dims):
        super().__init__(**dims)
        self.base = base
        if self.where == "attention":
            h, d = self.n_heads, self.head_dim
            self.w_r = nn.Parameter(torch.randn(self.d_model, h * d) * init_std)
            self.u = nn.Parameter(torch.randn(h, d) * init_std)  # content bias (Transformer-XL's r_w_bias)
            self.v = nn.Parameter(torch.randn(h, d) * init_std)  # position bias (r_r_bias)

    def projected_distances(self, positions: torch.Tensor, dtype):
        """(rows (H, R, d) = W_R R_r for r = -span … span, index (N, N) of row i - j)."""
        rel = -relative_distance(positions)  # i - j
        first, last = self.span(positions)
        span = max(last - first, 0)  # the largest |i - j|, known on the host
        dist = torch.arange(-span, span + 1, device=positions.device)
        r = sinusoidal_table(dist, self.d_model, self.base).to(dtype)
        rows = rearrange(r @ self.w_r.to(dtype), "r (h d) -> h r d", h=self.n_heads)
        return rows, rel + span

    def score_bias(self, q, k, positions):
        rows, idx = self.projected_distances(positions, q.dtype)
        q_r = gather_rows(q @ rows.transpose(-1, -2), idx)  # q_i·W_R R_{i-j}
        u_k = einsum(self.u.to(q.dtype), k, "h d, b h n d -> b h n").unsqueeze(-2)  # u·k_j
        v_r = einsum(self.v.to(q.dtype), rows, "h d, h r d -> h r")[:, idx]  # v·W_R R_{i-j}
        return (q_r + u_k + v_r) * self.score_scale()

    def extra_repr(self):
        return f"where={self.where}, base={self.base}"
