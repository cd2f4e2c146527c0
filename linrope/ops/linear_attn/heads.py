"""The chunk kernel's heads as tasks on a CPU: one thread per task, the tasks shared out as threads free up.

Every head (and batch row) of linear attention is independent, so the chunk form can run them apart.  On a CPU
the kernel otherwise runs each of its operations as an OpenMP region split evenly between torch's threads: when
another process takes one of the cores, every region waits for the thread that shares it, and a kernel of
hundreds of operations slows by about the busy core's share (docs/benchmarks.md, "Issue 31").  Here a long
sequence's heads are cut into groups, each group one task run start to end by one thread of a small pool (torch
single-threaded inside it), and a thread that finishes takes the next group: a thread slowed by a busy core
simply takes fewer groups, and no operation waits for another thread.

The groups depend on the shape alone, never on the thread count or the load: each (batch row, head) is a task of
its own, or, where a whole sequence of one head is less than a block (``tables.BLOCK_ELEMENTS``), a few heads of
one row together, up to a block's worth.  Every task walks blocks planned for its group's size, so the arithmetic
of each head, the saved states' shapes and the results are the same with one thread or many (one thread runs the
tasks one after the other in the caller's thread).

Used by ``chunk.py``'s operators on the CPU when the sequence has at least ``MIN_POSITIONS`` positions (shorter
ones are too little work per task: they run whole, each operation split between torch's threads) and there are
at least two heads and batch rows between them; ``ENABLED = False`` runs every call whole (benchmarks/loaded.py
compares both).  The tasks see the caller's inputs as they are (no copy) and write their outputs into views of
the caller's buffers; their small results (states) are joined along the head dimension.  Inside a task autograd
records nothing (the kernels build no graph) and autocast is off (the operators turn it off too)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .tables import BLOCK_ELEMENTS

ENABLED = True
MIN_POSITIONS = 2048

_pools: dict = {}
_lock = threading.Lock()


def _single_threaded() -> None:
    """This thread's torch runs one thread: its OpenMP and MKL settings are per thread.  torch reads the global
    default into a thread once, lazily, on its first use; read it first, so that the caller restoring the default
    later does not reach this thread."""
    torch.get_num_threads()
    torch.set_num_threads(1)


def _pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` worker threads, each running torch single-threaded, started at once.  A worker's
    ``torch.set_num_threads(1)`` also sets the default that threads started later take, so the caller's setting is
    put back once every worker has started (workers live as long as the process)."""
    with _lock:
        if threads not in _pools:
            pool = ThreadPoolExecutor(threads, "linrope-heads", initializer=_single_threaded)
            started = threading.Barrier(threads)
            list(pool.map(lambda _: started.wait(), range(threads)))  # every worker exists and is initialised
            torch.set_num_threads(threads)
            _pools[threads] = pool
        return _pools[threads]


def groups(B: int, H: int, N: int, d: int, device: torch.device) -> Optional[List[Tuple[slice, slice]]]:
    """(batch rows, heads) of each task for a call of B rows, H heads, N positions and width d, or None to run the
    call whole.  A function of the shape alone (see the module's docstring)."""
    if not ENABLED or device.type != "cpu" or N < MIN_POSITIONS or B * H < 2:
        return None
    width = max(1, min(H, BLOCK_ELEMENTS["cpu"] // (N * max(d, 1))))  # heads of one row per task
    return [(slice(b, b + 1), slice(h, min(h + width, H))) for b in range(B) for h in range(0, H, width)]


def run(task: Callable[[slice, slice], Sequence[Optional[torch.Tensor]]], parts: List[Tuple[slice, slice]],
        head_dims: Sequence[int]) -> tuple:  # fmt: skip
    """``task(rows, heads)`` for every part, on the pool when torch has more than one thread (else one after the
    other in this thread), its results joined: result i along batch dimension ``head_dims[i] - 1`` and head
    dimension ``head_dims[i]`` (None stays None)."""

    def one(part):
        with torch.no_grad():
            return task(*part)

    threads = torch.get_num_threads()
    results = list(_pool(threads).map(one, parts)) if threads > 1 else [one(p) for p in parts]
    joined = []
    for i, dim in enumerate(head_dims):
        pieces = [r[i] for r in results]
        if pieces[0] is None:
            joined.append(None)
            continue
        rows = {}
        for (b, _), piece in zip(parts, pieces):  # heads of a row in order, then the rows
            rows.setdefault(b.start, []).append(piece)
        joined.append(torch.cat([torch.cat(p, dim=dim) for _, p in sorted(rows.items())], dim=dim - 1))
    return tuple(joined)


def rows_heads(t: Optional[torch.Tensor], rows: slice, heads: slice, dim: int = 1) -> Optional[torch.Tensor]:
    """The part of ``t`` (batch at ``dim - 1``, heads at ``dim``) a task sees."""
    if t is None:
        return None
    index = [slice(None)] * (dim - 1) + [rows, heads]
    return t[tuple(index)]
