"""Lightning data modules for the synthetic tasks of ``linrope.data.tasks``.

Conventions as ``ByteDataModule``: training example ``i`` of a run is a pure function of
``(seed, i)`` and the training loader starts at ``global_step × samples per step``, so a resumed
run sees the same data; validation and test sets are fixed (drawn from ``eval_seed``, the same
for every run and seed) and ``eval_dataset(split, context, max_windows)`` gives them at any
length (the length-extrapolation evaluation uses it).

A task decides parts of the model: ``model_overrides_for(data_config)`` (a classmethod, so
``linrope.training.builders.build_module`` can ask before any data exists) returns the ``vocab_size``,
``causal``, ``n_classes`` and the longest position (``max_len``) the task needs.  ``monitor``
names the metric that picks checkpoints (``val/loss``; bits per byte exist only for bytes)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Dict, Optional

from pydantic import Field
from torch.utils.data import Dataset

from linrope.base.options import Count, Positive

from .modules import ResumableDataModule
from .tasks import MQAR, STREAMS, ListOps, OffsetCopy, example_rng


class TaskExamples(Dataset):
    """``length`` examples at ``context``; item i is example ``start + i`` of ``(seed, stream)``."""

    def __init__(self, task, context: int, seed: int, stream: int, length: int, start: int = 0):
        task.check_context(context)
        self.task, self.context, self.seed, self.stream = task, context, seed, stream
        self.length, self.start = length, start

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.task.sample(example_rng(self.seed, self.stream, self.start + i, self.context), self.context)


class FixedExamples(Dataset):
    """An evaluation set drawn once and kept (so every validation pass reads the same tensors)."""

    def __init__(self, examples: TaskExamples):
        self.items = [examples[i] for i in range(len(examples))]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class TaskDataModule(ResumableDataModule):
    task_name: ClassVar[str] = "?"
    monitor: ClassVar[str] = "val/loss"
    default_test_factor: ClassVar[int] = 1
    # the scored positions of an example are its queries, in order (mqar): the module logs the accuracy of each
    # example's k-th query, <stage>/acc_q1 … acc_q<query_orders> (linrope.training.lit); None: no such order
    query_orders: Optional[int] = None

    def __init__(self, task, *, context: Positive, batch_size: Positive = 16,
                 eval_batch_size: Positive = 16, val_examples: Positive = 256,
                 test_examples: Positive = 512, test_factor: Optional[Positive] = None,
                 num_workers: Count = 0, seed: int = 1234, eval_seed: int = 0):  # fmt: skip
        super().__init__()
        self.task, self.context = task, int(context)
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.val_examples, self.test_examples = val_examples, test_examples
        self.test_context = int(context) * int(test_factor or self.default_test_factor)
        self.seed, self.eval_seed = seed, eval_seed
        task.check_context(self.context)  # a bad config fails at start
        task.check_context(self.test_context)
        self._eval_cache: Dict[tuple, Dataset] = {}

    # ---- what the task decides about the model ---------------------------------------------------------------
    @classmethod
    def build_task(cls, data: Dict[str, Any]):
        raise NotImplementedError

    @classmethod
    def model_overrides_for(cls, data: Dict[str, Any]) -> Dict[str, Any]:
        task = cls.build_task(data)
        longest = int(data["context"]) * int(data.get("test_factor") or cls.default_test_factor)
        return {"vocab_size": task.vocab_size, "causal": True, "n_classes": None, "max_len": longest}

    # ---- loaders ---------------------------------------------------------------------------------------------
    def train_dataset(self, start: int, length: int):
        return TaskExamples(self.task, self.context, self.seed, STREAMS["train"], length=length, start=start)

    def eval_dataset(self, split: str, context: Optional[int] = None, max_windows: Optional[int] = None):
        """The fixed ``split`` set at ``context`` (default: the split's own), ``max_windows`` examples at most."""
        context = int(context or (self.test_context if split == "test" else self.context))
        n = self.val_examples if split == "val" else self.test_examples
        n = min(n, max_windows) if max_windows else n
        key = (split, context, n)
        if key not in self._eval_cache:
            self._eval_cache[key] = FixedExamples(TaskExamples(self.task, context, self.eval_seed, STREAMS[split], n))
        return self._eval_cache[key]

    def val_dataloader(self):
        return self._loader(self.eval_dataset("val"), self.eval_batch_size)

    def test_dataloader(self):
        return self._loader(self.eval_dataset("test"), self.eval_batch_size)


class MQARDataModule(TaskDataModule):
    """Multi-query associative recall; scored only at the queries (loss and accuracy)."""

    task_name = "mqar"

    def __init__(self, context: Positive, num_kv_pairs: Positive = 8, num_queries: Optional[Positive] = None,
                 key_vocab: Positive = 64, value_vocab: Positive = 64, **common):  # fmt: skip
        task = dict(num_kv_pairs=num_kv_pairs, num_queries=num_queries, key_vocab=key_vocab, value_vocab=value_vocab)
        super().__init__(self.build_task(task), context=context, **common)
        self.query_orders = self.task.queries  # every example scores its queries alone, one each, in order
        self.save_hyperparameters()

    @classmethod
    def build_task(cls, data):
        return MQAR(
            num_kv_pairs=data.get("num_kv_pairs", 8),
            num_queries=data.get("num_queries"),
            key_vocab=data.get("key_vocab", 64),
            value_vocab=data.get("value_vocab", 64),
        )


class OffsetCopyDataModule(TaskDataModule):
    """Copy the token ``offset`` back; trained at ``context``, tested at ``test_factor × context``."""

    task_name = "offset_copy"
    default_test_factor = 4

    def __init__(self, context: Positive, n_symbols: Positive = 64, offset: Positive = 16,
                 max_offset: Optional[Positive] = None, **common):  # fmt: skip
        super().__init__(
            self.build_task(dict(n_symbols=n_symbols, offset=offset, max_offset=max_offset)), context=context, **common
        )
        self.save_hyperparameters()

    @classmethod
    def build_task(cls, data):
        return OffsetCopy(
            n_symbols=data.get("n_symbols", 64), offset=data.get("offset", 16), max_offset=data.get("max_offset")
        )


class ListOpsDataModule(TaskDataModule):
    """LRA ListOps: a bidirectional encoder with mean pooling over the real tokens, 10 classes."""

    task_name = "listops"

    def __init__(self, context: Positive, max_depth: Positive = 10, max_args: Annotated[int, Field(ge=2)] = 10,
                 leaf_prob: Annotated[float, Field(ge=0, le=1)] = 0.75, min_length: Optional[Positive] = None,
                 max_tries: Positive = 200, **common):  # fmt: skip
        task = dict(max_depth=max_depth, max_args=max_args, leaf_prob=leaf_prob, min_length=min_length)
        super().__init__(self.build_task(dict(task, max_tries=max_tries)), context=context, **common)
        self.save_hyperparameters()

    @classmethod
    def build_task(cls, data):
        return ListOps(
            max_depth=data.get("max_depth", 10),
            max_args=data.get("max_args", 10),
            leaf_prob=data.get("leaf_prob", 0.75),
            min_length=data.get("min_length"),
            max_tries=data.get("max_tries", 200),
        )

    @classmethod
    def model_overrides_for(cls, data):
        return {**super().model_overrides_for(data), "causal": False, "n_classes": ListOps.n_classes}
