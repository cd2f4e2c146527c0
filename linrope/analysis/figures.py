"""Figures from the papers, recomputed: ``python -m linrope.analysis.figures --out DIR``.

(a) ``rope_decay.png`` — RoPE's long-term decay (RoFormer, Su et al. 2021, §3.4.3 and Figure 2).
    Writing the rotated product as a sum over the d/2 planes, Abel summation bounds it by
    ``max_j |h_{j+1} - h_j| · Σ_j |S_j|`` with ``S_j = Σ_{t<j} e^{i r θ_t}`` (r = m - n the relative
    distance, θ_t = base^(-2t/d)).  The figure is the relative upper bound
    ``(1/(d/2)) Σ_{j=1}^{d/2} |S_j|`` against r, for d = 128: at r = 0 every S_j = j, so the bound is
    ``(d/2 + 1) / 2`` (32.5 for d = 128), and it decays, with ripples, as r grows.
(b) ``sinusoidal_dot.png`` — the sinusoidal position vectors' dot product ``PE_t · PE_{t+k}``
    against the offset k: with ``PE_{t,2i} = sin(t ω_i)``, ``PE_{t,2i+1} = cos(t ω_i)``,
    ``ω_i = 10000^(-2i/D)``, it equals ``Σ_i cos(k ω_i)`` — symmetric in k, independent of t (D/2 at
    k = 0), and blind to the direction of the offset (Yan et al. 2019, TENER).

The computations are plain functions (``rope_decay_bound``, ``sinusoidal_dot``) so tests can
check them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from linrope.base.plots import pyplot, save
from linrope.config.command_line import program


def rope_thetas(d: int = 128, base: float = 10000.0) -> np.ndarray:
    """θ_t = base^(-2t/d), t = 0 … d/2-1."""
    return base ** (-2.0 * np.arange(d // 2) / d)


def rope_decay_bound(distances, d: int = 128, base: float = 10000.0) -> np.ndarray:
    """(1/(d/2)) Σ_{j=1}^{d/2} |S_j(r)| with S_j(r) = Σ_{t=0}^{j-1} e^{i r θ_t}, for each distance r."""
    r = np.asarray(distances, dtype=np.float64)
    phases = np.exp(1j * r[..., None] * rope_thetas(d, base))  # (..., d/2)
    partial = np.cumsum(phases, axis=-1)  # S_1 … S_{d/2}
    return np.abs(partial).mean(axis=-1)


def sinusoidal_dot(offsets, dim: int = 512, t: int = 0, base: float = 10000.0) -> np.ndarray:
    """PE_t · PE_{t+k} for each offset k, from the vectors themselves (pairs (sin, cos) of each
    frequency; the order of the features does not change a dot product); t + k may be negative."""
    k = np.asarray(offsets, dtype=np.float64)
    w = base ** (-2.0 * np.arange(dim // 2) / dim)
    a = np.concatenate([np.sin(t * w), np.cos(t * w)])
    b = np.concatenate([np.sin((t + k[..., None]) * w), np.cos((t + k[..., None]) * w)], axis=-1)
    return b @ a


def _figure(path: Path, xlabel: str, ylabel: str, title: str, curves, legend: bool = False) -> Path:
    """One 6 × 4 panel of ``curves`` ((x, y, plot keywords) each), saved at 120 dpi."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for x, y, kw in curves:
        ax.plot(x, y, **kw)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend()
    fig.tight_layout()
    return save(fig, path, dpi=120)


def plot_rope_decay(path: Path, d: int = 128, max_distance: int = 250) -> Path:
    r = np.arange(0, max_distance + 1)
    bound = r"relative upper bound $\frac{1}{d/2}\sum_j |S_j|$"
    title = f"RoPE long-term decay (d = {d}, θ_t = 10000^(−2t/d))"
    return _figure(path, "relative distance m − n", bound, title, [(r, rope_decay_bound(r, d), {})])


def plot_sinusoidal_dot(path: Path, dim: int = 512, max_offset: int = 500) -> Path:
    k = np.arange(-max_offset, max_offset + 1)
    curves = [
        (k, sinusoidal_dot(k, dim, t=t), {"linestyle": "-" if t == 0 else "--", "label": f"t = {t}"}) for t in (0, 100)
    ]
    title = f"sinusoidal positions: dot product against offset (D = {dim})"
    return _figure(path, "offset k", r"$PE_t \cdot PE_{t+k}$", title, curves, legend=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog=program("python -m linrope.analysis.figures"),
        description="Recompute two figures from the papers: RoPE's long-term decay "
        "(RoFormer Figure 2) and the sinusoidal PE_t·PE_{t+k} curve.",
    )
    p.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures)")
    p.add_argument("--d", type=int, default=128, help="RoPE head dimension (default 128, as the paper)")
    p.add_argument("--max-distance", type=int, default=250, help="largest relative distance (default 250)")
    p.add_argument("--dim", type=int, default=512, help="sinusoidal model dimension (default 512)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (
        plot_rope_decay(args.out / "rope_decay.png", args.d, args.max_distance),
        plot_sinusoidal_dot(args.out / "sinusoidal_dot.png", args.dim),
    ):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
