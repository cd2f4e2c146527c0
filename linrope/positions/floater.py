"""FLOATER (Liu, Yu, Dhillon, Hsieh 2020): positions from a continuous dynamical system.

    dp/dt = h_θ(p(t), t),   p(0) = p_0,   position i -> p(i·Δ)

h_θ is a small MLP, W2 tanh(W1 [p; t] + b1) + b2; p_0 and θ are trainable and the
gradients reach them by back-propagating through the solver (torchdiffeq
``odeint``).  ``inject: input`` (default) adds p at the input only, like sinusoidal
positions; ``inject: blocks`` adds it to the input of every block, as the paper does, with
the ODE (θ and p_0) shared by all blocks, the paper's parameter-sharing variant: one
solve per forward serves every block, no extra parameters.  One solve per forward, over the
sorted unique positions (0 prepended): a fixed-step solver (``rk4`` by default) steps
every ``step`` positions (default 1: one step per position, a solver node at every
sampled t; larger steps are cheaper but linearly interpolated in between); an adaptive
solver (``dopri5``) uses ``rtol``/``atol``.  Any length, no table; cost grows with
the largest position (O(max position) solver steps).  Nothing is cached.

Init: near a rotation.  With W1 = [A | B] and W2 ∝ [Bᵀ; -Aᵀ] (A, B Gaussian),
h(p) ≈ p W1 W2 ∝ p (ABᵀ - BAᵀ) for small pre-activations: a skew-symmetric linear
flow, whose solutions are sinusoids (the ODE behind the sinusoidal encoding), scaled
to turn at most about one radian per unit t (per 1/Δ positions).  So p(t) starts
bounded (rms ≈ 1, the size of a sinusoidal entry) and oscillating, with periods of
tens of positions and longer, instead of drifting off along a line (what a generic
MLP init does).
The time input's weights start at zero (autonomous at init) and are learned.
"""
import math

import torch
from torch import nn

from linrope.rope import compute_dtype

from .base import PositionScheme, register

INJECT = ("input", "blocks")
FIXED_GRID = ("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams")


@register
class Floater(PositionScheme):
    name = "floater"
    kind = "absolute"
    linear_ok = True
    paper = "Liu, Yu, Dhillon, Hsieh 2020, Learning to encode position for transformer with continuous dynamical model"

    def __init__(self, *, hidden: int = 64, delta: float = 0.1, method: str = "rk4", step: float = 1.0,
                 rtol: float = 1e-3, atol: float = 1e-4, inject: str = "input", **dims):
        super().__init__(**dims)
        if inject not in INJECT:
            raise ValueError(f"floater inject must be one of {', '.join(INJECT)}; got {inject!r}")
        self.inject = inject
        if delta <= 0 or step <= 0:
            raise ValueError(f"floater needs delta > 0 and step > 0; got delta={delta}, step={step}")
        if hidden < 2 or hidden % 2:
            raise ValueError(f"floater hidden width must be even and >= 2; got {hidden}")
        self.hidden, self.delta, self.method, self.step, self.rtol, self.atol = hidden, delta, method, step, rtol, atol
        if self.where == "input":
            dm = self.d_model
            a, b = torch.randn(2, dm, hidden // 2)
            self.p0 = nn.Parameter(torch.randn(dm))
            w1 = torch.cat([a, b], 1) / math.sqrt(dm)  # unit-variance pre-activations for a unit-scale p
            self.w1 = nn.Parameter(torch.cat([w1, torch.zeros(1, hidden)]))  # last row: the time input
            self.b1 = nn.Parameter(torch.zeros(hidden))
            # W1 W2 = (ABᵀ - BAᵀ) / (2 sqrt(D · hidden)): skew, spectral radius ≈ 1 (one radian per unit t)
            self.w2 = nn.Parameter(torch.cat([b.T, -a.T], 0) / (2 * math.sqrt(hidden)))
            self.b2 = nn.Parameter(torch.zeros(dm))

    def encodings(self, positions: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """(N, D) positions p(i·Δ), solved in ``dtype`` (float32, or float64 for float64 models)."""
        if positions.numel() and int(positions.min()) < 0:
            raise ValueError(f"floater positions must be >= 0; got {int(positions.min())}")
        uniq, inverse = torch.unique(positions, sorted=True, return_inverse=True)
        lead = int(uniq[0]) != 0
        if lead:
            uniq = torch.cat([uniq.new_zeros(1), uniq])
        w1, b1, w2, b2 = (p.to(dtype) for p in (self.w1, self.b1, self.w2, self.b2))

        def h(t, p):
            return torch.tanh(p @ w1[:-1] + t * w1[-1] + b1) @ w2 + b2

        p0 = self.p0.to(dtype)
        if uniq.numel() == 1:
            sol = p0[None]
        else:
            t = uniq.to(dtype) * self.delta
            options = dict(step_size=self.step * self.delta) if self.method in FIXED_GRID else None
            from torchdiffeq import odeint  # here, not at import: torchdiffeq imports scipy, which only FLOATER needs

            sol = odeint(h, p0, t, method=self.method, rtol=self.rtol, atol=self.atol, options=options)
        return sol[int(lead):][inverse]

    def _solved(self, positions, like: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(like.dtype)
        return self.memo((id(positions), dtype), lambda: self.encodings(positions, dtype)).to(like.dtype)

    def embed(self, x, positions):
        return x + self._solved(positions, x)

    def block_input(self, x, positions):
        return x + self._solved(positions, x) if self.inject == "blocks" else x

    def extra_repr(self):
        return (f"where={self.where}, hidden={self.hidden}, delta={self.delta}, method={self.method}, "
                f"step={self.step}, inject={self.inject}")
