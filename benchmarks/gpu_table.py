"""GPU table: linrope's chunk kernel, fla's kernels (impl="fla") and SDPA (FlashAttention), forward+backward.

Needs a CUDA GPU (and, for the fla column, the ``gpu`` extra: ``pip install -e '.[gpu]'``); without a GPU it
says so and measures nothing.  Shapes: B=1, H=8, d=64, bfloat16 inputs, causal; linear attention with the
elu+1 feature map and RoPE in the numerator (``--decay`` adds a per-head decay, as ALiBi's linear presets do).
N from 2k to 64k by default.  For each N and form, in this one process (so the ratios compare like with like):
the median of ``--repeats`` timed forward+backward passes (CUDA events, after ``--warmup`` untimed ones), the
forward alone under ``torch.no_grad``, and the peak memory allocated during one forward+backward.  Every
time is also given as a ratio to the ``--baseline`` form at the same N.  A form whose time predicted from the
previous N (linear for chunk and fla, quadratic for sdpa) exceeds ``--budget-s`` is skipped.

Usage:  python benchmarks/gpu_table.py
        python benchmarks/gpu_table.py --lengths 2048 16384 65536 --baseline sdpa --json gpu_table.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.ops import linear_attention  # noqa: E402
from linrope.ops.linear_attn import fla_backend  # noqa: E402

NEEDS_GPU = ("benchmarks/gpu_table.py needs a CUDA GPU (torch.cuda.is_available() is False here): "
             "nothing was measured")
FORMS = ("chunk", "fla", "sdpa")
GROWTH = {"chunk": 1, "fla": 1, "sdpa": 2}  # how time grows with N (for the budget)


def sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def form_fn(name: str, decay):
    if name == "sdpa":
        return sdpa
    return lambda q, k, v: linear_attention(q, k, v, impl=name, decay=decay)


def timed(fn, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, CUDA events around each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure(name: str, n: int, args) -> dict:
    g = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(1, args.heads, n, args.dim, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    decay = torch.linspace(0.9, 0.999, args.heads, device="cuda") if args.decay else None
    fn = form_fn(name, decay)
    grad = torch.randn(1, args.heads, n, args.dim, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return {"fwd_bwd_s": timed(fwd_bwd, warmup=args.warmup, repeats=args.repeats),
            "fwd_s": timed(fwd, warmup=args.warmup, repeats=args.repeats), "peak_mib": peak}


def run(args) -> dict:
    forms = [f for f in args.forms if f != "fla" or fla_backend.unavailable("cuda") is None]
    skipped = {f: fla_backend.unavailable("cuda") for f in args.forms if f not in forms}
    results, last = {}, {}
    for n in args.lengths:
        for name in forms:
            if name in last:
                n0, t0 = last[name]
                if t0 * (n / n0) ** GROWTH[name] > args.budget_s:
                    results.setdefault(n, {})[name] = None
                    continue
            results.setdefault(n, {})[name] = r = measure(name, n, args)
            last[name] = (n, r["fwd_bwd_s"])
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "fla": fla_backend.FLA_VERSION,
            "heads": args.heads, "dim": args.dim, "decay": args.decay, "baseline": args.baseline,
            "skipped_forms": skipped, "results": results}


def table(report: dict) -> str:
    base = report["baseline"]
    forms = sorted({f for row in report["results"].values() for f in row}, key=FORMS.index)
    head = ["N"] + [f"{f} fwd+bwd ms (×{base})" for f in forms] + [f"{f} fwd ms" for f in forms] + \
        [f"{f} peak MiB" for f in forms]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, row in report["results"].items():
        b = (row.get(base) or {}).get("fwd_bwd_s")
        cells = [str(n)]
        for f in forms:
            r = row.get(f)
            cells.append("skipped" if r is None else
                         f"{r['fwd_bwd_s'] * 1e3:.2f}" + (f" ({r['fwd_bwd_s'] / b:.2f}×)" if b else ""))
        cells += ["skipped" if row.get(f) is None else f"{row[f]['fwd_s'] * 1e3:.2f}" for f in forms]
        cells += ["skipped" if row.get(f) is None else f"{row[f]['peak_mib']:.0f}" for f in forms]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768, 65536])
    p.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    p.add_argument("--baseline", choices=FORMS, default="sdpa")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--decay", action="store_true", help="a per-head decay in the linear forms")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=5.0, help="skip a form whose predicted fwd+bwd exceeds this")
    p.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    report = run(args)
    print(f"{report['device']}, torch {report['torch']}, fla-core {report['fla']}; B=1, H={args.heads}, "
          f"d={args.dim}, bfloat16, causal{', decay' if args.decay else ''}; median of {args.repeats}")
    for form, why in report["skipped_forms"].items():
        print(f"{form} column skipped: {why}")
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
