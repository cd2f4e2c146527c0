"""Loaded machine: the chunk kernel against softmax attention on a quiet machine and beside one busy process.

Forward+backward of three forms of benchmarks/forms.py, B=1, H=8, d=64, float32, causal, C=64, at N =
``--length`` (16 384):

  chunk      linrope chunk: ``linear_attention(impl="chunk")``, elu+1, RoPE in the numerator; on the CPU its heads
             run as tasks on torch's threads (linrope.ops.linear_attn.heads)
  chunk-whole the same with every head in one call, each operation split between the threads (heads off)
  chunk-old  linrope chunk, old plan: the same kernel with the plan before issue 31 (``scans.SEQUENTIAL = True``:
             a Python loop over chunks in every scan; ``heads.ENABLED = False``: every head in one call, blocks of
             512 positions however long the sequence), timed interleaved with the new plan in the same process
  sdpa       sdpa softmax: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``

Each round times every form twice (benchmarks/timing.py): once on the quiet machine, then once while a competing
process that this script starts spins one thread (``python -c "while True: pass"``; stopped after the round),
so that drift of the machine hits both states alike.  Reported: the median of each over the rounds, sdpa time ÷
chunk time (the chunk form's advantage) in both states, and loaded advantage ÷ quiet advantage.  Goals: loaded
keeps ≥ 80% of the quiet advantage; quiet, the new plan keeps ≥ 95% of the old plan's advantage.

On 2 cores, two threads (torch's default here) meet the busy process in every OpenMP region: a region waits
for its descheduled thread, so a kernel of many small operations slows most.

Usage:  python benchmarks/loaded.py                      # N = 16 384, 5 rounds
        python benchmarks/loaded.py --length 4096 --rounds 3 --forms chunk sdpa
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, B, C, D, H, make_inputs, passes  # noqa: E402
from linrope.base.memory import retain_freed_memory  # noqa: E402

FORMS = ("chunk", "chunk-whole", "chunk-old", "sdpa")
STATES = ("quiet", "loaded")


def measure(length: int, rounds: int, forms, warmup: int = 1):
    """{(form, state): [seconds per round]}."""
    calls = {}
    for key in forms:
        form = REGISTRY[key]
        (q, k, v), grad = make_inputs(form, length)
        calls[key] = passes(form.build(C, torch.device("cpu")), q, k, v, grad)[0]
    times = {(f, s): [] for f in forms for s in STATES}
    for r in range(rounds):
        for state in STATES:
            with timing.busy_process(state == "loaded"):
                got = timing.rounds(calls, rounds=1, warmup=warmup if r == 0 and state == "quiet" else 0)
            for f in forms:
                times[f, state] += got[f]
        print(
            f"round {r + 1}/{rounds}: " + ", ".join(f"{f} {s} {times[f, s][-1] * 1e3:.0f} ms" for f, s in times),
            flush=True,
        )
    return times


def report(times, forms) -> dict:
    """The table of medians and advantages (sdpa time ÷ form time), each column labelled with its form."""
    med = timing.medians(times)
    label = {f: REGISTRY[f].label for f in forms}
    linear = [f for f in forms if f != "sdpa"] if "sdpa" in forms else []
    adv = {(f, s): med["sdpa", s] / med[f, s] for f in linear for s in STATES}
    head = ["state"] + [f"{label[f]} f+b ms" for f in forms] + [f"{label['sdpa']} ÷ {label[f]}" for f in linear]
    rows = [
        [s] + [f"{med[f, s] * 1e3:.1f}" for f in forms] + [timing.fmt_ratio(adv[f, s]) for f in linear] for s in STATES
    ]
    print("\n".join([""] + timing.table(head, rows) + [""]))
    for f in linear:
        print(
            f"{label[f]}: loaded / quiet advantage {adv[f, 'loaded'] / adv[f, 'quiet']:.2f} "
            "(goal for the new plan: ≥ 0.80)"
        )
    if "chunk" in linear and "chunk-old" in linear:
        print(
            f"quiet advantage, new / old plan: {adv['chunk', 'quiet'] / adv['chunk-old', 'quiet']:.3f} "
            "(goal: ≥ 0.95); time old / new: quiet "
            f"{med['chunk-old', 'quiet'] / med['chunk', 'quiet']:.3f}, loaded "
            f"{med['chunk-old', 'loaded'] / med['chunk', 'loaded']:.3f}"
        )
    return adv


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--length", type=int, default=16384, help="sequence length N")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each quiet then loaded; medians reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each form before the rounds")
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS, help="keys of benchmarks/forms.py")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    args = p.parse_args(argv)
    timing.set_threads(args.threads)
    retained = retain_freed_memory()
    timing.header(
        f"loaded machine: fwd+bwd quiet and beside one busy process; B={B} H={H} N={args.length} d={D} "
        f"float32 causal, C={C}",
        f"median of {args.rounds} rounds, freed memory kept: {retained}",
    )
    return report(measure(args.length, args.rounds, args.forms, args.warmup), args.forms)


if __name__ == "__main__":
    main()
