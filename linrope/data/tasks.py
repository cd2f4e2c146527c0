"""Synthetic position-sensitive tasks (no download): MQAR, offset copy, ListOps.

Pure numpy/torch, no Lightning (the data modules live in ``linrope.data.task_modules``).
Every example is a pure function of ``(seed, stream, index)`` — ``example_rng`` hashes the
three into its own generator — so a run resumed at sample ``i`` sees exactly the data an
uninterrupted run would, and evaluation sets do not depend on the order they are read in.

Each task splits into a *sampler* (draws the random choices) and a pure *assembler* (turns the
choices into tokens), so the assembler can be checked by hand in the tests.

Targets use ``IGNORE = -100`` (``F.cross_entropy``'s ``ignore_index``) wherever nothing is scored.

* **MQAR** — multi-query associative recall (Arora et al. 2023, "Zoology"): key–value pairs,
  then the keys again as queries; at a query the model must name the value bound to that key.
* **offset copy** — at position ``i`` predict the token ``d`` positions back (``d`` fixed, or
  drawn per sequence and announced by a marker token at position 0).  Solvable at any length with
  relative position; an absolute scheme has to learn it position by position.
* **ListOps** — the Long Range Arena task (Tay et al. 2021, after Nangia & Bowman 2018): bracketed
  prefix expressions over the digits 0–9 with MAX, MIN, MED (median, rounded down) and SM (sum
  mod 10); the answer (10 classes) is the value of the expression.  A bidirectional encoder with
  mean pooling classifies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

IGNORE = -100
STREAMS = {"train": 0, "val": 1, "test": 2}


def example_rng(seed: int, stream: int, index: int, context: int = 0) -> np.random.Generator:
    """The generator of one example: a pure function of (seed, stream, index, context)."""
    return np.random.default_rng(
        np.random.SeedSequence([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, stream, index, context])
    )


# ---- MQAR ------------------------------------------------------------------------------------------------------
@dataclass
class MQAR:
    """Multi-query associative recall.

    Token layout: ``0`` filler, keys ``1 … key_vocab``, values ``key_vocab+1 … key_vocab+value_vocab``.
    A sequence of ``context + 1`` tokens is ``k1 v1 k2 v2 … kP vP`` (P = ``num_kv_pairs``, keys
    distinct), then a query region of filler in which ``num_queries`` distinct keys stand at
    random even offsets, each followed by its value (teacher forcing).  Inputs are the first
    ``context`` tokens; the target at a query key is its value, ``IGNORE`` elsewhere.  The gaps
    between queries are uniform here (Zoology draws them from a power law)."""

    num_kv_pairs: int = 8
    num_queries: Optional[int] = None  # default: every key is queried once
    key_vocab: int = 64
    value_vocab: int = 64

    def __post_init__(self):
        q = self.queries
        if self.num_kv_pairs < 1 or not 1 <= q <= self.num_kv_pairs:
            raise ValueError(f"mqar: need 1 <= num_queries ({q}) <= num_kv_pairs ({self.num_kv_pairs})")
        if self.key_vocab < self.num_kv_pairs:
            raise ValueError(f"mqar: key_vocab={self.key_vocab} < num_kv_pairs={self.num_kv_pairs} (keys are distinct)")

    @property
    def queries(self) -> int:
        return self.num_kv_pairs if self.num_queries is None else self.num_queries

    @property
    def vocab_size(self) -> int:
        return 1 + self.key_vocab + self.value_vocab

    def min_context(self) -> int:
        return 2 * self.num_kv_pairs + 2 * self.queries - 1

    def check_context(self, context: int) -> None:
        if context < self.min_context():
            raise ValueError(
                f"mqar: context {context} is too short for {self.num_kv_pairs} pairs and "
                f"{self.queries} queries (needs >= {self.min_context()})"
            )

    def sample(self, rng: np.random.Generator, context: int) -> Tuple[torch.Tensor, torch.Tensor]:
        self.check_context(context)
        keys = rng.choice(self.key_vocab, size=self.num_kv_pairs, replace=False) + 1
        values = rng.integers(0, self.value_vocab, size=self.num_kv_pairs) + 1 + self.key_vocab
        asked = rng.choice(self.num_kv_pairs, size=self.queries, replace=False)  # which pairs, in query order
        n_slots = (context + 1 - 2 * self.num_kv_pairs) // 2
        slots = np.sort(rng.choice(n_slots, size=self.queries, replace=False))
        return mqar_assemble(keys, values, asked, slots, context)


def mqar_assemble(
    keys: Sequence[int], values: Sequence[int], asked: Sequence[int], slots: Sequence[int], context: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(inputs (context,), targets (context,)): pairs first, query ``q`` (pair ``asked[q]``) at slot
    ``slots[q]`` of the query region (slot s = positions 2P+2s, 2P+2s+1)."""
    p = len(keys)
    seq = np.zeros(context + 1, dtype=np.int64)
    seq[0 : 2 * p : 2], seq[1 : 2 * p : 2] = keys, values
    target = np.full(context + 1, IGNORE, dtype=np.int64)
    for pair, slot in zip(asked, slots):
        at = 2 * p + 2 * int(slot)
        seq[at], seq[at + 1] = keys[pair], values[pair]
        target[at] = values[pair]
    return torch.from_numpy(seq[:-1].copy()), torch.from_numpy(target[:-1].copy())


