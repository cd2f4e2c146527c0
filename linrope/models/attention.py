"""Attention layers: softmax (torch SDPA, or explicit where a scheme needs the probabilities) and
kernelised linear attention (linrope.ops).  Both take a position scheme built for role "attention"."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, ClassVar, Dict, List, Mapping, NamedTuple, Optional

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import nn

from linrope.base.options import OneOf, Option, declared, defaults, option_errors
from linrope.ops import FEATURE_MAPS, IMPLS, PLACEMENTS, LinearAttentionState, linear_attention, recurrent_step
from linrope.ops.linear_attn.window import band
from linrope.positions import PositionScheme

# what the model passes every attention layer itself (not options of model.attention)
MODEL_ARGUMENTS = ("d_model", "n_heads", "position", "causal", "dropout")
OUTPUT_NORM_EPS = 1e-6  # the RMSNorm of each head's output of linear attention without a denominator


def causal_mask(n: int, device, dtype) -> torch.Tensor:
    """(N, N) additive mask: 0 on and below the diagonal, -inf above."""
    return torch.full((n, n), float("-inf"), device=device, dtype=dtype).triu(1)


def window_mask(n: int, window: int, device, dtype) -> torch.Tensor:
    """(N, N) additive mask of the context-limited control: 0 where i - window < j <= i, -inf elsewhere (causality
    included)."""
    return torch.zeros(n, n, device=device, dtype=dtype).masked_fill(~band(n, window, device), float("-inf"))


class Documents(NamedTuple):
    """Packed documents of a batch (docs/mathematics.md, "Packed documents"): ``ids`` (B, N), non-decreasing along a
    row, equal ids one document; ``positions`` (B, N), each position counted from its document's start
    (``document_positions``)."""

    ids: torch.Tensor
    positions: torch.Tensor


def document_positions(ids: torch.Tensor) -> torch.Tensor:
    """(B, N) ids -> (B, N) positions counted from each document's start (0 where the id changes)."""
    t = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return t - torch.where(starts, t, 0).cummax(1).values


def document_mask(ids: torch.Tensor, dtype) -> torch.Tensor:
    """(B, 1, N, N) additive mask: 0 where query and key are in one document, -inf elsewhere."""
    same = ids[:, :, None] == ids[:, None, :]
    return torch.zeros(same.shape, device=ids.device, dtype=dtype).masked_fill_(~same, float("-inf")).unsqueeze(1)


# the attention option of the context-limited control (both kinds): each query sees only its last `window` keys
Window = Annotated[Optional[int], Field(ge=1, description="null: every earlier key; else keys i - window < j <= i")]


def check_window(window: Optional[int], causal: bool) -> None:
    if window is not None and not causal:
        raise ValueError(f"model.attention.window={window} limits causal attention; this model has causal=false")


class _Projections(nn.Module):
    kind: ClassVar[str] = "?"

    @classmethod
    def rules(cls) -> Dict[str, Option]:
        """{option: Option} of ``model.attention`` this kind takes: its constructor's keyword arguments (each
        annotated with its type and range: the one declaration of them), less what the model passes itself."""
        return declared(cls, skip=MODEL_ARGUMENTS)

    @classmethod
    def options(cls) -> Dict[str, Any]:
        """{option: default} of ``model.attention`` this kind takes."""
        rules = cls.rules()
        return {k: v for k, v in defaults(cls).items() if k in rules}

    @classmethod
    def option_errors(cls, options: Mapping[str, Any], where: str = "model.attention") -> List[str]:
        """One line per option this kind does not take (naming the nearest it does) or whose value it refuses."""
        return option_errors(cls.rules(), options, where)

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def split(self, x):
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.n_heads)

    def merge(self, o):
        return self.out(rearrange(o, "b h n d -> b n (h d)"))


