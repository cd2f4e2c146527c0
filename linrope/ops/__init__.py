"""Attention operators.  ``linear_attention`` dispatches to the naive / chunk / recurrent forms, to fla's
kernels (``fla``, CUDA and the ``gpu`` extra), or to whichever of fla and chunk can run (``auto``)."""
from __future__ import annotations

from typing import Optional

import torch

from .linear_attn.common import FEATURE_MAPS, PLACEMENTS, LinearAttentionState, check_args
from .linear_attn.chunk import chunk_linear_attention
from .linear_attn.fla_backend import auto_linear_attention, fla_linear_attention
from .linear_attn.naive import naive_linear_attention
from .linear_attn.recurrent import recurrent_linear_attention

IMPLS = {"naive": naive_linear_attention, "chunk": chunk_linear_attention, "recurrent": recurrent_linear_attention,
         "fla": fla_linear_attention, "auto": auto_linear_attention}


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: str = "elu",
    rope: str = "numerator",
    causal: bool = True,
    impl: str = "chunk",
    chunk_size: int = 64,
    positions: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    decay: Optional[torch.Tensor] = None,
    rope_theta: Optional[torch.Tensor] = None,
    initial_state: Optional[LinearAttentionState] = None,
    output_final_state: bool = False,
):
    """Kernelised linear attention with RoPE placed in the numerator, both, or nowhere.

    q, k: (B, H, N, d); v: (B, H, N, d_v) -> (B, H, N, d_v)  [and the final state if asked].
    ``decay``: optional per-head γ_h in (0, 1] multiplying the weights by γ_h^(i-j).
    ``rope_theta``: RoPE frequencies (default base 10000; see ``linrope.rope.rope_frequencies``).
    ``initial_state`` / ``output_final_state``: carry (S, z) across pieces of a causal sequence.
    """
    check_args(q, k, v, feature_map, rope, impl, chunk_size)
    if impl not in IMPLS:
        raise ValueError(f"unknown linear attention impl {impl!r}; available: {', '.join(IMPLS)}")
    kwargs = dict(feature_map=feature_map, rope=rope, causal=causal, positions=positions, eps=eps, decay=decay,
                  rope_theta=rope_theta, initial_state=initial_state, output_final_state=output_final_state)
    if impl in ("chunk", "auto"):
        kwargs["chunk_size"] = int(chunk_size)
    return IMPLS[impl](q, k, v, **kwargs)


__all__ = ["linear_attention", "LinearAttentionState", "FEATURE_MAPS", "PLACEMENTS", "IMPLS"]
