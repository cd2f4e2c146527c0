"""A decoder-only (or, with causal=False, encoder) Transformer whose attention and position
scheme are chosen by config.  Reads top to bottom: config -> block -> model -> generation."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from linrope.models.attention import ATTENTION, Documents, document_positions
from linrope.models.spec import ModelConfig  # what a model is: its checks, identity and names (linrope.models.spec)
from linrope.positions import PositionScheme, build_position, build_shared


def split_options(spec: Dict[str, Any], key: str):
    """{'name': x, **options} -> (x, options)."""
    spec = dict(spec)
    return spec.pop(key), spec


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.up, self.down, self.drop = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.down(F.gelu(self.up(x))))


class ShortConv(nn.Module):
    """Depthwise convolution over time, ``h + conv(h)``: causal (position i sees i-k+1 … i) for a decoder,
    centred for an encoder.  Carries the last k-1 inputs as its state, so generation token by token gives
    what the whole sequence gives."""

    def __init__(self, d_model: int, kernel: int, causal: bool):
        super().__init__()
        self.kernel, self.causal = kernel, causal
        self.conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model)

    def forward(self, h, tail: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None):
        """h: (B, N, D); tail: (B, k-1, D) the inputs before h (None: zeros) -> (h + conv(h), new tail).
        ``documents`` (B, N) ids: each output sees only inputs of its own document (no tail)."""
        k = self.kernel
        if documents is not None:
            return self._packed(h, documents), None
        if not self.causal:
            padded = F.pad(h.transpose(1, 2), ((k - 1) // 2, k // 2))
            return h + self.conv(padded).transpose(1, 2), None
        before = h.new_zeros(h.shape[0], k - 1, h.shape[2]) if tail is None else tail.to(h.dtype)
        seq = torch.cat([before, h], dim=1)
        return h + self.conv(seq.transpose(1, 2)).transpose(1, 2), seq[:, seq.shape[1] - (k - 1) :]

    def _packed(self, h, documents):
        """The convolution with every tap that reaches into another document set to zero: the k inputs of each
        output unfolded, masked by id, and weighed."""
        k = self.kernel
        left, right = (k - 1, 0) if self.causal else ((k - 1) // 2, k // 2)
        taps = F.pad(h.transpose(1, 2), (left, right)).unfold(2, k, 1)  # (B, D, N, k)
        ids = torch.cat([documents[:, :1].expand(-1, left), documents, documents[:, -1:].expand(-1, right)], 1)
        same = ids.unfold(1, k, 1) == documents[:, :, None]  # (B, N, k); padding is zeros whatever its id
        out = torch.einsum("bdnk,dk->bnd", taps * same[:, None].to(h.dtype), self.conv.weight[:, 0].to(h.dtype))
        return h + out + self.conv.bias.to(h.dtype)


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)) (with ``short_conv``: x + attn(c(ln(x))), c a short convolution over
    time), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig, shared_position=None):
        super().__init__()
        kind, attn_opts = split_options(cfg.attention, "kind")
        pos_name, pos_opts = split_options(cfg.position, "name")
        position = build_position(
            pos_name, where="attention", shared=shared_position, **cfg.position_dims(), **pos_opts
        )
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = ATTENTION[kind](
            cfg.d_model, cfg.n_heads, position, causal=cfg.causal, dropout=cfg.dropout, **attn_opts
        )
        self.mlp = MLP(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.short = ShortConv(cfg.d_model, cfg.short_conv, cfg.causal) if cfg.short_conv else None

    def forward(self, x, positions, state=None, return_state=False, documents: Optional[Documents] = None):
        h = self.ln1(x)
        packed = {} if documents is None else {"documents": documents}
        if self.short is None:
            a, state = self.attn(h, positions, state=state, return_state=return_state, **packed)
        else:  # the state: (attention's, the convolution's last inputs)
            h, tail = self.short(h, None if state is None else state[1], None if documents is None else documents.ids)
            a, s = self.attn(
                h, positions, state=None if state is None else state[0], return_state=return_state, **packed
            )
            state = (s, tail) if return_state else None
        x = x + a
        return x + self.mlp(self.ln2(x)), state


class TransformerLM(nn.Module):
    def __init__(self, cfg: Union[ModelConfig, Dict[str, Any]]):
        super().__init__()
        cfg = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(dict(cfg))
        cfg.check()  # options, pairing, dimensions: one line per problem (ConfigError)
        self.cfg = cfg
        pos_name, pos_opts = split_options(cfg.position, "name")
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_scale = math.sqrt(cfg.d_model)  # token and additive position signals of like size
        self.pos = build_position(pos_name, where="input", **cfg.position_dims(), **pos_opts)
        # what the scheme's paper shares across layers (T5's bias table, DeBERTa's P, TUPE's correlation):
        # built once here and handed to every layer; None when nothing is shared (or share: false)
        self.pos_shared = build_shared(pos_name, **cfg.position_dims(), **pos_opts)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, self.pos_shared) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        if cfg.n_classes:
            self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        else:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tie_weights:
                self.head.weight = self.embed.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("attn.out.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        positions: Optional[torch.Tensor] = None,
        *,
        offset: int = 0,
        states: Optional[List] = None,
        return_states: bool = False,
        mask: Optional[torch.Tensor] = None,
        documents: Optional[torch.Tensor] = None,
    ):
        """idx: (B, N) token ids -> logits (B, N, V), or (B, n_classes) for a classifier.

        ``positions`` (N,) or ``offset`` (positions offset…offset+N-1) place the window in a longer
        sequence; with randomized positions (``model.position.max_position``) the positions are drawn here, once
        for the input and every layer; ``states`` continue linear attention from an earlier call (generation).
        ``mask`` (B, N) marks real tokens: the classifier pools them alone, and in a forward of a whole sequence (no
        positions, offset or states) each run of real tokens or of padding is a document of its own, so no token
        attends to the padding and the output does not depend on how much padding follows or leads (LRA's encoders
        mask it; a hole in a row's real tokens parts them as well); with randomized positions, which documents cannot
        take, pooling only.
        ``documents`` (B, N) document ids of packed sequences (non-decreasing along a row): no document sees
        another, every position scheme counts from each document's start, linear attention's state resets at
        each boundary (docs/mathematics.md, "Packed documents"); None: one sequence per row."""
        n = idx.shape[1]
        span = None  # explicit positions: a scheme that needs their span reads it (PositionScheme.span)
        packed = None
        whole = positions is None and not offset and states is None and not return_states
        if mask is not None and documents is None and whole and self.pos.max_position is None:
            runs = (mask[:, 1:] != mask[:, :-1]).long().cumsum(1)  # a new id where real tokens and padding meet
            documents = torch.cat((torch.zeros_like(runs[:, :1]), runs), dim=1)
        if documents is not None:
            if self.pos.max_position is not None:
                raise ValueError(
                    f"documents: packed documents count positions from each document's start, and randomized "
                    f"positions (model.position.max_position={self.pos.max_position}) draw them per forward; "
                    "the two are not combined"
                )
            packed = self._documents(idx, documents, positions, offset, states, return_states)
        if positions is None:  # offset … offset+n-1, or drawn (randomized positions): once, for every scheme
            positions, span = self.pos.place(n, offset, idx.device, continuing=states is not None)
        at_input = positions if packed is None else packed.positions  # absolute schemes: from each document's start
        new_states = []
        schemes = [m for m in self.modules() if isinstance(m, PositionScheme)]  # every role, every layer
        for scheme in schemes:
            scheme.open_memo(span)
        try:
            x = self.drop(self.pos.embed(self.embed(idx) * self.embed_scale, at_input))
            for i, block in enumerate(self.blocks):
                x = self.pos.block_input(x, at_input) if i else x
                state = None if states is None else states[i]
                if packed is None:
                    x, s = block(x, positions, state=state, return_state=return_states)
                else:
                    x, s = block(x, positions, documents=packed)
                new_states.append(s)
        finally:
            for scheme in schemes:
                scheme.close_memo()
        x = self.ln_f(x)
        if self.cfg.n_classes:
            if mask is None:
                pooled = x.mean(1)
            else:
                m = mask.to(x.dtype).unsqueeze(-1)
                pooled = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
            out = self.head(pooled)
        else:
            out = self.head(x)
        return (out, new_states) if return_states else out

    @staticmethod
    def _documents(idx, documents, positions, offset, states, return_states) -> Documents:
        """``documents`` checked (one line each) -> the ids and each position counted from its document's start.
        Whether ids are non-decreasing is read on the CPU only; elsewhere it is queued as an assertion (no host
        sync, docs/mathematics.md#gpu-readiness)."""
        if not torch.is_tensor(documents) or documents.dtype.is_floating_point or documents.dtype == torch.bool:
            raise ValueError(f"documents must be an integer tensor of document ids, (B, N); got {documents!r:.60}")
        if tuple(documents.shape) != tuple(idx.shape):
            raise ValueError(f"documents must have the tokens' shape {tuple(idx.shape)}; got {tuple(documents.shape)}")
        if positions is not None or offset or states is not None or return_states:
            raise ValueError("documents start each document at position 0 and carry no state: pass no positions, "
                             "offset or states with them")  # fmt: skip
        ids = documents.to(device=idx.device, dtype=torch.long)
        ordered = (ids[:, 1:] >= ids[:, :-1]).all()
        message = "documents: ids must not decrease along a row (equal ids are one document)"
        if ids.device.type == "cpu" and not torch.compiler.is_compiling():
            if not bool(ordered):
                raise ValueError(message)
        else:
            torch._assert_async(ordered, message)
        return Documents(ids, document_positions(ids))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **sampling):
        """Sample token by token: the prompt and the new tokens, (B, prompt + max_new_tokens).  ``sampling``:
        ``temperature``, ``top_k``, ``generator``, ``window``, as ``stream`` takes them."""
        return torch.cat([prompt, *self.stream(prompt, max_new_tokens, **sampling)], dim=1)

    @torch.no_grad()
    def stream(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        window: Optional[int] = None,
    ):
        """Yield each sampled token, (B, 1), as it is drawn.  Linear attention carries its recurrent
        state (O(1) memory per token); softmax attention re-reads the last ``window`` tokens (default max_len),
        and keeps no more of them, so memory does not grow with ``max_new_tokens``.  So does linear attention
        where no state can be carried: with an attention window (no running sum), randomized positions (drawn
        for a whole sequence in one call) or a table of max_len positions (none beyond it)."""
        self.eval()
        layers = [m for m in self.modules() if isinstance(m, ATTENTION["linear"])]
        carried = not (self.cfg.position.get("max_position") or self.cfg.position_table_bounded())
        linear = bool(layers) and not any(m.window for m in layers) and carried
        w = window or self.cfg.max_len
        ctx = prompt if linear else prompt[:, -w:]
        if linear:
            logits, states = self(prompt, return_states=True)
            pos = prompt.shape[1]
        for _ in range(max_new_tokens):
            if not linear:
                logits = self(ctx)
            nxt = sample(logits[:, -1], temperature, top_k, generator)
            yield nxt
            if linear:
                logits, states = self(nxt, offset=pos, states=states, return_states=True)
                pos += 1
            else:
                ctx = torch.cat([ctx, nxt], dim=1)[:, -w:]


def sample(logits: torch.Tensor, temperature: float, top_k: Optional[int], generator=None) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


NOT_DECAYED_MODULES = (nn.Embedding, nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)


def decayed(module: nn.Module, attr: str, p: nn.Parameter) -> bool:
    """The weight-decay rule (docs/methods.md#weight-decay): matrices that multiply activations are decayed;
    biases, norm gains and other vectors, the token embedding, a scheme's position tables (they follow the token
    embedding) and its additive score biases are not: the scheme says which they are (its traits ``tables``,
    ``score_biases``)."""
    if p.dim() < 2 or isinstance(module, NOT_DECAYED_MODULES):
        return False
    return not (isinstance(module, PositionScheme) and attr in (*module.tables, *module.score_biases))


def weight_decay_split(model: nn.Module) -> Tuple[List[str], List[str]]:
    """The names of ``model``'s trainable parameters, (decayed, not decayed), in ``named_parameters`` order.
    A parameter held by two modules (the tied head and embedding) is decayed only if both would decay it."""
    spared = {id(p) for m in model.modules() for a, p in m.named_parameters(recurse=False) if not decayed(m, a, p)}
    names = [(n, id(p)) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, i in names if i not in spared], [n for n, i in names if i in spared]
