"""FIRE, functional interpolation for relative positions (Li et al. 2024)::

    s_ij += b_h(i, j) = f_θ(ψ(i - j) / (ψ(max(L, i)) + eps))_h,    ψ(x) = log(|c|·x + 1),   L = |m·L₀|

for keys j ≤ i of a causal model; f_θ is Linear(1, ``mlp_width``) → ReLU → Linear(``mlp_width``, H), as the
paper's appendix listing writes it (``eps: 0``: the paper's formula).  f_θ runs with autocast off (the bias is
float32, float64 for float64 scores), over blocks of query rows so that its hidden activations stay under
``HIDDEN_BUDGET`` elements at long evaluation lengths (docs/schemes.md, "`fire`").
"""

from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from linrope.ops.linear_attn.common import autocast_off
from linrope.ops.rope import compute_dtype

from .base import PositionScheme, Positive, register

# elements of f_θ's hidden activations computed at once: 256 positions (the training context) take one block;
# 4096 (16× it, the extrapolation's longest row) take 32 blocks of 128 query rows, 64 MiB of float32 each
HIDDEN_BUDGET = 1 << 24


@register
class FIRE(PositionScheme):
    name = "fire"
    kind = "relative"
    linear_note = "adds a learned bias f_θ(ψ(i-j)/ψ(max(L, i))) to every score"
    paper = (
        "Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar, Bhojanapalli 2024, Functional "
        "interpolation for relative positions improves long context transformers"
    )
    shares = "f_θ, c and L (share: true is the paper's FIRE-S; its FIRE, the default here, has one set per layer)"
    causal_only = "its normaliser ψ(max(L, i)) bounds only keys behind the query (j ≤ i), as the paper defines it"
    # f_θ is the score bias, parametrised: not weight-decayed, as T5's β (docs/methods.md#weight-decay); c and the
    # threshold's multiplier are scalars, never decayed
    score_biases = ("w1", "b1", "w2", "b2")
    absolute_terms = True  # ψ(max(L, i)) reads the query's own position: packed documents give each its own
    variants = ({"init_threshold": 4.0},)  # queries past L: ψ(max(L, i)) reads the query's position

    def __init__(
        self,
        *,
        share: bool = False,
        mlp_width: Positive = 32,
        init_c: Annotated[float, Field(gt=0)] = 0.1,
        init_threshold: Annotated[float, Field(gt=0)] = 512.0,
        eps: Annotated[float, Field(ge=0, description="0: the paper's formula; the appendix code adds 1e-6")] = 1e-6,
        **dims,
    ):
        super().__init__(share=share, **dims)
        self.mlp_width, self.init_threshold, self.eps = mlp_width, float(init_threshold), float(eps)
        if self.owns_shared():
            w, h = mlp_width, self.n_heads
            # torch's nn.Linear init (uniform ±1/sqrt(fan_in)): fan_in 1 for the first layer, mlp_width for the second
            self.w1 = nn.Parameter(torch.empty(w).uniform_(-1.0, 1.0))
            self.b1 = nn.Parameter(torch.empty(w).uniform_(-1.0, 1.0))
            self.w2 = nn.Parameter(torch.empty(h, w).uniform_(-(w**-0.5), w**-0.5))
            self.b2 = nn.Parameter(torch.empty(h).uniform_(-(w**-0.5), w**-0.5))
            self.c = nn.Parameter(torch.tensor(float(init_c)))
            self.l_mult = nn.Parameter(torch.tensor(1.0))  # L = |l_mult · init_threshold|

    def threshold(self) -> torch.Tensor:
        """L = |m·L₀| (a 0-dim tensor)."""
        return (self.l_mult * self.init_threshold).abs()

    def normalized_distance(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(N, N), or (B, N, N) for per-row positions (packed documents: each counted from its document's start):
        ψ(|i - j|) / (ψ(max(L, i)) + eps), query i along the rows; ψ(x) = log(1 + |c|·x).  Keys ahead of the query
        (masked by causal attention) get the value of the same distance behind, finite."""
        p = positions.to(dtype)
        c = self.c.to(dtype).abs()
        num = torch.log1p(c * (p[..., :, None] - p[..., None, :]).abs())
        den = torch.log1p(c * torch.maximum(p, self.threshold().to(dtype))) + self.eps
        return num / den[..., :, None]

    def position_bias(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(1, H, N, N) in ``dtype`` ((B, H, N, N) for per-row positions): f_θ of the normalised distances, over
        blocks of query rows."""
        with autocast_off(positions.device.type):
            u = self.normalized_distance(positions, dtype)
            w1, b1, w2, b2 = (t.to(dtype) for t in (self.w1, self.b1, self.w2, self.b2))
            n = u.shape[-2]
            rows = max(1, HIDDEN_BUDGET // max(1, u[..., :1, :].numel() * self.mlp_width))
            blocks = [torch.relu(u[..., r : r + rows, :, None] * w1 + b1) @ w2.T + b2 for r in range(0, n, rows)]
            out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-3)  # (…, N, N, H)
        out = out.movedim(-1, -3)  # (…, H, N, N)
        return out if out.dim() == 4 else out.unsqueeze(0)

    def score_bias(self, q, k, positions):
        return self.shared_bias(positions, compute_dtype(q.dtype))

    def extra_repr(self):
        return f"{super().extra_repr()}, mlp_width={self.mlp_width}, eps={self.eps}"