class SoftmaxAttention(_Projections):
    kind = "softmax"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        position: PositionScheme,
        *,
        causal: bool = True,
        dropout: float = 0.0,
        window: Window = None,
    ):
        super().__init__(d_model, n_heads)
        check_window(window, causal)
        self.pos, self.causal, self.dropout, self.window = position, causal, dropout, window

    def _mask(self, n: int, device, dtype) -> Optional[torch.Tensor]:
        """The additive mask of the scores: the window's band, else the causal mask (None: neither)."""
        if self.window is not None:
            return window_mask(n, self.window, device, dtype)
        return causal_mask(n, device, dtype) if self.causal else None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        state=None,
        return_state: bool = False,
        documents: Optional[Documents] = None,
    ):
        """Softmax attention keeps no recurrent state: generation re-reads the window (state is None).
        ``documents``: packed documents, no query sees another document's keys (``_packed``)."""
        if documents is not None:
            return self._packed(x, positions, documents), None
        q, k, v = self.split(x)
        q, k = self.pos.rotate_qk(q, k, positions)
        bias = self.pos.score_bias(q, k, positions)
        scale = self.pos.score_scale()
        p = self.dropout if self.training else 0.0
        if self.pos.has_value_term:
            o = self._explicit(q, k, v, bias, scale, positions, p)
        else:
            mask = bias
            if bias is not None and self.causal:
                mask = bias + self._mask(q.shape[-2], q.device, bias.dtype)
            elif self.window is not None:  # no bias: the band alone (SDPA is then not told is_causal)
                mask = self._mask(q.shape[-2], q.device, q.dtype)
            if mask is not None:  # SDPA takes the mask in the query's dtype: under bf16 autocast the float32
                mask = mask.to(q.dtype)  # bias is rounded here, by ~|bias|/256, the order of bf16's error on q·k
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=self.causal and mask is None, scale=scale
            )
        return self.merge(o), None

    def _packed(self, x: torch.Tensor, positions: torch.Tensor, documents: Documents) -> torch.Tensor:
        """Attention over packed documents: the block-diagonal mask of ``documents.ids`` added to the causal
        mask (or window) and the scheme's bias.  A scheme whose hooks read only i - j gets the row's positions
        0 … N-1 (inside a document they differ as the document's own do); one whose hooks read positions
        themselves (``absolute_terms``) gets each document's, ``documents.positions`` (B, N)."""
        if self.pos.absolute_terms:
            positions = documents.positions
        q, k, v = self.split(x)
        q, k = self.pos.rotate_qk(q, k, positions)
        bias = self.pos.score_bias(q, k, positions)
        scale = self.pos.score_scale()
        p = self.dropout if self.training else 0.0
        dtype = q.dtype if bias is None else bias.dtype
        mask = document_mask(documents.ids, dtype)
        if self.causal or self.window is not None:
            mask = mask + self._mask(q.shape[-2], q.device, dtype)
        if self.pos.has_value_term:
            o = self._explicit(q, k, v, bias, scale, positions, p, mask=mask)
        else:
            mask = mask if bias is None else mask + bias
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p, scale=scale)
        return self.merge(o)

    def _explicit(self, q, k, v, bias, scale, positions, p, mask=None):
        """The scores formed here (a scheme with a value term needs the probabilities); ``mask``: the whole
        additive mask (packed documents), else the causal one."""
        s = (q @ k.transpose(-1, -2)) * scale
        if bias is not None:
            s = s + bias
        if mask is not None:
            s = s + mask
        elif self.causal:
            s = s + self._mask(s.shape[-1], s.device, s.dtype)
        a = s.softmax(-1)
        a = F.dropout(a, p) if p else a  # the same (dropped) weights serve v_j and the value term
        extra = self.pos.value_term(a, positions)
        o = a @ v
        return o if extra is None else o + extra


