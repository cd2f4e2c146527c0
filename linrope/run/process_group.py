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
    ``linrope.lit.LanguageModel.setup`` calls it in every process of a run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