# ---- offset copy -----------------------------------------------------------------------------------------------
@dataclass
class OffsetCopy:
    """Predict the token ``d`` positions back: target[i] = x[i - d].

    Symbols are ``0 … n_symbols-1``.  Fixed offset (``max_offset`` null): every sequence uses
    ``d = offset`` and positions ``i < d`` are not scored.  Sampled offset: ``d`` is drawn from
    ``offset … max_offset`` per sequence and announced by the marker token ``n_symbols + d - offset``
    at position 0; positions whose source would be the marker (``i - d < 1``) are not scored."""

    n_symbols: int = 64
    offset: int = 16
    max_offset: Optional[int] = None

    def __post_init__(self):
        if self.offset < 1 or (self.max_offset is not None and self.max_offset < self.offset):
            raise ValueError(f"offset_copy: need 1 <= offset ({self.offset}) <= max_offset ({self.max_offset})")

    @property
    def sampled(self) -> bool:
        return self.max_offset is not None and self.max_offset > self.offset

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + ((self.max_offset - self.offset + 1) if self.sampled else 0)

    def check_context(self, context: int) -> None:
        longest = self.max_offset if self.sampled else self.offset
        if context <= longest + 1:
            raise ValueError(f"offset_copy: context {context} must exceed the offset ({longest}) + 1")

    def sample(self, rng: np.random.Generator, context: int) -> Tuple[torch.Tensor, torch.Tensor]:
        self.check_context(context)
        tokens = rng.integers(0, self.n_symbols, size=context)
        d = int(rng.integers(self.offset, self.max_offset + 1)) if self.sampled else self.offset
        return offset_copy_assemble(tokens, d, marker=(self.n_symbols + d - self.offset) if self.sampled else None)


def offset_copy_assemble(tokens: Sequence[int], d: int, marker: Optional[int] = None):
    """(inputs, targets): ``targets[i] = inputs[i - d]``; with a ``marker`` it replaces position 0
    and is never a target."""
    x = np.array(tokens, dtype=np.int64)
    first = d
    if marker is not None:
        x[0] = marker
        first = d + 1
    y = np.full(len(x), IGNORE, dtype=np.int64)
    y[first:] = x[first - d : len(x) - d]
    return torch.from_numpy(x), torch.from_numpy(y)


# ---- ListOps ---------------------------------------------------------------------------------------------------
PAD, OPEN, CLOSE = 0, 11, 12
OPERATORS = ("MAX", "MIN", "MED", "SM")
OP_TOKEN = {op: 13 + i for i, op in enumerate(OPERATORS)}
LISTOPS_VOCAB = 17  # pad, ten digits (token = digit + 1), '[', ']', four operators
TOKEN_TEXT = {
    PAD: "<pad>",
    OPEN: "[",
    CLOSE: "]",
    **{v: k for k, v in OP_TOKEN.items()},
    **{d + 1: str(d) for d in range(10)},
}


def apply_op(op: str, args: Sequence[int]) -> int:
    """The four LRA operators on digits; MED is the median rounded down, SM the sum mod 10."""
    if op == "MAX":
        return max(args)
    if op == "MIN":
        return min(args)
    if op == "MED":
        s = sorted(args)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    if op == "SM":
        return sum(args) % 10
    raise ValueError(f"unknown listops operator {op!r}")


def listops_tokenize(text: str) -> List[int]:
    """``"[MAX 2 [MIN 4 7 ] 0 ]"`` -> token ids (``[MAX`` may also be written ``[ MAX``)."""
    out = []
    for word in text.replace("[", " [ ").split():
        if word == "[":
            out.append(OPEN)
        elif word == "]":
            out.append(CLOSE)
        elif word in OP_TOKEN:
            out.append(OP_TOKEN[word])
        elif word.isdigit() and len(word) == 1:
            out.append(int(word) + 1)
        else:
            raise ValueError(f"listops: unknown word {word!r}")
    return out


