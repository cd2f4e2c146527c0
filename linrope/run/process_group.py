"""The torch.distributed process group of a process, destroyed when the interpreter exits.

Lightning does this only for nccl.  A gloo group left alive keeps worker threads that hold finished work; the
interpreter then tears down around them, and now and then a rank dies with SIGABRT ("terminate called without
an active exception") after its work is done: trainer=ddp_spawn on CPU lost a whole sweep job that way
(benchmarks/gloo_exit.py measures it).  atexit handlers run while the interpreter is still whole."""

from __future__ import annotations

import atexit

import torch


def destroy_process_group_at_exit() -> None:
    """Destroy this process's process group at exit (registered once per process, however often called);
    ``linrope.training.lit.LanguageModel.setup`` calls it in every process of a run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)
        atexit.register(_destroy_process_group)


EXIT_BARRIER_S = 30.0  # how long a rank waits at exit for the others before destroying its group anyway


def _destroy_process_group() -> None:
    """Meet the other ranks, then destroy the group.  Without the meeting, torch 2.4's gloo hung in
    ``destroy_process_group`` when the ranks reached it at different times (two of three tries of
    benchmarks/gloo_exit.py); ``monitored_barrier`` gives up after ``EXIT_BARRIER_S`` when a rank is gone."""
    import datetime

    dist = torch.distributed
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_BARRIER_S))
    except Exception:  # noqa: BLE001 - a rank that is gone: destroy all the same
        pass
    finally:
        dist.destroy_process_group()
