"""Layer 1, operators (may import: linrope.base). Attention operators and RoPE's rotation.  ``linear_attention`` checks its arguments once (``Args``), picks a backend from the
registry (``linear_attn/backends.py``: naive, chunk, recurrent, fla, triton, auto), which says what it supports, and
runs it.  ``recurrent_step`` is the generation step (the registered operator ``linrope::recurrent_step``)."""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .linear_attn.backends import BACKENDS, resolve
from .linear_attn.both_ways import both_ways
from .linear_attn.common import PLACEMENTS, Args, LinearAttentionState
from .linear_attn.features import FEATURE_MAPS
from .linear_attn.recurrent import recurrent_step

IMPLS = tuple(BACKENDS)  # the allowed values of ``impl`` (and of model.attention.impl)


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
    window: Optional[int] = None,
    normalize: bool = True,
    documents: Optional[torch.Tensor] = None,
):
    """Kernelised linear attention with RoPE placed in the numerator, both, or nowhere.

    q, k: (B, H, N, d); v: (B, H, N, d_v) -> (B, H, N, d_v)  [and the final state if asked].
    ``decay``: optional per-head γ_h in (0, 1] multiplying the weights by γ_h^(i-j).
    ``rope_theta``: RoPE frequencies (default base 10000; see ``linrope.ops.rope.rope_frequencies``).
    ``initial_state`` / ``output_final_state``: carry (S, z) across pieces of a causal sequence.
    ``impl``: a name of the registry (``IMPLS``); ``chunk_size`` is the chunk kernel's.
    ``window``: each query sees only its last ``window`` keys (i - window < j <= i; causal, no state).
    ``documents`` (B, N): ids of packed documents, non-decreasing along a row: no query sees another document's keys
    (causal: the state resets at each start; ``causal=False``: its document's keys on both sides).
    ``normalize=False``: no denominator, the output is the numerator Σ_{j≤i} γ^(i-j) w^num_ij v_j alone (eps
    unused; RetNet, GLA and TransNormer normalise the output instead, as ``LinearAttention(normalize=False)``
    does); the state keeps its shape, z carried as before.
    """
    a = Args(
        feature_map,
        rope,
        causal,
        chunk_size,
        positions,
        eps,
        decay,
        rope_theta,
        initial_state,
        output_final_state,
        window,
        normalize,
        documents,
    ).checked(q, k, v)
    if a.documents is not None and not a.causal and impl != "naive":  # two causal passes of this impl
        return both_ways(q, k, v, a, functools.partial(linear_attention, impl=impl, chunk_size=chunk_size, eps=eps))
    return resolve(impl, q, a).run(q, k, v, a)


def _form(impl: str):
    """``linear_attention`` with ``impl`` fixed: the forms by name, for tests and benchmarks."""
    fn = functools.partial(linear_attention, impl=impl)
    functools.update_wrapper(fn, linear_attention)
    fn.__name__ = fn.__qualname__ = f"{impl}_linear_attention"
    return fn


naive_linear_attention = _form("naive")
chunk_linear_attention = _form("chunk")
recurrent_linear_attention = _form("recurrent")
fla_linear_attention = _form("fla")

__all__ = [
    "linear_attention",
    "recurrent_step",
    "LinearAttentionState",
    "FEATURE_MAPS",
    "PLACEMENTS",
    "IMPLS",
    "BACKENDS",
    "naive_linear_attention",
    "chunk_linear_attention",
    "recurrent_linear_attention",
    "fla_linear_attention",
]
