"""The one small interface every position scheme implements (DESIGN.md §3, §5).

A scheme is one module holding one ``PositionScheme`` subclass, registered by
name.  The model builds it twice:

* ``where="input"`` — once, at the embedding: ``embed(x, positions)`` (absolute schemes);
* ``where="attention"`` — once per attention layer: the hooks on q/k, on the
  scores and on the values (relative schemes).

A scheme allocates parameters only for the role it is built for, so no layer
carries parameters it never uses.  Softmax attention calls, in order::

    q, k  = scheme.rotate_qk(q, k, positions)               # RoPE
    s     = scheme.score_scale(d) * q·k + scheme.score_bias(q, k, positions)
    o     = softmax(s) @ v + scheme.value_term(softmax(s), positions)

Linear attention never forms the score matrix; it asks only
``linear_rope_theta()`` (RoPE frequencies) and ``linear_decay()`` (per-head γ, the
decay form of ALiBi).  ``linear_ok`` says whether linear attention may take the
scheme at all; ``check_pairing`` refuses the rest when the config is composed.
"""
from __future__ import annotations

import math
from typing import Callable, ClassVar, Dict, Optional, Tuple, Type

import torch
from torch import nn

ROLES = ("input", "attention")


class PositionScheme(nn.Module):
    name: ClassVar[str] = "?"
    kind: ClassVar[str] = "none"  # "none" | "absolute" | "relative"
    linear_ok: ClassVar[bool] = False  # may linear attention take this scheme?
    linear_note: ClassVar[str] = ""  # why not / how (shown in errors and README)
    has_value_term: ClassVar[bool] = False  # needs the attention probabilities (no SDPA fast path)
    paper: ClassVar[str] = ""

    def __init__(self, *, where: str, d_model: int, n_heads: int, head_dim: int, max_len: int, causal: bool = True):
        super().__init__()
        if where not in ROLES:
            raise ValueError(f"position scheme role must be one of {ROLES}, got {where!r}")
        self.where, self.d_model, self.n_heads, self.head_dim = where, d_model, n_heads, head_dim
        self.max_len, self.causal = max_len, causal

    # ---- hook at the input (where == "input") -------------------------------------------------
    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, N, D) token embeddings; positions: (N,) integer positions."""
        return x

    # ---- hooks inside softmax attention (where == "attention") ---------------------------------
    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def score_bias(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        """Additive term on the scores, broadcastable to (B, H, N, N), already scaled; None for none."""
        return None

    def value_term(self, probs: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        """Extra output Σ_j a_ij · value_term_ij, (B, H, N, d); only when ``has_value_term``."""
        return None

    # ---- what linear attention may use ----------------------------------------------------------
    def linear_rope_theta(self) -> Optional[torch.Tensor]:
        return None

    def linear_decay(self) -> Optional[torch.Tensor]:
        return None

    def extra_repr(self) -> str:
        return f"where={self.where}"


REGISTRY: Dict[str, Type[PositionScheme]] = {}


def register(cls: Type[PositionScheme]) -> Type[PositionScheme]:
    if cls.name in REGISTRY:
        raise ValueError(f"position scheme {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def relative_distance(positions: torch.Tensor) -> torch.Tensor:
    """(N, N) matrix of ``j - i`` (key position minus query position), as in T5's code."""
    return positions[None, :] - positions[:, None]
