"""Bidirectional linear attention over packed documents (``causal=False`` with ``documents``): each query sees every
key of its own document, on both sides, and none of another's::

    o_i = Σ_{j ∈ doc(i)} γ^|i-j| w^num_ij v_j / (Σ_{j ∈ doc(i)} γ^|i-j| w^den_ij + eps)

The forms that reset their state at a document's start are causal; this is two of their passes, in whatever form
``impl`` names: the row as given (keys at or behind each query) and the row reversed (keys at or ahead), its ids
negated so that they still do not decrease, its positions reversed with it, so that RoPE turns by the same
differences and the decay counts the same distances.  Each pass counts the query's own key once: it is subtracted
once, w_ii = φ(q_i)·φ(k_i) (a rotation by one angle keeps a dot product).  Numerator and denominator are summed apart
(``normalize=False`` passes; the denominator as the numerator of v = 1 in the denominator's placement) and divided
as the forms divide (``guard_denominator``).  The naive form computes the same sums directly (its mask without the
causal triangle): the reference the tests hold this to.  Its use: a bidirectional encoder's key-padding mask (the
padding a document of its own, linrope.models.model).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from linrope.ops.rope import compute_dtype

from .common import Args, guard_denominator
from .features import reference_features

# the placement whose numerator is the denominator of each placement: RoPE in the numerator leaves the denominator
# unrotated
DENOMINATOR = {"numerator": "none", "both": "both", "none": "none"}


def both_ways(q: Tensor, k: Tensor, v: Tensor, a: Args, causal_call: Callable[..., Tensor]) -> Tensor:
    """``a`` (checked, ``causal=False``, ``documents`` given) -> (B, H, N, d_v); ``causal_call(q, k, v, **options)``
    runs one causal pass (``linear_attention`` with the caller's impl)."""
    dtype = compute_dtype(q.dtype)  # the passes' sums kept at the forms' precision, divided once
    q, k, vv = q.to(dtype), k.to(dtype), v.to(dtype)
    n = q.shape[2]
    positions = a.positions if a.positions is not None else torch.arange(n, device=q.device)
    reversed_ids = (-a.documents).flip(1)
    options = dict(feature_map=a.feature_map, decay=a.decay, rope_theta=a.rope_theta, normalize=False, causal=True)

    def passes(values: Tensor, rope: str) -> Tensor:
        ahead = causal_call(q, k, values, rope=rope, positions=positions, documents=a.documents, **options)
        behind = causal_call(q.flip(2), k.flip(2), values.flip(2), rope=rope, positions=positions.flip(0),
                             documents=reversed_ids, **options)  # fmt: skip
        return ahead + behind.flip(2)

    q_num, k_num, q_den, k_den = reference_features(
        q, k, feature_map=a.feature_map, rope=a.rope, positions=a.positions, theta=a.rope_theta, dtype=dtype
    )
    num = passes(vv, a.rope) - (q_num * k_num).sum(-1, keepdim=True) * vv
    if not a.normalize:
        return num.to(v.dtype)
    ones = vv.new_ones(vv.shape[:-1] + (1,))
    den = passes(ones, DENOMINATOR[a.rope])[..., 0] - (q_den * k_den).sum(-1)
    return (num / guard_denominator(den + a.eps, a.rope).unsqueeze(-1)).to(v.dtype)
