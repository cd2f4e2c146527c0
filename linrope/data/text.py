"""``data=text``: a tokenised corpus in memory-mapped shards (linrope.data.shards), windows packed across documents.

A batch is ``(x, y, documents)``: inputs and targets (B, N) and ``documents`` (B, N) int64, the index of the
document (within its split) that each input position belongs to — increasing along a row; positions with equal
ids in a row are one document.  Each document ends with the end-of-document token (EOD), which belongs to it: the
target of a document's last token is EOD (scored: the model learns where a document ends); the target of EOD is
the next document's first token, which crosses a boundary and is ``IGNORE`` (so no document's first token is
scored).  ``boundaries=false`` gives ``(x, y)`` (the same targets, no ids): packing without boundaries.

Training draws random windows of ``context + 1`` tokens of the train split's stream (window ``i`` of the run a
pure function of ``(seed, i)``, as data=bytes); validation reads ``val_windows`` windows spread over the val split;
the test scores the whole test split, every target once (non-overlapping windows, the last one ending at the
split's end), or ``test_windows`` windows.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Optional

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset

from linrope.base.errors import CorpusError
from linrope.base.options import Count, Positive

from .bytes import splitmix64
from .modules import ResumableDataModule
from .record import data_record
from .shards import Shards, build_shards, default_cache_dir
from .sources import resolve_source
from .tasks import IGNORE
from .tokenizer import load_tokenizer

Fraction = Annotated[float, Field(gt=0, lt=1)]


def packed(shards: Shards, split: str, start: int, length: int, first: int = 0):
    """(x, y, documents) of the window of ``length`` inputs at ``start`` of ``split``'s stream: targets that cross a
    document boundary, and those before offset ``first`` (already scored by another window), are ``IGNORE``."""
    t = torch.from_numpy(shards.tokens(split, start, start + length + 1))
    d = torch.from_numpy(shards.documents(split, start, start + length + 1))
    y = t[1:].clone()
    offsets = torch.arange(start + 1, start + length + 1)
    y[(d[1:] != d[:-1]) | (offsets < first)] = IGNORE
    return t[:-1], y, d[:-1]


class TrainWindows(Dataset):
    """``length`` random windows; item i is window number ``start + i`` (``hash(seed, i)``, as data=bytes)."""

    def __init__(self, shards: Shards, context: int, seed: int, length: int, start: int = 0, boundaries: bool = True):
        self.shards, self.context, self.length, self.start, self.boundaries = shards, context, length, start, boundaries
        self.key = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x100000001B3)
        self.span = shards.length("train") - context - 1

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        o = int(
            splitmix64(np.array([self.key ^ np.uint64(self.start + i)], dtype=np.uint64))[0] % np.uint64(self.span + 1)
        )
        x, y, d = packed(self.shards, "train", o, self.context)
        return (x, y, d) if self.boundaries else (x, y)


class EvalWindows(Dataset):
    """Windows of ``context`` inputs of ``split``: every target once (``windows=None``: window k ends at
    e_k = min(k·context + context, n), scoring the targets after e_{k−1}), or ``windows`` non-overlapping windows
    spread evenly over the split, each scoring its own targets."""

    def __init__(self, shards: Shards, split: str, context: int, windows: Optional[int] = None,
                 boundaries: bool = True, offsets: bool = False):  # fmt: skip
        self.shards, self.split, self.context, self.boundaries = shards, split, context, boundaries
        self.offsets = offsets  # items end with each target's offset in the split (-1: not scored)
        n = shards.length(split) - 1  # targets at offsets 1 … n
        if n < context:
            raise CorpusError(f"the {split} split has {n + 1} tokens, fewer than one window of {context + 1}")
        if windows is None:
            ends = list(range(context, n, context)) + [n]
            self.starts = [e - context for e in ends]
            self.firsts = [1] + [e + 1 for e in ends[:-1]]
        else:
            m = min(windows, n // context)
            self.starts = [(k * (n // context) // m) * context for k in range(m)]
            self.firsts = [s + 1 for s in self.starts]

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, k):
        x, y, d = packed(self.shards, self.split, self.starts[k], self.context, self.firsts[k])
        item = (x, y, d) if self.boundaries else (x, y)
        if self.offsets:
            where = torch.arange(self.starts[k] + 1, self.starts[k] + self.context + 1)
            item += (torch.where(y != IGNORE, where, torch.full_like(where, -1)),)
        return item


class TextDataModule(ResumableDataModule):
    """Next-token prediction on a tokenised corpus (the module docstring); shards built on first use
    (linrope.data.shards, the code ``python -m linrope tokenize shards`` runs), reused after."""

    monitor = "val/bpb"

    def __init__(self, path: Optional[str] = None, tokenizer: str = "bytes", field: str = "text",
                 suffixes: Optional[List[str]] = None, hf_dataset: Optional[str] = None,
                 hf_config: Optional[str] = None, hf_split: str = "train", shards_dir: Optional[str] = None,
                 vocab_size: Optional[Positive] = None, context: Positive = 256, batch_size: Positive = 16,
                 eval_batch_size: Positive = 16, val_windows: Positive = 64, test_windows: Optional[Positive] = None,
                 val_fraction: Fraction = 0.05, test_fraction: Fraction = 0.05, shard_documents: Positive = 10_000,
                 max_documents: Optional[Positive] = None, boundaries: bool = True, num_workers: Count = 0,
                 seed: int = 1234, eval_context: Optional[Positive] = None, progress: bool = True):  # fmt: skip
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.context, self.batch_size, self.eval_batch_size = context, batch_size, eval_batch_size
        self.num_workers, self.seed, self.boundaries = num_workers, seed, boundaries
        self.eval_context = eval_context or context
        self.tokenizer = load_tokenizer(tokenizer)
        check_vocab(self.tokenizer.vocab_size, vocab_size, tokenizer)
        source = resolve_source(path, field=field, suffixes=suffixes, hf_dataset=hf_dataset, hf_config=hf_config,
                                hf_split=hf_split)  # fmt: skip
        self.folder = build_shards(
            source,
            self.tokenizer,
            cache_dir=shards_dir or default_cache_dir(),
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            shard_documents=shard_documents,
            max_documents=max_documents,
            progress=progress,
        )
        self.shards = Shards(self.folder, self.tokenizer)
        need = max(context, self.eval_context) + 1
        for s in ("train", "val", "test"):
            if self.shards.length(s) < need:
                raise CorpusError(
                    f"{self.folder}: the {s} split has {self.shards.length(s)} tokens but one window needs {need}; "
                    "use a larger corpus or a smaller context"
                )
        self.token_bytes = torch.from_numpy(self.tokenizer.token_bytes())  # bits per byte (linrope.training.lit)
        self.record = data_record(self)  # the tokenizer and corpus by path and hash: the run's provenance

    @classmethod
    def model_overrides_for(cls, data: Dict[str, Any]) -> Dict[str, Any]:
        """The model's vocabulary: the tokenizer's (``data.vocab_size`` when set: a larger, padded one)."""
        size = load_tokenizer(data.get("tokenizer")).vocab_size
        check_vocab(size, data.get("vocab_size"), data.get("tokenizer"))
        return {"vocab_size": int(data.get("vocab_size") or size)}

    def train_dataset(self, start: int, length: int):
        return TrainWindows(self.shards, self.context, self.seed, length, start, self.boundaries)

    def eval_dataset(self, split: str, context: Optional[int] = None, max_windows: Optional[int] = None):
        windows = max_windows or (self.hparams.val_windows if split == "val" else self.hparams.test_windows)
        return EvalWindows(self.shards, split, context or self.eval_context, windows, self.boundaries)

    def length_dataset(self, split: str, length: int) -> EvalWindows:
        """The windows of ``length`` tokens that score every target of ``split`` once, each item ending with its
        targets' offsets: the same scored tokens at every length (linrope.evaluation.extrapolation)."""
        return EvalWindows(self.shards, split, length, None, self.boundaries, offsets=True)

    def scored_text(self, split: str) -> Dict[str, int]:
        """{tokens, bytes, documents} the evaluation of ``split`` scores (the sums ``_eval`` logs, counted here)."""
        ds = self.eval_dataset(split)
        tokens = bytes_ = 0
        docs = set()
        table = self.token_bytes.numpy()
        for k in range(len(ds)):
            _, y, d, *_ = packed(self.shards, split, ds.starts[k], ds.context, ds.firsts[k])
            scored = (y != IGNORE).numpy()
            tokens += int(scored.sum())
            bytes_ += int(table[y.numpy()[scored]].sum())
            docs.update(np.unique(d.numpy()[scored]).tolist())
        return {"tokens": tokens, "bytes": bytes_, "documents": len(docs)}

    def val_dataloader(self):
        return self._loader(self.eval_dataset("val"), self.eval_batch_size)

    def test_dataloader(self):
        return self._loader(self.eval_dataset("test"), self.eval_batch_size)


def check_vocab(tokenizer_size: int, asked: Optional[int], name) -> None:
    if asked is not None and int(asked) < tokenizer_size:
        raise CorpusError(
            f"data.vocab_size={asked} is smaller than the vocabulary of data.tokenizer={name} ({tokenizer_size} "
            "tokens); leave it null (the tokenizer's) or raise it"
        )
