"""Rotary Position Embedding on q and k (Su et al. 2021), with position interpolation / NTK scaling."""

from typing import Annotated, Optional

from linrope.ops.rope import SCALINGS, check_rope_dim, compute_dtype, rope_cos_sin, rope_frequencies, rotate

from .base import Base, PositionScheme, Rule, register


@register
class RoPE(PositionScheme):
    name = "rope"
    kind = "relative"
    linear_ok = True
    linear_note = "rotates φ(q), φ(k) in the numerator (or both, or neither: model.attention.placement)"
    paper = "Su et al. 2021, RoFormer: enhanced transformer with rotary position embedding"

    def __init__(
        self,
        *,
        base: Base = 10000.0,
        scaling: Annotated[Optional[str], Rule(choices=lambda: SCALINGS)] = None,
        factor: Annotated[float, Rule(above=0)] = 1.0,
        **dims,
    ):
        super().__init__(**dims)
        check_rope_dim(self.head_dim)
        self.base, self.scaling, self.factor = base, scaling, factor
        self.register_buffer(
            "theta", rope_frequencies(self.head_dim, base, scaling=scaling, factor=factor), persistent=False
        )

    def rotate_qk(self, q, k, positions):
        dtype = compute_dtype(q.dtype)
        cos, sin = rope_cos_sin(positions, self.theta, dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def linear_rope_theta(self):
        return self.theta

    def extra_repr(self):
        return f"where={self.where}, base={self.base}, scaling={self.scaling}, factor={self.factor}"
