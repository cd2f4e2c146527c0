"""No position information (NoPE): causal masking alone carries order."""

from typing import Mapping

from .base import PositionScheme, register


@register
class NoPosition(PositionScheme):
    name = "none"
    kind = "none"
    linear_ok = True
    paper = (
        "Haviv et al. 2022, Transformer language models without positional encodings still learn positional information"
    )

    @classmethod
    def shift_invariant(cls, options: Mapping) -> bool:
        return True

    def __init__(self, **dims):
        super().__init__(**dims)
