"""T5 relative position bias (Raffel et al. 2020): s_ij += β_h[bucket(j - i)].

Buckets: exact below half the buckets, log-spaced up to ``max_distance``, clipped at the last bucket.
Bidirectional (causal=False) gives keys behind and ahead of the query one half of the buckets each; one-sided
(causal) puts every key ahead into bucket 0.  ``BucketBias`` is this bias without its initialisation: TUPE
(``linrope.positions.tupe``) adds the same bias b beside its positional correlation (docs/schemes.md, "`t5`").
"""

from typing import List, Mapping, Optional

import torch
from torch import nn

from .base import InitStd, PositionScheme, Positive, register
from .functional import relative_distance, t5_bucket, t5_bucket_problem


class BucketBias(PositionScheme):
    """A per-head bias over T5's buckets of j - i (T5's β, TUPE's b): the bucket options, the buckets of the
    positions and the score bias, ``position_bias``, computed once per forward (``shared_bias``).  Not a scheme of
    its own."""

    kind = "relative"
    score_biases = ("bias",)  # β, b: not weight-decayed

    def __init__(
        self, *, num_buckets: Positive = 32, max_distance: Positive = 128, bidirectional: Optional[bool] = None, **dims
    ):
        super().__init__(**dims)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = (not self.causal) if bidirectional is None else bidirectional

    @classmethod
    def dims_problems(cls, options: Mapping, *, head_dim: int, max_len: int, causal: bool) -> List[str]:
        bidirectional = (not causal) if options.get("bidirectional") is None else options["bidirectional"]
        problem = t5_bucket_problem(
            bidirectional=bidirectional, num_buckets=options["num_buckets"], max_distance=options["max_distance"]
        )
        return [problem] if problem else []

    def bucket_table(self, std: float) -> nn.Parameter:
        """The (num_buckets, heads) bias, drawn at ``std``."""
        return nn.Parameter(torch.randn(self.num_buckets, self.n_heads) * std)

    def buckets(self, positions: torch.Tensor) -> torch.Tensor:
        return t5_bucket(
            relative_distance(positions),
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def position_bias(self, positions: torch.Tensor, dtype) -> torch.Tensor:
        """(1, H, N, N) for positions (N,); (B, H, N, N) for each row's own (B, N) (TUPE, packed documents)."""
        bias = self.bias.T[:, self.buckets(positions)]
        return (bias.unsqueeze(0) if positions.dim() == 1 else bias.movedim(1, 0)).to(dtype)

    def score_bias(self, q, k, positions):
        return self.shared_bias(positions, q.dtype)

    def extra_repr(self):
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )


@register
class T5Bias(BucketBias):
    name = "t5"
    linear_note = "adds a learned bias β_h[bucket(j-i)] to every score"
    paper = "Raffel et al. 2020, Exploring the limits of transfer learning with a unified text-to-text transformer"
    shares = "the bias table β (num_buckets × heads)"
    variants = ({"num_buckets": 8, "max_distance": 16},)  # log-spaced buckets within a short window
    differences_only = True

    def __init__(self, *, init_std: Optional[InitStd] = None, **options):
        super().__init__(**options)
        if self.owns_shared():
            self.bias = self.bucket_table(self.d_model**-0.5 if init_std is None else init_std)  # T5's init
