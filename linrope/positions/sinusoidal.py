"""Fixed sinusoidal absolute positions added at the input (Vaswani et al. 2017)."""
import torch

from .base import PositionScheme, register


def sinusoidal_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """p_{i,2t} = sin(i / base^(2t/D)), p_{i,2t+1} = cos(i / base^(2t/D)); (N, D) float32, computed in float64."""
    t = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64)[:, None] / base ** (t / dim)
    table = torch.zeros(positions.shape[0], dim, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()[:, : dim // 2]
    return table.float()


@register
class Sinusoidal(PositionScheme):
    name = "sinusoidal"
    kind = "absolute"
    linear_ok = True
    paper = "Vaswani et al. 2017, Attention is all you need"

    def __init__(self, *, base: float = 10000.0, **dims):
        super().__init__(**dims)
        self.base = base

    def embed(self, x, positions):
        return x + sinusoidal_table(positions, x.shape[-1], self.base).to(x.dtype)
