"""FLOATER (Liu, Yu, Dhillon, Hsieh 2020): positions from a continuous dynamical system::

    dp/dt = h_θ(p(t), t) = W2 tanh(W1 [p; t] + b1) + b2,   p(0) = p_0,   position i -> p(i·Δ)

One solve per forward over the times 0, Δ, …, (largest position)·Δ, then picked by position.  The fixed-step
solvers (``SYNC_FREE``) are solved here (``fixed_grid``, torchdiffeq's steps bit for bit) from the host-known
span, without reading the device; the others go through torchdiffeq's ``odeint``.

Init near a rotation: with W1 = [A | B] and W2 ∝ [Bᵀ; -Aᵀ] (A, B Gaussian), h(p) ≈ p W1 W2 ∝ p (ABᵀ - BAᵀ)
for small pre-activations, a skew-symmetric linear flow whose solutions are sinusoids, scaled to turn at most
about one radian per unit t; the time input's weights start at zero (docs/schemes.md, "`floater`").
"""

import math
import struct
from typing import Annotated, List, Literal, Mapping

import torch
from pydantic import Field
from torch import nn

from linrope.ops.linear_attn.common import autocast_off
from linrope.ops.rope import compute_dtype

from .base import PositionScheme, register

INJECT = ("input", "blocks")
FIXED_GRID = ("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams")
SYNC_FREE = ("euler", "midpoint", "rk4")  # solved here (fixed_grid), step for step as torchdiffeq does
# torchdiffeq's solvers (but its scipy_solver, which needs options of its own): the adaptive ones, then the fixed-grid
METHODS = ("dopri8", "dopri5", "bosh3", "fehlberg2", "adaptive_heun", *FIXED_GRID, "fixed_adams")


def _float(dtype):
    """Rounds a Python float to ``dtype`` (float32 or float64): the host's copy of a time on the device.  A
    product, quotient or sum of two float32 values formed in float64 and rounded once to float32 is the
    correctly rounded float32 result, what the device computes."""
    if dtype == torch.float64:
        return float
    return lambda x: struct.unpack("f", struct.pack("f", x))[0]


def fixed_grid(h, y0: torch.Tensor, t: torch.Tensor, delta: float, method: str, step_size: float) -> torch.Tensor:
    """torchdiffeq's fixed-grid ``odeint(h, y0, t, method=method, options=dict(step_size=step_size))`` for the
    times t = (0, 1, 2, …)·``delta`` (a tensor) without its host reads: the grid's length and which output falls
    into which step come from the times as the host computes them (``_float``: equal to the device's), and
    every value is formed on the device by torchdiffeq's operations in its order, so the result and its
    gradients are torchdiffeq's, bit for bit.  Returns (len(t), *y0.shape)."""
    r = _float(t.dtype)
    times = [r(float(i) * r(delta)) for i in range(len(t))]  # t on the host
    niters = int(math.ceil(r(r(times[-1] / r(step_size)) + 1.0)))  # torchdiffeq: ceil((t[-1] - t[0]) / h + 1)
    grid_host = [r(float(k) * r(step_size)) for k in range(niters - 1)] + [times[-1]]
    grid = torch.arange(0, niters, dtype=t.dtype, device=t.device) * step_size + t[0]
    grid[-1] = t[-1]
    solution = torch.empty(len(t), *y0.shape, dtype=y0.dtype, device=y0.device)
    solution[0] = y0
    j = 1
    for k, (t0, t1) in enumerate(zip(grid[:-1], grid[1:])):
        dt = t1 - t0
        f0 = h(t0, y0)
        if method == "euler":
            dy = dt * f0
        elif method == "midpoint":
            half_dt = 0.5 * dt
            dy = dt * h(t0 + half_dt, y0 + f0 * half_dt)
        else:  # rk4: torchdiffeq's rk4_alt_step_func (the 3/8 rule)
            k2 = h(t0 + dt * (1 / 3), y0 + dt * f0 * (1 / 3))
            k3 = h(t0 + dt * (2 / 3), y0 + dt * (k2 - f0 * (1 / 3)))
            k4 = h(t1, y0 + dt * (f0 - k2 + k3))
            dy = (f0 + 3 * (k2 + k3) + k4) * dt * 0.125
        y1 = y0 + dy
        while j < len(t) and grid_host[k + 1] >= times[j]:  # torchdiffeq's linear interpolation
            if times[j] == grid_host[k]:
                solution[j] = y0
            elif times[j] == grid_host[k + 1]:
                solution[j] = y1
            else:
                solution[j] = y0 + (t[j] - t0) / (t1 - t0) * (y1 - y0)
            j += 1
        y0 = y1
    return solution


