"""Multiplicative absolute positions: x_i ⊙ p_i instead of x_i + p_i (no single paper).

* ``table: sinusoidal`` (default): p_i = 1 + scale · sinusoidal(i), entries in [1 - scale, 1 + scale];
* ``table: learned``: p_i = 1 + P[i], P trainable (max_len rows), starting at std ``init_std``.

(docs/schemes.md, "`multiplicative`")
"""

from typing import Literal, Mapping

import torch
from torch import nn

from .base import Base, InitStd, PositionScheme, register
from .functional import check_table_positions, sinusoidal_table

TABLES = ("sinusoidal", "learned")


@register
class Multiplicative(PositionScheme):
    name = "multiplicative"
    kind = "absolute"
    linear_ok = True
    tables = ("table",)  # with table: learned
    variants = ({"table": "learned"},)
    paper = "multiplicative counterpart of Vaswani et al. 2017's additive encoding (x_i ⊙ p_i)"

    def __init__(
        self,
        *,
        table: Literal[TABLES] = "sinusoidal",
        scale: float = 0.5,
        base: Base = 10000.0,
        init_std: InitStd = 0.1,
        **dims,
    ):
        super().__init__(**dims)
        self.table_kind, self.scale, self.base = table, scale, base
        if self.where == "input" and table == "learned":
            self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * init_std)

    @classmethod
    def bounded_by_max_len(cls, options: Mapping) -> bool:
        return options["table"] == "learned"

    def gate(self, positions: torch.Tensor, dim: int, dtype) -> torch.Tensor:
        """(N, D) multiplicative gate p_i."""
        if self.table_kind == "sinusoidal":
            return (1.0 + self.scale * sinusoidal_table(positions, dim, self.base)).to(dtype)
        check_table_positions(self.span(positions), self.max_len, "multiplicative", "use table: sinusoidal")
        return 1.0 + self.table[positions].to(dtype)

    def embed(self, x, positions):
        return x * self.gate(positions, x.shape[-1], x.dtype)

    def extra_repr(self):
        return f"where={self.where}, table={self.table_kind}, scale={self.scale}"
