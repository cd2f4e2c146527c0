"""KERPLE (Chi, Fan, Ramadge, Rudnicky 2022): a learned kernel of the distance added to every score::

    variant: log     s_ij += -r1_h · log(1 + r2_h · |i - j|)        r1, r2 > 0
    variant: power   s_ij += -r1_h · |i - j| ** r2_h                 r1 > 0, 0 < r2 <= 2

r1, r2 are clamped to ≥ 0.01 (the exponent to ≤ 2) before each use, as the release does, but with ``clamped``
(value clamped, gradient passed to the stored parameter unchanged) instead of the release's write into the
parameter inside its forward, which breaks torch.compile's graph and autograd's version check for the shared
pair (docs/schemes.md, "`kerple`").
"""

from typing import Annotated, List, Mapping, Optional

import torch
from torch import nn

from linrope.base.options import OneOf
from linrope.ops.rope import compute_dtype

from .base import PositionScheme, register
from .functional import relative_distance

VARIANTS = ("log", "power")
EPS = 1e-2  # the release's floor of every kernel parameter (``self.eps``)
MAX_POWER = 2.0  # the power kernel is conditionally positive definite for exponents in (0, 2]


def clamped(p: torch.Tensor, low: float, high: Optional[float] = None) -> torch.Tensor:
    """The value of ``p`` clamped to [low, high]; the gradient reaches ``p`` unchanged (the release's gradient,
    which it computes at the clamped value it has just stored).  ``c + (p - p.detach())``: exactly the clamped
    value, and no graph break under torch.compile (no write to the parameter in a forward)."""
    return p.clamp(min=low, max=high).detach() + (p - p.detach())


@register
class Kerple(PositionScheme):
    name = "kerple"
    kind = "relative"
    linear_note = "adds a learned kernel bias -r₁·log(1 + r₂|i-j|) (or -r₁|i-j|^r₂) to every score"
    paper = (
        "Chi, Fan, Ramadge, Rudnicky 2022, KERPLE: Kernelized relative positional embedding for length extrapolation"
    )
    shares = "the kernel's parameters r₁, r₂ (one pair per head)"
    score_biases = ("r1", "r2")  # additive score biases: not weight-decayed
    variants = ({"variant": "power"},)
    differences_only = True

    @classmethod
    def name_parts(cls, options: Mapping) -> List[str]:
        """``power`` for the power kernel (the default log kernel: no suffix), after ``randomized``."""
        return super().name_parts(options) + (["power"] if options.get("variant") == "power" else [])

    @classmethod
    def tags(cls, options: Mapping) -> List[str]:
        return super().tags(options) + (["kerple_variant:power"] if options.get("variant") == "power" else [])

    def __init__(self, *, variant: Annotated[str, OneOf(lambda: VARIANTS)] = "log", **dims):
        super().__init__(**dims)
        self.variant = variant
        if self.owns_shared():
            # the release's init: the multiplier of the log and the exponent of the power kernel from 2·U(0, 1),
            # the other parameter from U(0, 1)
            scale1, scale2 = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
            self.r1 = nn.Parameter(torch.rand(self.n_heads) * scale1)
            self.r2 = nn.Parameter(torch.rand(self.n_heads) * scale2)

    def position_bias(self, positions: torch.Tensor, dtype) -> torch.Tensor:
        """(1, H, N, N): the kernel's bias, in ``dtype`` (float32, or float64 for float64 scores)."""
        dist = relative_distance(positions).abs().to(dtype)  # |i - j|, exact below 2^24 in float32
        r1 = clamped(self.r1, EPS).to(dtype)[:, None, None]
        if self.variant == "log":
            r2 = clamped(self.r2, EPS).to(dtype)[:, None, None]
            return -(r1 * torch.log1p(r2 * dist)).unsqueeze(0)
        r2 = clamped(self.r2, EPS, MAX_POWER).to(dtype)[:, None, None]
        return -(r1 * dist.pow(r2)).unsqueeze(0)  # 0 ** r2 = 0 on the diagonal, with a zero gradient for r2

    def score_bias(self, q, k, positions):
        return self.shared_bias(positions, compute_dtype(q.dtype))

    def extra_repr(self):
        return f"{super().extra_repr()}, variant={self.variant}"