def listops_text(tokens: Sequence[int]) -> str:
    words = [TOKEN_TEXT[int(t)] for t in tokens if int(t) != PAD]
    return " ".join(words).replace("[ ", "[")


def listops_eval(tokens: Sequence[int]) -> int:
    """Value of a tokenised expression (padding ignored); raises ValueError if it is malformed."""
    stack: List[list] = []
    result = None
    toks = [int(t) for t in tokens if int(t) != PAD]
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == OPEN:
            if i + 1 >= len(toks) or toks[i + 1] not in OP_TOKEN.values():
                raise ValueError("listops: '[' must be followed by an operator")
            stack.append([OPERATORS[toks[i + 1] - 13]])
            i += 2
            continue
        if t == CLOSE:
            if not stack or len(stack[-1]) < 2:
                raise ValueError("listops: ']' without an operator and arguments")
            op, *args = stack.pop()
            value = apply_op(op, args)
        elif 1 <= t <= 10:
            value = t - 1
        else:
            raise ValueError(f"listops: unexpected token {t}")
        if stack:
            stack[-1].append(value)
        elif result is None and i == len(toks) - 1:
            result = value
        else:
            raise ValueError("listops: more than one expression")
        i += 1
    if stack or result is None:
        raise ValueError("listops: unbalanced expression")
    return result


@dataclass
class ListOps:
    """LRA ListOps: random expression trees under the published grammar and limits.

    Below the root, a node is a digit with probability ``leaf_prob`` (LRA: 0.75) and otherwise an
    operator over 2…``max_args`` (LRA: 10) sub-trees; nodes at ``max_depth`` (LRA: 10) are digits.
    The root is always an operator.  Unlike LRA, which draws trees freely and rejects those outside
    its length bounds, the budget of ``max_length`` tokens (default: the context) is handed down
    while the tree is drawn, so no tree is too long; trees shorter than ``min_length`` (default a
    quarter of the context, as LRA's 500 of 2000) are redrawn, up to ``max_tries`` times (then the
    longest drawn is kept).  ``[MAX`` is two tokens here, ``[`` and ``MAX``."""

    max_depth: int = 10
    max_args: int = 10
    leaf_prob: float = 0.75
    min_length: Optional[int] = None
    max_length: Optional[int] = None
    max_tries: int = 200

    vocab_size = LISTOPS_VOCAB
    n_classes = 10

    def __post_init__(self):
        if self.max_depth < 1 or self.max_args < 2:
            raise ValueError(f"listops: need max_depth >= 1 and max_args >= 2; got {self.max_depth}, {self.max_args}")

    def check_context(self, context: int) -> None:
        if context < 5:
            raise ValueError(f"listops: context {context} is too short (the smallest expression has 5 tokens)")

    def _node(self, rng, depth: int, budget: int, out: List[int]) -> None:
        leaf = depth >= self.max_depth or budget < 5 or (depth > 0 and rng.random() < self.leaf_prob)
        if leaf:
            out.append(int(rng.integers(10)) + 1)
            return
        n = min(int(rng.integers(2, self.max_args + 1)), budget - 3)
        out += [OPEN, OP_TOKEN[OPERATORS[int(rng.integers(len(OPERATORS)))]]]
        left = budget - 3  # '[', operator, ']'
        for a in range(n):
            start = len(out)
            self._node(rng, depth + 1, left - (n - a - 1), out)  # keep one token for each later argument
            left -= len(out) - start
        out.append(CLOSE)

    def expression(self, rng: np.random.Generator, context: int) -> List[int]:
        self.check_context(context)
        max_len = min(self.max_length or context, context)
        min_len = min(self.min_length if self.min_length is not None else context // 4, max_len)
        best: List[int] = []
        for _ in range(self.max_tries):
            out: List[int] = []
            self._node(rng, 0, max_len, out)
            if len(out) > len(best):
                best = out
            if len(out) >= min_len:
                break
        return best

    def sample(self, rng: np.random.Generator, context: int):
        """(tokens (context,) padded with 0, label (), mask (context,) of real tokens)."""
        expr = self.expression(rng, context)
        x = torch.zeros(context, dtype=torch.long)
        x[: len(expr)] = torch.tensor(expr)
        return x, torch.tensor(listops_eval(expr)), x != PAD
