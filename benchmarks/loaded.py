"""Benchmark: the chunk kernel against softmax attention on a quiet machine and beside one busy process (issue 31).

Chunked linear attention (``impl="chunk"``) and ``torch.nn.functional.scaled_dot_product_attention``
(``is_causal=True``), forward+backward, B=1, H=8, d=64, float32, elu+1, RoPE in the numerator, C=64, at N =
``--length`` (16 384).  Each round times every form twice: once on the quiet machine, then once while a
competing process that this script starts spins one thread (``python -c "while True: pass"``; stopped after
the round), so that drift of the machine hits both states alike.  Reported: the median of each over the
rounds, SDPA time / chunk time (the chunk form's advantage) in both states, and loaded advantage / quiet
advantage.

``chunk_old`` is the same kernel with the plan before issue 31 (``scans.SEQUENTIAL = True``: a Python loop
over chunks in every scan; ``tables.MAX_BLOCKS = None``: blocks of 512 positions however long the sequence),
timed interleaved with the new plan in the same process.  Goals (issue 31): loaded keeps ≥ 80% of the quiet
advantage; quiet, the new plan keeps ≥ 95% of the old plan's advantage.

On 2 cores, two threads (torch's default here) meet the busy process in every OpenMP region: a region waits
for its descheduled thread, so a kernel of many small operations slows most.

Usage:  python benchmarks/loaded.py                      # N = 16 384, 5 rounds
        python benchmarks/loaded.py --length 4096 --rounds 3 --forms chunk sdpa
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.base.memory import retain_freed_memory  # noqa: E402
from linrope.ops import linear_attention  # noqa: E402
from linrope.ops.linear_attn import scans, tables  # noqa: E402
from linrope.run.provenance import machine_line  # noqa: E402

B, H, D, C = 1, 8, 64, 64
FORMS = ("chunk", "chunk_old", "sdpa")
STATES = ("quiet", "loaded")


@contextlib.contextmanager
def old_plan(enabled: bool):
    """The chunk kernel's plan before issue 31: per-chunk scan loops, 512-position blocks at any N."""
    saved = scans.SEQUENTIAL, dict(tables.MAX_BLOCKS)
    if enabled:
        scans.SEQUENTIAL = True
        tables.MAX_BLOCKS.update({k: None for k in tables.MAX_BLOCKS})
    try:
        yield
    finally:
        scans.SEQUENTIAL = saved[0]
        tables.MAX_BLOCKS.update(saved[1])


def fwd_bwd(form: str, q, k, v) -> float:
    """Seconds of one forward+backward."""
    for t in (q, k, v):
        t.grad = None
    with old_plan(form == "chunk_old"):
        t0 = time.perf_counter()
        if form == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = linear_attention(q, k, v, impl="chunk", chunk_size=C)
        out.sum().backward()
        return time.perf_counter() - t0


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


def measure(length: int, rounds: int, forms, warmup: int = 1):
    """{(form, state): [seconds per round]}."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, length, D, generator=g).requires_grad_() for _ in range(3))
    for form in forms:
        for _ in range(warmup):
            fwd_bwd(form, q, k, v)
    times = {(f, s): [] for f in forms for s in STATES}
    for r in range(rounds):
        for state in STATES:
            with busy_process(state == "loaded"):
                for form in forms:
                    times[form, state].append(fwd_bwd(form, q, k, v))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{f} {s} {times[f, s][-1] * 1e3:.0f} ms" for f, s in times),
              flush=True)
    return times


def report(times, forms) -> dict:
    med = {key: statistics.median(v) for key, v in times.items()}
    print()
    print("| state | " + " | ".join(f"{f} f+b ms" for f in forms) + " | "
          + " | ".join(f"SDPA / {f}" for f in forms if f != "sdpa") + " |")
    print("|---|" + "---|" * (len(forms) + sum(f != "sdpa" for f in forms)))
    adv = {}
    for state in STATES:
        cells = [f"{med[f, state] * 1e3:.1f}" for f in forms]
        for f in forms:
            if f != "sdpa" and "sdpa" in forms:
                adv[f, state] = med["sdpa", state] / med[f, state]
                cells.append(f"{adv[f, state]:.2f}×")
        print(f"| {state} | " + " | ".join(cells) + " |")
    print()
    if "sdpa" not in forms:
        return adv
    for f in forms:
        if f != "sdpa":
            keep = adv[f, "loaded"] / adv[f, "quiet"]
            print(f"{f}: loaded / quiet advantage {keep:.2f} (goal for the new plan: ≥ 0.80)")
    if "chunk" in forms and "chunk_old" in forms:
        print(f"quiet advantage, new / old plan: {adv['chunk', 'quiet'] / adv['chunk_old', 'quiet']:.3f} "
              "(goal: ≥ 0.95); time old / new: quiet "
              f"{med['chunk_old', 'quiet'] / med['chunk', 'quiet']:.3f}, loaded "
              f"{med['chunk_old', 'loaded'] / med['chunk', 'loaded']:.3f}")
    return adv


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--length", type=int, default=16384, help="sequence length N")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each quiet then loaded; medians reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each form before the rounds")
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    retained = retain_freed_memory()
    print(f"# chunk fwd+bwd vs SDPA, quiet and beside one busy process: B={B} H={H} N={args.length} d={D} float32 "
          f"causal, elu+1, RoPE numerator, C={C}")
    print(f"{machine_line()}, median of {args.rounds} rounds, freed memory kept: {retained}")
    return report(measure(args.length, args.rounds, args.forms, args.warmup), args.forms)


if __name__ == "__main__":
    main()