@register
class Floater(PositionScheme):
    name = "floater"
    kind = "absolute"
    linear_ok = True
    paper = "Liu, Yu, Dhillon, Hsieh 2020, Learning to encode position for transformer with continuous dynamical model"
    variants = ({"inject": "blocks"},)

    def __init__(
        self,
        *,
        hidden: Annotated[int, Field(ge=2, description="even")] = 64,
        delta: Annotated[float, Field(gt=0)] = 0.1,
        method: Literal[METHODS] = "rk4",
        step: Annotated[float, Field(gt=0)] = 1.0,
        rtol: Annotated[float, Field(gt=0)] = 1e-3,
        atol: Annotated[float, Field(gt=0)] = 1e-4,
        inject: Literal[INJECT] = "input",
        **dims,
    ):
        super().__init__(**dims)
        self.inject = inject
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

    @classmethod
    def option_problems(cls, options: Mapping) -> List[str]:
        hidden = options["hidden"]
        return super().option_problems(options) + (
            [f"floater hidden width must be even; got {hidden}"] if hidden % 2 else []
        )

    def encodings(self, positions: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """(N, D) positions p(i·Δ), solved in ``dtype`` (float32, or float64 for float64 models), over every
        time 0, Δ, …, last·Δ (the solver passes them all anyway) and picked by position: the grid comes from
        the positions' span, known on the host, so nothing is read back from the device (no ``torch.unique``)."""
        first, last = self.span(positions)
        if first < 0:
            raise ValueError(f"floater positions must be >= 0; got {first}")
        w1, b1, w2, b2 = (p.to(dtype) for p in (self.w1, self.b1, self.w2, self.b2))

        def h(t, p):
            return torch.tanh(p @ w1[:-1] + t * w1[-1] + b1) @ w2 + b2

        p0 = self.p0.to(dtype)
        with autocast_off(positions.device.type):  # solved in ``dtype``: autocast's bf16 would drift (4.4 at 1023)
            return self._solve(h, p0, positions, last, dtype)

    def _solve(self, h, p0: torch.Tensor, positions: torch.Tensor, last: int, dtype) -> torch.Tensor:
        if last <= 0:
            sol = p0[None]
        else:
            t = torch.arange(last + 1, device=positions.device).to(dtype) * self.delta
            if self.method in SYNC_FREE:
                sol = fixed_grid(h, p0, t, self.delta, self.method, self.step * self.delta)
            else:  # adaptive (and the Adams) solvers: torchdiffeq, which reads its error estimates on the host
                from torchdiffeq import (
                    odeint,  # here, not at import: torchdiffeq imports scipy, which only FLOATER needs
                )

                options = dict(step_size=self.step * self.delta) if self.method in FIXED_GRID else None
                sol = odeint(h, p0, t, method=self.method, rtol=self.rtol, atol=self.atol, options=options)
        return sol[positions]

    def _solved(self, positions, like: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(like.dtype)
        return self.memo((id(positions), dtype), lambda: self.encodings(positions, dtype)).to(like.dtype)

    def embed(self, x, positions):
        return x + self._solved(positions, x)

    def block_input(self, x, positions):
        return x + self._solved(positions, x) if self.inject == "blocks" else x

    def extra_repr(self):
        return (
            f"where={self.where}, hidden={self.hidden}, delta={self.delta}, method={self.method}, "
            f"step={self.step}, inject={self.inject}"
        )
