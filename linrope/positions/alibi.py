"""ALiBi (Press, Smith, Lewis 2022): s_ij -= m_h·|i - j|, the paper's slopes m_h, no parameters.

Under a causal mask |i - j| = i - j, so one formula serves encoders and decoders.  Linear attention takes it as
the per-head decay γ_h^(i-j), γ_h = exp(-m_h): the same weight exp(-m_h (i-j)) moved from the scores onto the
kernel weights.  Slopes and bias in float64, rounded once (docs/schemes.md, "`alibi`").
"""

import torch

from linrope.ops.rope import compute_dtype

from .base import PositionScheme, register
from .functional import alibi_slopes, distance_bias


@register
class ALiBi(PositionScheme):
    name = "alibi"
    kind = "relative"
    linear_ok = True
    linear_note = "as the per-head decay γ_h^(i-j), γ_h = exp(-m_h), on the kernel weights"
    paper = (
        "Press, Smith, Lewis 2022, Train short, test long: attention with linear biases enables input length "
        "extrapolation"
    )
    differences_only = True
    decays = True

    def __init__(self, **dims):
        super().__init__(**dims)
        # float64, never rounded to the model's dtype: each use rounds the finished bias once
        self.float64_buffer("slopes", alibi_slopes(self.n_heads))
        # linear attention's decay γ_h = exp(-m_h), formed once here (not on every forward) and moved with the
        # module; in (0, 1) since every slope is positive
        self.float64_buffer("gamma", torch.exp(-self.slopes))

    def score_bias(self, q, k, positions):
        """-m_h·|i - j| computed in float64 and rounded once: to float64 for float64 scores, else to float32.
        (Softmax attention hands SDPA the mask in the query's dtype, so under bf16/fp16 autocast it is rounded
        once more there; see linrope/models/attention.py.)"""
        return distance_bias(self.slopes, positions, compute_dtype(q.dtype))  # (1, H, N, N)

    def linear_decay(self):
        return self.gamma
