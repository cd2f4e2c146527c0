"""Trainable absolute position table added at the input (GPT-2, BERT)."""
import torch
from torch import nn

from .base import PositionScheme, register


class SequenceTooLong(ValueError):
    pass


@register
class Learned(PositionScheme):
    name = "learned"
    kind = "absolute"
    linear_ok = True
    paper = "Gehring et al. 2017 (ConvS2S); Devlin et al. 2019 (BERT); Radford et al. 2019 (GPT-2)"

    def __init__(self, *, init_std: float = 0.02, **dims):
        super().__init__(**dims)
        if self.where == "input":
            self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * init_std)

    def embed(self, x, positions):
        top = int(positions.max()) if positions.numel() else -1
        if top >= self.max_len or (positions.numel() and int(positions.min()) < 0):
            raise SequenceTooLong(
                f"learned position table has {self.max_len} rows (positions 0..{self.max_len - 1}) but position "
                f"{top} was asked for; raise model max_len or use a relative scheme for longer sequences"
            )
        return x + self.table[positions].to(x.dtype)