class LinearAttention(_Projections):
    """Kernelised linear attention; RoPE enters through the op, ALiBi as a per-head decay.  ``impl`` (a backend
    of ``linrope.ops``' registry) runs whole sequences; a single-token step that carries a state (generation)
    runs the registered step operator, ``linrope.ops.recurrent_step``.

    The config names where RoPE goes ``placement`` (numerator | both | none); the kernel's keyword is ``rope``.
    ``kernel_options`` is the one place the first becomes the second: ``rope = placement`` when the position
    scheme supplies RoPE frequencies, else ``"none"`` whatever ``placement`` says.  ``window`` (both kinds): each
    query sees only its last ``window`` keys, the context-limited control (``attention_window``).

    ``normalize=False`` (the control of RetNet, GLA and TransNormer): the kernel drops the denominator and
    returns the numerator Σ_{j≤i} γ^(i-j) w^num_ij v_j, and the layer normalises each head's output with an
    RMSNorm over its d_v channels (eps 1e-6, a learned gain per channel shared by the heads, as GLA's, set
    to 1) before the output projection.  The norm is needed because without a denominator the output's scale
    grows with the number of keys summed (about linearly in the position without decay), so the next layer
    would see activations whose size depends on where a token sits; the norm puts each head's output back to
    unit RMS.  Without a denominator the placement "numerator" and "both" compute the same output.  The norm
    (``out_norm``) exists only with ``normalize=False``: the default layer keeps its parameters and
    checkpoints their state_dict keys."""

    kind = "linear"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        position: PositionScheme,
        *,
        causal: bool = True,
        feature_map: Annotated[str, OneOf(lambda: tuple(FEATURE_MAPS))] = "elu",
        placement: Annotated[str, OneOf(lambda: tuple(PLACEMENTS))] = "numerator",
        impl: Annotated[str, OneOf(lambda: tuple(sorted(IMPLS)))] = "chunk",
        chunk_size: Annotated[int, Field(ge=1)] = 64,
        eps: Annotated[float, Field(gt=0)] = 1e-6,
        normalize: bool = True,
        dropout: float = 0.0,
        window: Window = None,
    ):
        super().__init__(d_model, n_heads)
        check_window(window, causal)
        self.pos, self.causal, self.window = position, causal, window
        self.feature_map, self.placement, self.impl, self.chunk_size, self.eps = (
            feature_map,
            placement,
            impl,
            chunk_size,
            eps,
        )
        self.normalize = normalize
        if not normalize:  # created only here: the default layer's state_dict keys are unchanged
            self.out_norm = nn.RMSNorm(self.head_dim, eps=OUTPUT_NORM_EPS)

    def kernel_options(self) -> Dict[str, Any]:
        """The kernel's options of this layer (``linrope.ops.linear_attention``'s keywords but impl, positions
        and the state), read from the scheme at each call (the extrapolation may switch its RoPE scaling)."""
        theta = self.pos.linear_rope_theta()
        return dict(
            feature_map=self.feature_map,
            rope=self.placement if theta is not None else "none",
            eps=self.eps,
            decay=self.pos.linear_decay(),
            rope_theta=theta,
            normalize=self.normalize,
        )

    def merge(self, o):
        """The heads' outputs (B, H, N, d_v) through the output projection, each head RMS-normalised first
        when the kernel does not normalise (``normalize=False``).  The norm runs in its gain's precision at
        least: under bf16 autocast the kernel hands back bfloat16 (v's dtype), which the autocast projection
        then takes as it takes any float32 input."""
        if not self.normalize:
            o = self.out_norm(o.to(torch.promote_types(o.dtype, self.out_norm.weight.dtype)))
        return super().merge(o)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        state: Optional[LinearAttentionState] = None,
        return_state: bool = False,
        documents: Optional[Documents] = None,
    ):
        """``documents``: packed documents, the state reset at each boundary (``linrope.ops.linear_attention``'s
        ``documents``); RoPE rotates by the row's positions, relative in effect inside a document."""
        q, k, v = self.split(x)
        kw = self.kernel_options()
        if self.window is not None and (return_state or state is not None):
            raise ValueError(
                f"model.attention.window={self.window}: linear attention with a window carries no state "
                "(generation's recurrent step); use window=null to generate"
            )
        if x.shape[1] == 1 and (return_state or state is not None) and self.causal:
            # one token carrying a state (generation): the registered step operator, O(D'·d_v) per head
            o, new_state = recurrent_step(q, k, v, state, position=positions[0], **kw)
            return self.merge(o), new_state
        whole = dict(impl=self.impl, causal=self.causal, chunk_size=self.chunk_size, positions=positions)
        if self.window is not None:
            whole["window"] = self.window
        if documents is not None:
            whole["documents"] = documents.ids
        if not (return_state or state is not None):
            return self.merge(linear_attention(q, k, v, **whole, **kw)), None
        o, new_state = linear_attention(q, k, v, initial_state=state, output_final_state=True, **whole, **kw)
        return self.merge(o), new_state


ATTENTION = {"softmax": SoftmaxAttention, "linear": LinearAttention}


@contextlib.contextmanager
def attention_window(model: nn.Module, window: Optional[int]):
    """Inside the block every attention layer of ``model`` sees only its last ``window`` keys (None: all keys);
    after it, each has its own ``window`` again.  The context-limited control of the extrapolation: a model
    trained without a window scored at longer lengths with attention limited to its training context."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention_window: window must be an integer >= 1 or None; got {window!r}")
    layers = [m for m in model.modules() if isinstance(m, _Projections)]
    if not layers:
        raise ValueError(f"attention_window: {type(model).__name__} has no attention layer")
    for layer in layers:
        check_window(window, layer.causal)
    saved = [layer.window for layer in layers]
    try:
        for layer in layers:
            layer.window = window
        yield model
    finally:
        for layer, old in zip(layers, saved):
            layer.window = old
