"""No position information (NoPE, Haviv et al. 2022): causal masking alone carries order (docs/schemes.md, "`none`")."""

from .base import PositionScheme, register


@register
class NoPosition(PositionScheme):
    name = "none"
    kind = "none"
    linear_ok = True
    paper = (
        "Haviv et al. 2022, Transformer language models without positional encodings still learn positional information"
    )
    differences_only = True
