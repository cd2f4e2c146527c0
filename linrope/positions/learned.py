"""Trainable absolute position table added at the input (Gehring et al. 2017; BERT; GPT-2): x_i + P[i].

The table starts at std 0.02·sqrt(d_model) (``init_std: null``), the size of the token term, which the model
scales by sqrt(d_model): BERT's position/token ratio of 1 (docs/schemes.md, "`learned`").
"""

import math
from typing import Optional

import torch
from torch import nn

from .base import InitStd, PositionScheme, register
from .functional import check_table_positions


@register
class Learned(PositionScheme):
    name = "learned"
    kind = "absolute"
    linear_ok = True
    tables = ("table",)
    paper = "Gehring et al. 2017 (ConvS2S); Devlin et al. 2019 (BERT); Radford et al. 2019 (GPT-2)"
    max_len_table = True

    def __init__(self, *, init_std: Optional[InitStd] = None, **dims):
        super().__init__(**dims)
        # the token term's std: the model's 0.02 embedding init times its sqrt(d_model) embed scale
        self.init_std = 0.02 * math.sqrt(self.d_model) if init_std is None else init_std
        if self.where == "input":
            self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * self.init_std)

    def embed(self, x, positions):
        check_table_positions(self.span(positions), self.max_len, "learned")
        return x + self.table[positions].to(x.dtype)
