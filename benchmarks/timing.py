"""The benchmarks' one timing helper: warm-up, repeats, the median; alternating rounds; ratios; the header line.

Every time a benchmark prints is a median: of ``repeats`` calls after ``warmup`` untimed ones (``median_time``),
or, where several things are compared, of rounds in which they alternate (``rounds``), so that a slow drift of
a shared machine hits them alike.  On CUDA a call is timed between CUDA events and synchronised.  A ratio is
only ever taken between two times measured in the same process (``ratio``: None where either is missing).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Hashable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.run.provenance import machine_line  # noqa: E402

FAIL_ENV = "LINROPE_BENCH_FAIL"  # names of forms or models made to raise: the failure drill of the device check


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def once(fn: Callable[[], object], device="cpu") -> float:
    """Seconds of one call of ``fn()`` (between CUDA events on a GPU)."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn: Callable[[], object], *, warmup: int, repeats: int, device="cpu") -> float:
    """The median seconds of ``repeats`` calls of ``fn()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    return statistics.median(once(fn, device) for _ in range(repeats))


def rounds(
    fns: dict[Hashable, Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 1,
    device="cpu",
    on_round: Optional[Callable[[int, dict], None]] = None,
) -> dict[Hashable, list[float]]:
    """Seconds per call of each ``fns[key]()``, the keys alternating within each of ``rounds`` rounds, after
    ``warmup`` untimed calls of each; ``on_round(i, times)`` after each round (to print progress)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[Hashable, list[float]] = {key: [] for key in fns}
    for i in range(rounds):
        for key, fn in fns.items():
            times[key].append(once(fn, device))
        if on_round is not None:
            on_round(i, times)
    return times


def medians(times: dict) -> dict:
    return {key: statistics.median(v) for key, v in times.items()}


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b where both were measured, else None."""
    return a / b if a and b else None


def matmul_rate(size: int = 2048, dtype=torch.float32, repeats: int = 5, device="cpu") -> float:
    """GFLOP/s of a ``size``³ ``torch.mm`` (the median of ``repeats`` after one warm-up): the peak the kernels'
    FLOP rates are set against."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    return 2 * size**3 / median_time(lambda: a @ b, warmup=1, repeats=repeats, device=device) / 1e9


def forced_failure(*names: str) -> None:
    """Raise if ``LINROPE_BENCH_FAIL`` names one of ``names`` (a form's key or label, a model)."""
    named = [s.strip() for s in os.environ.get(FAIL_ENV, "").split(",") if s.strip()]
    if any(n in named for n in names):
        raise RuntimeError(f"forced failure ({FAIL_ENV}={os.environ[FAIL_ENV]})")


def fmt(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}".replace(",", " ")


def fmt_ratio(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def table(head: list, rows: list[list]) -> list[str]:
    """A markdown table, one line per row ('|' in a cell becomes '/')."""
    cell = lambda c: str(c).replace("|", "/").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(cell(c) for c in r) + " |" for r in rows
    ]


def header(title: str, timing: str) -> None:
    """The first two lines of every benchmark: what it measures, then what produced the numbers and how."""
    print(f"# {title}")
    print(f"{machine_line()}; {timing}", flush=True)


def set_threads(threads: Optional[int]) -> None:
    if threads:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def busy_process(enabled: bool):
    """One competing process spinning one thread, started here and stopped on leaving."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # running and scheduled before the first timing
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)
