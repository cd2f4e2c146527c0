"""What a model costs, counted from its config: parameters (counted on the meta device, so a 350M model costs no
memory) and model FLOPs per token, the numerator of model-FLOPs utilisation (docs/mathematics.md#model-flops).

Model FLOPs follow the convention of PaLM (Chowdhery et al. 2022, appendix B) and nanoGPT's MFU estimate: training
costs three forward passes (forward, and a backward of twice the work); a forward costs 2 FLOPs per weight that
multiplies an activation (every ``nn.Linear`` and convolution, the output head included, the embedding lookup not)
plus the attention's own products.  For softmax attention those are q·k and a·v over the T keys of a context of
T tokens, 2·2·T·d per layer and token — counted over every key, as the convention does, although a causal mask
lets an implementation skip half.  Linear attention's own products, in its recurrent form, are the state update
φ(k)ᵀv and the read φ(q)·S (and the normaliser's φ(k) sum and φ(q)·z): 2·2·D'·(d_h + 1) per head and token, D' the
feature width, whatever the context.  A window of W keys counts min(T, W) keys for softmax.  The chunked form
computes more than this (its intra-chunk block); MFU counts the model's arithmetic, not the kernel's.  Norms,
activations, biases, position terms and the loss are left out (a few per cent at the smallest sizes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Union

import torch
from torch import nn

from linrope.models.spec import ModelConfig
from linrope.ops.linear_attn.features import feature_width


@dataclass(frozen=True)
class Counts:
    """A model's parameters: ``total`` (each tensor once: a tied head is the embedding), ``embedding`` (the token
    embedding and any position table at the input), ``non_embedding`` = total − embedding, and ``matmul`` (the
    weights that multiply activations, the head counted even when tied: FLOPs' 2 per weight)."""

    total: int
    embedding: int
    non_embedding: int
    matmul: int


def _config(cfg: Union[ModelConfig, Mapping[str, Any]]) -> ModelConfig:
    return cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(dict(cfg))


def parameter_counts(cfg: Union[ModelConfig, Mapping[str, Any]]) -> Counts:
    """Build the model on the meta device (no memory, no initialisation cost) and count."""
    from linrope.models.model import TransformerLM

    with torch.device("meta"):
        model = TransformerLM(_config(cfg))
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel() + sum(p.numel() for p in model.pos.parameters())
    matmul = sum(
        m.weight.numel() for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d)) and m.weight is not None
    )
    return Counts(total=total, embedding=embedding, non_embedding=total - embedding, matmul=matmul)


def flops_per_token(cfg: Union[ModelConfig, Mapping[str, Any]], context: int) -> Dict[str, int]:
    """Training FLOPs per token at ``context`` tokens: {"weights": 6·matmul weights, "attention": 3 × the attention's
    own forward products, "total": their sum}."""
    cfg = _config(cfg)
    if context < 1:
        raise ValueError(f"flops_per_token: context must be >= 1, got {context}")
    weights = 6 * parameter_counts(cfg).matmul
    kind = cfg.attention.get("kind", "softmax")
    window = cfg.attention.get("window")
    if kind == "linear":
        width = feature_width(cfg.attention.get("feature_map", "elu"), cfg.head_dim)
        forward = cfg.n_layers * cfg.n_heads * 4 * width * (cfg.head_dim + 1)
    else:
        keys = min(context, window) if window else context
        forward = cfg.n_layers * 4 * keys * cfg.d_model
    attention = 3 * forward
    return {"weights": weights, "attention": attention, "total": weights + attention}


def human(n: float) -> str:
    """1.23 G, 456 M, 7.8 k: three significant figures."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}"
