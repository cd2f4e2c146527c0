"""The chunk kernel's heads as tasks on a CPU: one thread per task, the tasks shared out as threads free up.

Every head (and batch row) of linear attention is independent, so the chunk form can run them apart.  On a CPU
the kernel otherwise runs each of its operations as an OpenMP region split evenly between torch's threads: when
another process takes one of the cores, every region waits for the thread that shares it, and a kernel of
hundreds of operations slows by about the busy core's share (docs/benchmarks.md, "Issue 31").  Here a long
sequence's heads are cut into groups, each group one task run start to end by one thread of a small pool (torch
single-threaded inside it), and a thread that finishes takes the next group: a thread slowed by a busy core
simply takes fewer groups, and no operation waits for another thread.

Used by ``chunk.py``'s operators on the CPU when torch has more than one thread, the sequence has at least
``MIN_POSITIONS`` positions (shorter ones are too little work per task) and there are at least two heads and batch
rows between them; ``ENABLED = False`` turns it off (benchmarks/loaded.py compares both).  The tasks see the
caller's inputs as they are (no copy); each task's results are joined along the head dimension.  Inside a task
autograd records nothing (the kernels build no graph) and autocast is off (the operators turn it off too)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple

import torch

ENABLED = True
MIN_POSITIONS = 2048
TASKS_PER_THREAD = 4  # enough groups that a slowed thread's share can move to the other threads

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


def groups(q: torch.Tensor) -> Optional[List[Tuple[slice, slice]]]:
    """(batch rows, heads) of each task for ``q`` (B, H, N, d), or None to run the call whole."""
    B, H, N = q.shape[:3]
    threads = torch.get_num_threads()
    if not ENABLED or q.device.type != "cpu" or N < MIN_POSITIONS or threads < 2 or B * H < 2:
        return None
    units = [(b, h) for b in range(B) for h in range(H)]
    n = min(len(units), threads * TASKS_PER_THREAD)
    cuts = [len(units) * i // n for i in range(n + 1)]
    out = []
    for i in range(n):  # contiguous heads of one batch row per task (a view of the inputs, no copy)
        part = units[cuts[i] : cuts[i + 1]]
        for b in dict.fromkeys(b for b, _ in part):
            hs = [h for bb, h in part if bb == b]
            out.append((slice(b, b + 1), slice(hs[0], hs[-1] + 1)))
    return out


def run(task: Callable[[slice, slice], Sequence[Optional[torch.Tensor]]], parts: List[Tuple[slice, slice]],
        head_dims: Sequence[int]) -> tuple:  # fmt: skip
    """``task(rows, heads)`` for every part on the pool, its results joined: result i along batch dimension
    ``head_dims[i] - 1`` and head dimension ``head_dims[i]`` (None stays None)."""

    def one(part):
        with torch.no_grad():
            return task(*part)

    results = list(_pool(torch.get_num_threads()).map(one, parts))
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
