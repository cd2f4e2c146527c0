"""Resuming in the data modules: the training set of a run starts where the run stands, and sample ``i``
of a step goes to rank ``i mod world_size`` (so a resumed or multi-process run sees the samples of an
uninterrupted single process)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch


def train_span(trainer, samples_per_step: int, default_steps: int = 100_000) -> Tuple[int, int]:
    """(start, length) of the training dataset: it starts at sample ``global_step × samples_per_step``
    and is as the whole run.  Lightning, resuming in the middle of an epoch, counts the
    batches of that epoch already done against ``len(loader)`` (without skipping any): a loader only
    as the remaining steps would end the epoch early and then start over from the resume point."""
    total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else default_steps
    total = max(total, trainer.global_step + 1)
    return trainer.global_step * samples_per_step, total * samples_per_step


class ResumableLoader(torch.utils.data.DataLoader):
    """A training loader whose dataset already starts where the run stands (``train_span``).
    Marked stateful so that Lightning does not warn, on resuming, that it is not resumable."""

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        pass


def train_loader(dataset, trainer, batch_size: int, num_workers: int = 0) -> ResumableLoader:
    """The training loader of a dataset made with ``train_span``: in order, and with several processes
    sample ``i`` goes to rank ``i mod world_size`` — so the global batch of a step is the same samples
    whatever the number of processes.  (Lightning's own DistributedSampler for training always shuffles,
    with a permutation of the whole dataset that changes when a resumed run's dataset does.)"""
    sampler = None
    if trainer is not None and trainer.world_size > 1:
        sampler = torch.utils.data.DistributedSampler(
            dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False, drop_last=False
        )
    return ResumableLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        sampler=sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
