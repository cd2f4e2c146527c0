"""Fixed sinusoidal absolute positions added at the input (Vaswani et al. 2017) (docs/schemes.md, "`sinusoidal`")."""

from .base import Base, PositionScheme, register
from .functional import sinusoidal_table


@register
class Sinusoidal(PositionScheme):
    name = "sinusoidal"
    kind = "absolute"
    linear_ok = True
    paper = "Vaswani et al. 2017, Attention is all you need"

    def __init__(self, *, base: Base = 10000.0, **dims):
        super().__init__(**dims)
        self.base = base

    def embed(self, x, positions):
        return x + sinusoidal_table(positions, x.shape[-1], self.base).to(x.dtype)
