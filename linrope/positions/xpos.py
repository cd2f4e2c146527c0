"""xPos (Sun et al. 2023, *A Length-Extrapolatable Transformer*): RoPE with ζ_t^(n/scale_base) on the query at n
and ζ_t^(-n/scale_base) on the key, so pair t of a score decays as ζ_t^((i-j)/scale_base)::

    ζ_t = (2t + γ·d) / ((1 + γ)·d),  t = 0 … d/2-1,  γ = 0.4,  scale_base = 512

as torchscale releases it: interleaved pairs, the scale at positions centred on the window (n - c,
c = first + ceil(N/2)), which halves the exponents without changing a score.  Scale formed in float64 and rounded
once to ``compute_dtype`` with cos and sin (docs/schemes.md, "`xpos`").
"""

from __future__ import annotations

import math
from typing import Annotated, List, Mapping, Optional

import torch
from pydantic import Field

from linrope.base.errors import SequenceTooLong
from linrope.ops.rope import check_rope_dim, compute_dtype, rope_cos_sin, rope_frequencies, rotate

from .base import Base, PositionScheme, register

# the largest score factor ζ_0^((j-i)/scale_base) a window may form (a key ahead of its query: hidden by the causal
# mask, but formed before the mask hides it, and inf - inf would be NaN; or seen, without one): at most the square
# root of the compute dtype's largest value, which leaves the other half of its exponent range to |q|·|k|
HIDDEN_HEADROOM = 0.5


def xpos_zeta(head_dim: int, gamma: float) -> torch.Tensor:
    """ζ_t = (2t + γ·d) / ((1 + γ)·d), float64 (torchscale's ``(arange(0, d, 2) + 0.4·d) / (1.4·d)``)."""
    t2 = torch.arange(0, head_dim, 2, dtype=torch.float64)
    return (t2 + gamma * head_dim) / ((1 + gamma) * head_dim)


def centre(first: int, n: int) -> int:
    """The release's origin of the scale for a window of ``n`` positions from ``first``: its positions run from
    ``-(n // 2 rounded up)``, so position ``first + ceil(n/2)`` has exponent 0."""
    return first + (n + 1) // 2


def safe_length(zeta0: float, scale_base: float, dtype: torch.dtype) -> int:
    """The longest causal window whose hidden scores stay below finfo(dtype).max ** HIDDEN_HEADROOM per unit |q||k|."""
    room = HIDDEN_HEADROOM * math.log(torch.finfo(dtype).max)
    return int(room * scale_base / -math.log(zeta0)) + 1


@register
class XPos(PositionScheme):
    name = "xpos"
    kind = "relative"
    linear_note = (
        "its scale weights pair t of every kernel weight by ζ_t^((i-j)/scale_base), a per-dimension decay; "
        "linear attention's forms carry a per-head decay γ_h^(i-j) only, and xPos is not approximated by one"
    )
    paper = "Sun et al. 2023, A Length-Extrapolatable Transformer"
    differences_only = True  # ζ's exponents and the rotation's angles are i - j once the centre cancels
    even_head_dim = True  # it rotates pairs of a head's dimensions, as RoPE does

    def __init__(
        self,
        *,
        base: Base = 10000.0,
        scale_base: Annotated[float, Field(gt=0, description="torchscale's xpos_scale_base")] = 512.0,
        gamma: Annotated[float, Field(gt=0, description="ζ_t = (2t + γ·d) / ((1 + γ)·d)")] = 0.4,
        blockwise: Annotated[
            bool, Field(description="the paper's blockwise causal attention, blocks of max_len/2")
        ] = False,
        **dims,
    ):
        super().__init__(**dims)
        check_rope_dim(self.head_dim)
        self.base, self.scale_base, self.gamma, self.blockwise = base, scale_base, gamma, blockwise
        self.float64_buffer("theta", rope_frequencies(self.head_dim, base))  # .bfloat16() must not round θ or ζ
        self.float64_buffer("zeta", xpos_zeta(self.head_dim, gamma))

    def scaled_tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """(cos·s, sin·s, cos/s, sin/s), (N, d/2) in ``dtype``: the query's and the key's rotation times their scale
        s = ζ_t^((n - c)/scale_base), angles and scale formed in float64 and rounded once."""
        first, last = self.span(positions)
        n = last - first + 1
        cos, sin = rope_cos_sin(positions, self.theta, torch.float64)
        expo = (positions.to(torch.float64) - centre(first, n)) / self.scale_base
        scale = self.zeta.to(positions.device) ** expo[:, None]
        return tuple(t.to(dtype) for t in (cos * scale, sin * scale, cos / scale, sin / scale))

    @classmethod
    def dims_problems(cls, options: Mapping, *, head_dim: int, max_len: int, causal: bool) -> List[str]:
        if options["blockwise"] and not causal:
            return ["blockwise is the paper's blockwise *causal* attention; this model has causal=false"]
        if options["blockwise"] and max_len < 2:
            return [f"blockwise needs max_len >= 2 (blocks of max_len/2); got max_len={max_len}"]
        return []

    def check_length(self, positions, dtype: torch.dtype) -> None:
        """Refuse a window whose scores of keys ahead of a query could overflow ``dtype``, the dtype the attention
        kernel forms the scores in (q's: bf16 or fp16 under autocast), before they are formed."""
        first, last = self.span(positions)
        n = last - first + 1
        limit = safe_length(self.gamma / (1 + self.gamma), self.scale_base, dtype)  # ζ_0, a Python float: no sync
        if n > limit:
            raise SequenceTooLong(
                f"xpos: a window of {n} positions is beyond {limit}, the longest whose scores of keys ahead "
                f"(ζ_0^((j-i)/{self.scale_base:g})) stay finite in {str(dtype).replace('torch.', '')}; "
                "score it in shorter windows"
            )

    def rotate_qk(self, q, k, positions):
        self.check_length(positions, q.dtype)
        dtype = compute_dtype(q.dtype)
        qc, qs, kc, ks = self.memo(("xpos", id(positions), dtype), lambda: self.scaled_tables(positions, dtype))
        return rotate(q, qc, qs), rotate(k, kc, ks)

    def score_bias(self, q, k, positions) -> Optional[torch.Tensor]:
        """With ``blockwise``: -inf where key j lies before the query's previous block (blocks of max_len/2, rounded
        up, from the window's start), else 0; at most max_len positions it hides nothing the causal mask does not."""
        if not self.blockwise:
            return None
        block, dtype = (self.max_len + 1) // 2, compute_dtype(q.dtype)
        first, _ = self.span(positions)

        def make():
            b = torch.div(positions - first, block, rounding_mode="floor")
            far = b[None, :] < b[:, None] - 1
            return torch.zeros(far.shape, dtype=dtype, device=q.device).masked_fill(far, float("-inf"))

        return self.memo(("xpos-blocks", id(positions), dtype), make)  # once per forward, for every layer

    def extra_repr(self):
        return f"where={self.where}, base={self.base}, scale_base={self.scale_base}, gamma={self.gamma}" + (
            ", blockwise=True" if self.blockwise else ""
        )
