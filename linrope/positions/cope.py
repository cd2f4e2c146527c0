"""CoPE, contextual position encoding (Golovneva, Wang, Weston, Sukhbaatar 2024)::

    g_it = σ(q_i·k_t / sqrt(d))                        gates, on the scaled logits (paper's listing and release)
    p_ij = min(Σ_{t=j..i} g_it, npos_max - 1)          keys at or behind the query (causal)
    z_i[r] = q_i·e[r],   r = 0 … npos_max - 1           every query against every row, once: (B, H, N, rows)
    s_ij += c · ((1 - w_ij)·z_i[⌊p_ij⌋] + w_ij·z_i[⌈p_ij⌉]),   w_ij = p_ij - ⌊p_ij⌋

``c`` is ``position_scale``: ``release`` (default) ``1/sqrt(d)``, ``paper`` 1.  ``npos_max`` null: ``max_len + 1``
rows (p reaches the window's length when every gate is 1).  Computed per layer and per forward from q and k, never
from the positions.  Gates and the reverse cumulative sum run in float32 (float64 for float64 inputs) with autocast
off, so a sum of a few hundred gates keeps its fractional part under bf16 (docs/schemes.md, "`cope`").
"""

from typing import Literal, Optional

import torch
from torch import nn

from linrope.ops.linear_attn.common import autocast_off
from linrope.ops.rope import compute_dtype

from .base import PositionScheme, Positive, register

POSITION_SCALES = ("release", "paper")


def contextual_positions(q: torch.Tensor, k: torch.Tensor, scale: float, npos_max: int) -> torch.Tensor:
    """p_ij = min(Σ_{t=j..i} σ(scale·q_i·k_t), npos_max - 1) for j ≤ i, 0 for j > i: (B, H, N, N) in q's dtype.

    The sum runs from the far end of each row (the masked keys ahead of the query add exact zeros), so every p_ij
    is summed from its own terms, never as a difference of two long prefix sums."""
    gates = torch.sigmoid((q * scale) @ k.transpose(-1, -2)).tril()
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos_max - 1)


def interpolated_logits(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """z (…, N, R): z_i[r] = q_i·e[r]; p (…, N, N) in [0, R - 1] -> (…, N, N): z_i at p_ij, interpolated linearly
    between its rows ⌊p_ij⌋ and ⌈p_ij⌉.  Written ``z[f] + w·(z[f + 1] - z[f])`` with f = ⌊p⌋: one index for both
    gathers (the release gathers at ⌊p⌋ and ⌈p⌉ separately); equal where p is fractional, and where it is an
    integer w = 0 leaves z[p] (the last row's step is a zero column, read only by p = R - 1)."""
    f = p.detach().floor()
    w = p - f
    idx = f.long()
    step = torch.cat([z[..., 1:] - z[..., :-1], torch.zeros_like(z[..., :1])], dim=-1)
    return z.gather(-1, idx) + w * step.gather(-1, idx)


@register
class CoPE(PositionScheme):
    name = "cope"
    kind = "contextual"
    linear_note = "adds q_i·e[p_ij] to every score, p_ij counted by the gates σ(q_i·k_t) of every query-key pair"
    paper = "Golovneva, Wang, Weston, Sukhbaatar 2024, Contextual position encoding: learning to count what's important"
    tables = ("table",)  # e: rows indexed by (contextual) position, not weight-decayed
    causal_only = (
        "its positions p_ij = Σ_{t=j..i} σ(q_i·k_t) count from the key up to the query, defined for keys at or "
        "behind it (the paper and its release train decoders); use a causal model"
    )
    differences_only = True  # it never reads the positions: p_ij is counted by the gates

    def __init__(
        self,
        *,
        npos_max: Optional[Positive] = None,
        position_scale: Literal[POSITION_SCALES] = "release",
        **dims,
    ):
        super().__init__(**dims)
        self.npos_max = self.max_len + 1 if npos_max is None else npos_max
        self.position_scale = position_scale
        if self.where == "attention":
            self.table = nn.Parameter(torch.zeros(self.npos_max, self.head_dim))  # e[0 … npos_max-1], both codes

    def score_bias(self, q, k, positions):
        """c·q_i·e[p_ij], (B, H, N, N), in float32 (float64 for float64 q); ``positions`` is not read."""
        dtype, n = compute_dtype(q.dtype), q.shape[-2]
        rows = min(self.npos_max, n + 1)  # p_ij <= i - j + 1 <= N: rows beyond N are never read
        scale = self.score_scale()
        with autocast_off(q.device.type):
            q, k = q.to(dtype), k.to(dtype)
            p = contextual_positions(q, k, scale, self.npos_max)
            qz = q * scale if self.position_scale == "release" else q
            z = qz @ self.table[:rows].to(dtype).T  # (B, H, N, rows)
            return interpolated_logits(z, p)

    def extra_repr(self):
        return f"{super().extra_repr()}, npos_max={self.npos_max}, position_scale={self.position_scale}"
