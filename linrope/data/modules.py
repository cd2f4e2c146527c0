"""Lightning data modules."""

from __future__ import annotations

from typing import Annotated, Dict, Optional

import lightning as L
import numpy as np
from pydantic import Field
from torch.utils.data import DataLoader

from linrope.base.options import Count, Positive

from .bytes import ContiguousWindows, RandomWindows, SlidingWindows, document_index, load_corpus
from .resume import train_loader, train_span

Fraction = Annotated[float, Field(gt=0, lt=1)]  # of the corpus


class ResumableDataModule(L.LightningDataModule):
    """What every linrope data module shares: loaders in order, and a training set that starts where
    the run stands (``global_step × samples per step``), so a resumed or multi-process run sees the
    same samples as an uninterrupted single process.  Subclasses give ``train_dataset(start, length)``
    and set ``batch_size`` and ``num_workers``."""

    batch_size: int
    num_workers: int

    def train_dataset(self, start: int, length: int):
        raise NotImplementedError

    def _loader(self, ds, batch_size):
        return DataLoader(
            ds,
            batch_size=batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def samples_per_step(self) -> int:
        t = self.trainer
        return self.batch_size * t.accumulate_grad_batches * t.world_size

    def train_dataloader(self):
        # starts at global_step × samples per step, as the whole run; sample i to rank i mod world_size
        start, length = train_span(self.trainer, self.samples_per_step())
        return train_loader(self.train_dataset(start, length), self.trainer, self.batch_size, self.num_workers)


class ByteDataModule(ResumableDataModule):
    """Next-byte prediction on a corpus read at construction (so a bad path fails at start).

    The training loader resumes where the run stands: sample ``i`` of the run is window
    ``hash(seed, i)``, and the loader starts at ``global_step × samples per step``.  Validation reads
    ``val_windows`` windows spread evenly over the validation split (many files, not the first); the test scores
    the whole test split (every byte but the first, in non-overlapping windows, the last one ending at the
    split's end), or ``test_windows`` windows spread over it."""

    def __init__(self, path: Optional[str] = None, context: Positive = 256, batch_size: Positive = 16,
                 eval_batch_size: Positive = 16, val_windows: Positive = 64, test_windows: Optional[Positive] = None,
                 val_fraction: Fraction = 0.05, test_fraction: Fraction = 0.05,
                 max_bytes: Optional[Positive] = None, num_workers: Count = 0, seed: int = 1234,
                 eval_context: Optional[Positive] = None, allow_binary: bool = False):  # fmt: skip
        super().__init__()
        self.save_hyperparameters(logger=False)  # logged once, as data.* of the whole config (training.log_config)
        self.context, self.batch_size, self.eval_batch_size = context, batch_size, eval_batch_size
        self.num_workers, self.seed = num_workers, seed
        self.eval_context = eval_context or context
        self.splits = load_corpus(
            path,
            context=max(context, self.eval_context),
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            max_bytes=max_bytes,
            allow_binary=allow_binary,
        )

    def train_dataset(self, start: int, length: int):
        return RandomWindows(self.splits["train"], self.context, self.seed, length=length, start=start)

    @property
    def documents(self):
        """{split: [(name, start, end), ...]}: the files each split holds (linrope.data.bytes.Corpus)."""
        return self.splits.documents

    def eval_dataset(self, split: str, context: Optional[int] = None, max_windows: Optional[int] = None):
        context = context or self.eval_context
        windows = max_windows or (self.hparams.val_windows if split == "val" else self.hparams.test_windows)
        data = self.splits[split]
        if windows is None:  # the whole split, each target once
            return SlidingWindows(data, context, context, len(data) - 1)
        return ContiguousWindows(data, context, windows)

    def scored_text(self, split: str) -> Dict[str, int]:
        """How much of ``split`` its evaluation scores: {bytes, documents} (targets, and the files they lie in)."""
        ds, documents = self.eval_dataset(split), self.documents[split]
        if isinstance(ds, SlidingWindows):  # every target 1 … last: the documents from the first to the last
            first, last = document_index(documents, np.array([1, ds.ends[-1]]))
            return {"bytes": int(ds.ends[-1]), "documents": int(last - first + 1)}
        offsets = (ds.starts[:, None] + np.arange(1, ds.context + 1)[None, :]).ravel()
        return {"bytes": int(offsets.size), "documents": int(np.unique(document_index(documents, offsets)).size)}

    def val_dataloader(self):
        return self._loader(self.eval_dataset("val"), self.eval_batch_size)

    def test_dataloader(self):
        return self._loader(self.eval_dataset("test"), self.eval_batch_size)
