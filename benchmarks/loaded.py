"""Loaded machine: the chunk kernel against softmax attention on a quiet machine and beside one busy process.

Forward+backward of these forms of benchmarks/forms.py (their legend is printed), B=1, H=8, d=64, float32, causal,
C=64, at N = ``--length`` (16 384): chunk (linrope chunk, its heads run as tasks on torch's threads), chunk-whole
(every head in one call), chunk-old (the plan before issue 31, timed interleaved with the new plan in the same
process) and sdpa.  Each round times every form once on the quiet machine, then once while a process this script
starts spins one thread (stopped after the round), so that drift of the machine hits both states alike.  Reported:
the median of each over the rounds, sdpa time ÷ form time (the form's advantage) in both states, and loaded
advantage ÷ quiet advantage.  Goals: loaded keeps ≥ 80% of the quiet advantage; quiet, the new plan keeps ≥ 95% of
the old plan's advantage.  Freed memory is kept for reuse, as train.py does.

Usage:  python benchmarks/loaded.py                      # N = 16 384, 5 rounds
        python benchmarks/loaded.py --length 4096 --rounds 3 --forms chunk sdpa
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, B, C, D, H, legend, make_inputs  # noqa: E402
from linrope.base.memory import retain_freed_memory  # noqa: E402

FORMS = ("chunk", "chunk-whole", "chunk-old", "sdpa")
STATES = ("quiet", "loaded")


def measure(length: int, rounds: int, forms, warmup: int = 1):
    """{(form, state): [seconds per round]}."""
    calls = {}
    for key in forms:
        (q, k, v), grad = make_inputs(REGISTRY[key], length)
        calls[key] = timing.passes(REGISTRY[key].build(C, torch.device("cpu")), q, k, v, grad)[0]
    times = {(f, s): [] for f in forms for s in STATES}
    for r in range(rounds):
        for state in STATES:
            with timing.busy_process(state == "loaded"):
                got = timing.rounds(calls, rounds=1, warmup=warmup if r == 0 and state == "quiet" else 0)
            for f in forms:
                times[f, state] += got[f]
        done = ", ".join(f"{f} {s} {times[f, s][-1] * 1e3:.0f} ms" for f, s in times)
        print(f"round {r + 1}/{rounds}: {done}", flush=True)
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
        kept = adv[f, "loaded"] / adv[f, "quiet"]
        print(f"{label[f]}: loaded / quiet advantage {kept:.2f} (goal for the new plan: ≥ 0.80)")
    if "chunk" in linear and "chunk-old" in linear:
        old_new = {s: med["chunk-old", s] / med["chunk", s] for s in STATES}
        print(
            f"quiet advantage, new / old plan: {adv['chunk', 'quiet'] / adv['chunk-old', 'quiet']:.3f} (goal: ≥ 0.95); "
            f"time old / new: quiet {old_new['quiet']:.3f}, loaded {old_new['loaded']:.3f}"
        )
    return adv


def main(argv=None) -> dict:
    p = timing.parser(__doc__)
    p.add_argument("--length", type=int, default=16384, help="sequence length N")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each quiet then loaded; medians reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each form before the rounds")
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS, help="keys of benchmarks/forms.py")
    args = p.parse_args(argv)
    timing.start(args)
    retained = retain_freed_memory()
    timing.header(
        f"loaded machine: fwd+bwd quiet and beside one busy process; B={B} H={H} N={args.length} d={D} float32 "
        f"causal, C={C}",
        f"median of {args.rounds} rounds, freed memory kept: {retained}",
    )
    print("\n".join(legend(args.forms)), flush=True)
    return report(measure(args.length, args.rounds, args.forms, args.warmup), args.forms)


if __name__ == "__main__":
    main()
