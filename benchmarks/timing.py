"""The benchmarks' shared helpers: timing (warm-up, repeats, the median; alternating rounds; ratios), the header
line, the options every script takes, and the rows' cells.

Every time a benchmark prints is a median: of ``repeats`` calls after ``warmup`` untimed ones (``median_time``),
or, where several things are compared, of rounds in which they alternate (``rounds``), so that a slow drift of
a shared machine hits them alike.  On CUDA a call is timed between CUDA events and synchronised.  A ratio is
only ever taken between two times measured in the same process (``ratio``: None where either is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Hashable, Optional

import torch

FAIL_ENV = "LINROPE_BENCH_FAIL"  # names of forms or models made to raise: the failure drill of the device check
OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5: only torch.cuda's


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
    fns: dict[Hashable, Callable[[], object]], *, rounds: int, warmup: int = 1, device="cpu"
) -> dict[Hashable, list[float]]:
    """Seconds per call of each ``fns[key]()``, the keys alternating within each of ``rounds`` rounds, after
    ``warmup`` untimed calls of each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[Hashable, list[float]] = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times[key].append(once(fn, device))
    return times


def passes(fn, q, k, v, grad):
    """(forward+backward, forward under no_grad): the two calls a row times.  ``fn.plan``, where a form has one (the
    settings it runs under, benchmarks/forms.py), is held through each whole pass: the backward reads them too."""
    plan = getattr(fn, "plan", contextlib.nullcontext)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        with plan():
            fn(q, k, v).backward(grad)

    def fwd():
        with torch.no_grad(), plan():
            fn(q, k, v)

    return fwd_bwd, fwd


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


def failure_note(e: BaseException) -> str:
    """One line saying what failed: OOM named as such, else the exception's type and first line."""
    first = (str(e).strip().splitlines() or [""])[0][:160]
    if isinstance(e, OOM) or "out of memory" in first.lower():
        return f"OOM: {first}"
    return f"{type(e).__name__}: {first}"


def fmt(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}".replace(",", " ")


def fmt_ratio(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def status(row: dict) -> str:
    """A row's status cell: "ok", or the status and its note."""
    return row["status"] + (f": {row['note']}" if row.get("note") else "")


def table(head: list, rows: list[list]) -> list[str]:
    """A markdown table, one line per row ('|' in a cell becomes '/')."""
    cell = lambda c: str(c).replace("|", "/").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(cell(c) for c in r) + " |" for r in rows
    ]


def append_jsonl(path: Optional[Path], row: dict) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def header(title: str, timing: str) -> None:
    """The first two lines of every benchmark: what it measures, then what produced the numbers and how."""
    from linrope.run.provenance import machine_line  # here, not above: grid.py's workers import another linrope

    print(f"# {title}")
    print(f"{machine_line()}; {timing}", flush=True)


def parser(doc: str, *, threads: bool = True, malloc: bool = False, epilog: str = "") -> argparse.ArgumentParser:
    """The options the scripts share: ``--help`` gives ``doc`` (its first paragraph first), ``--threads``, and with
    ``malloc`` ``--system-malloc``."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc + epilog
    )
    if threads:
        p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    if malloc:
        p.add_argument(
            "--system-malloc",
            action="store_true",
            help="leave malloc as it is; by default freed memory is kept for reuse, as train.py does "
            "(linrope.base.memory.retain_freed_memory), for every form alike",
        )
    return p


def start(args) -> str:
    """Set ``--threads``; keep freed memory for reuse unless ``--system-malloc`` (where the script has it): what
    malloc does, for the header."""
    from linrope.base.memory import retain_freed_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    if not hasattr(args, "system_malloc"):
        return "as the system has it"
    kept = False if args.system_malloc else retain_freed_memory()
    return "freed memory kept for reuse" if kept else "as the system has it"


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
