"""Rotary Position Embedding on q and k (Su et al. 2021), with position interpolation / NTK scaling, and
optionally a per-head decay γ_h^(i-j) (``decay``: RetNet's retention, Sun et al. 2023, or ALiBi's slopes as a
decay): linear attention takes it as its kernel's decay, softmax attention as the score bias
log γ_h·|i - j| (the same weight γ_h^(i-j) on exp(q·k)).  A decay is a fixed float64 buffer, not a parameter
(nothing to weight-decay, nothing saved in a checkpoint), and is untouched by a change of RoPE's frequencies
(the extrapolation's scaling rows swap ``theta`` only).

``rotary_fraction`` < 1 (GPT-NeoX's ``rotary_pct``, Black et al. 2022) turns only the first r = int(d·fraction)
dimensions' pairs, with an r-dimensional RoPE's frequencies (scaled as ``scaling`` says), and leaves the others
(θ = 0): softmax and linear attention take it unchanged (docs/design.md#partial-rotary)."""

from typing import Annotated, Mapping, Optional

import torch

from linrope.ops.rope import (
    SCALINGS,
    check_rope_dim,
    compute_dtype,
    partial_frequencies,
    rope_cos_sin,
    rope_frequencies,
    rotary_dims,
    rotate,
)

from .base import Base, PositionScheme, Rule, register
from .functional import DECAYS, decay_gamma_rate, distance_bias


@register
class RoPE(PositionScheme):
    name = "rope"
    kind = "relative"
    linear_ok = True
    linear_note = (
        "rotates φ(q), φ(k) in the numerator (or both, or neither: model.attention.placement); "
        "a decay as the per-head γ_h^(i-j)"
    )
    paper = "Su et al. 2021, RoFormer: enhanced transformer with rotary position embedding"

    def __init__(
        self,
        *,
        base: Base = 10000.0,
        scaling: Annotated[Optional[str], Rule(choices=lambda: SCALINGS)] = None,
        factor: Annotated[float, Rule(above=0)] = 1.0,
        decay: Annotated[Optional[str], Rule(choices=lambda: DECAYS, note="null: no decay")] = None,
        rotary_fraction: Annotated[float, Rule(above=0, high=1, note="GPT-NeoX's rotary_pct")] = 1.0,
        **dims,
    ):
        super().__init__(**dims)
        check_rope_dim(self.head_dim)
        self.base, self.scaling, self.factor, self.decay = base, scaling, factor, decay
        self.rotary_fraction, self.rotary_dims = rotary_fraction, rotary_dims(self.head_dim, rotary_fraction)
        theta = rope_frequencies(self.rotary_dims, base, scaling=scaling, factor=factor)
        self.register_buffer("theta", partial_frequencies(theta, self.head_dim), persistent=False)
        if decay is not None:  # γ_h and its rate -log γ_h, float64 (as ALiBi's slopes: rounded once, at each use)
            gamma, rate = decay_gamma_rate(decay, self.n_heads)
            self.register_buffer("gamma", gamma, persistent=False)
            self.register_buffer("rate", rate, persistent=False)

    @classmethod
    def linear_decays(cls, options: Mapping) -> bool:
        return options.get("decay") is not None

    def _apply(self, fn, recurse=True):
        kept = {name: getattr(self, name) for name in ("gamma", "rate") if name in self._buffers}
        super()._apply(fn, recurse)
        for name, t in kept.items():  # follow the device, stay float64
            setattr(self, name, t.to(getattr(self, name).device))
        return self

    def rotate_qk(self, q, k, positions):
        dtype = compute_dtype(q.dtype)
        cos, sin = rope_cos_sin(positions, self.theta, dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def score_bias(self, q, k, positions) -> Optional[torch.Tensor]:
        """With a decay, log γ_h·|i - j| (= -rate_h·|i - j|; causal attention masks j > i) in float64, rounded
        once to the scores' precision (``functional.distance_bias``, as ALiBi's); without, none."""
        if self.decay is None:
            return None
        return distance_bias(self.rate, positions, compute_dtype(q.dtype))

    def linear_rope_theta(self):
        return self.theta

    def linear_decay(self):
        return self.gamma if self.decay is not None else None

    def extra_repr(self):
        decay = f", decay={self.decay}" if self.decay is not None else ""
        part = f", rotary_fraction={self.rotary_fraction}" if self.rotary_fraction != 1.0 else ""
        return f"where={self.where}, base={self.base}, scaling={self.scaling}, factor={self.factor}{decay}{part}"
