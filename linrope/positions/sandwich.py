"""Sandwich (Chi, Fan, Rudnicky, Ramadge 2023): sinusoidal p_i·p_j of width d̄ (``dim``) added to every score::

    s_ij += (p_i·p_j - d̄/2) / ρ_h,   p_i·p_j = Σ_{t=0}^{d̄/2-1} cos((i - j) / 10000^(2t/d̄)),   ρ_h = 8h/H, h = 1 … H

The offset -d̄/2, invisible to the softmax, keeps the bias 0 on the diagonal so that it keeps its resolution
where SDPA rounds it to bf16.  A table of the distances the forward spans, in float64, rounded once to the
scores' precision (docs/schemes.md, "`sandwich`").
"""

from typing import Annotated, List, Mapping

import torch
from pydantic import Field

from linrope.ops.rope import compute_dtype

from .base import PositionScheme, register
from .functional import relative_distance

BASE = 10000.0  # the sinusoids' wavelength base (Vaswani et al.; the paper keeps it)


def sandwich_distances(far: int, dim: int, device=None) -> torch.Tensor:
    """(far + 1,) float64: p_i·p_j - dim/2 = Σ_t (cos(r / 10000^(2t/dim)) - 1) at the distances r = 0 … far."""
    r = torch.arange(far + 1, dtype=torch.float64, device=device)
    freq = BASE ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)  # (dim/2,)
    return (torch.cos(r[:, None] * freq) - 1.0).sum(-1)


@register
class Sandwich(PositionScheme):
    name = "sandwich"
    kind = "relative"
    linear_note = "adds the inner product of sinusoidal embeddings p_i·p_j, per head compressed, to every score"
    paper = (
        "Chi, Fan, Rudnicky, Ramadge 2023, Dissecting transformer length extrapolation via the lens of receptive "
        "field analysis"
    )
    shares = "no parameters: its bias, a function of the positions only, computed once per forward for every layer"
    differences_only = True

    def __init__(self, *, dim: Annotated[int, Field(ge=2, description="even: the sinusoids' width d̄")] = 128, **dims):
        super().__init__(**dims)
        self.dim = dim
        ratio = torch.arange(1, self.n_heads + 1, dtype=torch.float64) * 8.0 / self.n_heads  # ρ_h = 8h/H
        self.float64_buffer("ratio", ratio)  # never rounded to the model's dtype, as ALiBi's slopes

    @classmethod
    def option_problems(cls, options: Mapping) -> List[str]:
        problems = super().option_problems(options)
        if isinstance(options.get("dim"), int) and options["dim"] % 2:
            problems.append(f"dim={options['dim']}: expected an even number (sin and cos pairs of width d̄)")
        return problems

    def position_bias(self, positions: torch.Tensor, dtype) -> torch.Tensor:
        """(1, H, N, N) in ``dtype``: the table of the distances the positions span (float64), gathered at
        |i - j| and divided by ρ_h, rounded once; head by head, so the float64 temporary is one (N, N)."""
        first, last = self.span(positions)
        table = sandwich_distances(max(last - first, 0), self.dim, positions.device)
        dist = table[relative_distance(positions).abs()]  # (N, N) float64
        n = dist.shape[0]
        out = torch.empty(1, self.n_heads, n, n, dtype=dtype, device=positions.device)
        for h in range(self.n_heads):
            out[0, h].copy_(dist / self.ratio[h])
        return out

    def score_bias(self, q, k, positions):
        return self.shared_bias(positions, compute_dtype(q.dtype))

    def extra_repr(self):
        return f"{super().extra_repr()}, dim={self.dim}"
