"""Kernel time: forward and forward+backward of attention forms, side by side, and their ratios.

One process, one row per (N, form), each printed as it is measured and labelled with what it times (the forms
and their labels: benchmarks/forms.py; the list is at the end of this help).  Per row: the median of
``--repeats`` timed forward+backward passes after ``--warmup`` untimed ones (CUDA events on a GPU), the forward
alone under ``torch.no_grad`` (the same), the peak memory allocated during one forward+backward above what was
allocated before it (CUDA only; on a CPU see benchmarks/memory.py) and the wall time of the very first call (on
a GPU: Triton's compile and fla's autotuning).  A form that fails (out of memory, an import, a kernel error)
becomes a row saying what failed, and the other forms go on; a form that cannot run here (fla's Triton kernels
on a CPU) says "unavailable".

Skipped rows say why: the naive form above ``--naive-max`` (it materialises B·H·N² weights), N not a multiple
the form needs, one forward+backward predicted (from the form's previous N: linear or quadratic in N) to take
longer than ``--max-run-s``, or the whole table's ``--budget-s`` spent or predicted to overrun.

After the rows:
  ratios      time of A ÷ time of B for each ``--ratios A/B`` pair, fwd and fwd+bwd, at each N where both ran
              (both measured above, in this process; > 1 means B is faster)
  growth      each form's fwd+bwd time at N ÷ its time at the first N, beside N ÷ first N
  FLOP rate   the forward of the chunked linear forms in GFLOP/s and as a share of a float32 matmul's rate
              measured in the same run (a ``--peak-size``³ torch.mm), with two counts per token and head:
              8·C·d + 8·d² (the count the targets were set in; twice the numerator's matmul work, so it can
              pass 100%) and 4·C·d + 4·d² (the numerator's matmuls QKᵀ, PV, KᵀV, Q·S at 2 FLOPs per
              multiply-add; denominator, feature map and RoPE not counted)

Shapes: B=1, H=8, d=64 (``--batch``, ``--heads``, ``--dim``), float32 (``--dtype``), causal, chunk C=64.  On a CPU
freed memory is kept for reuse by default, as train.py does (``--system-malloc`` leaves malloc alone).
``--jsonl`` appends each row as one JSON line as it is measured (benchmarks/gpu_check.py reads them);
``LINROPE_BENCH_FAIL=<key or label>[,…]`` makes those forms raise.  Exit status 1 if a row failed (on CUDA also
if a form was unavailable), else 0.

Usage:  python benchmarks/kernel_time.py --quick
        python benchmarks/kernel_time.py --lengths 8192 16384 65536 --max-run-s 40
        python benchmarks/kernel_time.py --lengths 16384 --forms chunk sdpa
        python benchmarks/kernel_time.py --lengths 65536 --forms chunk-none fla-naive-torch \
            --ratios fla-naive-torch/chunk-none
        python benchmarks/kernel_time.py --device cuda --dtype bf16 --forms sdpa-flash fla-triton fla chunk
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, FormUnavailable, legend, lookup, make_inputs, passes  # noqa: E402
from linrope.base.memory import retain_freed_memory  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ("N", "form", "fwd+bwd ms", "fwd ms", "peak MiB", "first call s", "status")
DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [1024, 2048, 4096]
DEFAULT_FORMS = {
    "cpu": ["chunk", "plain", "naive", "sdpa", "chunk-none", "plain-none", "fla-naive-torch"],
    "cuda": ["sdpa-flash", "fla-triton", "fla", "chunk"],
}
DEFAULT_RATIOS = {
    "cpu": ["sdpa/chunk", "plain/chunk", "naive/chunk", "fla-naive-torch/chunk-none", "plain-none/chunk-none"],
    "cuda": ["fla/fla-triton", "sdpa-flash/fla", "sdpa-flash/chunk"],
}
OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5: only torch.cuda's


def measure(key: str, n: int, args, device: torch.device) -> dict:
    form = REGISTRY[key]
    fn = form.build(args.chunk_size, device)
    (q, k, v), grad = make_inputs(
        form, n, device=device, dtype=DTYPES[args.dtype], batch=args.batch, heads=args.heads, dim=args.dim, seed=n
    )

    def checked(q, k, v):
        timing.forced_failure(key, form.label)
        return fn(q, k, v)

    fwd_bwd, fwd = passes(checked, q, k, v, grad)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    t0 = time.perf_counter()
    fwd_bwd()
    timing.sync(device)
    first = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if cuda else None
    reps = dict(warmup=args.warmup, repeats=args.repeats, device=device)
    return {
        "fwd_bwd_ms": timing.median_time(fwd_bwd, **reps) * 1e3,
        "fwd_ms": timing.median_time(fwd, **reps) * 1e3,
        "peak_mib": peak,
        "first_s": first,
    }


def failure_note(e: BaseException) -> str:
    """One line saying what failed: OOM named as such, else the exception's type and first line."""
    first = (str(e).strip().splitlines() or [""])[0][:160]
    if isinstance(e, OOM) or "out of memory" in first.lower():
        return f"OOM: {first}"
    return f"{type(e).__name__}: {first}"


def row_line(r: dict) -> str:
    status = r["status"] + (f": {r['note']}" if r.get("note") else "")
    return timing.table(
        COLUMNS,
        [
            [
                r["n"],
                r["form"],
                timing.fmt(r.get("fwd_bwd_ms")),
                timing.fmt(r.get("fwd_ms")),
                timing.fmt(r.get("peak_mib"), 0),
                timing.fmt(r.get("first_s"), 1),
                status,
            ]
        ],
    )[-1]


def skip_reason(key: str, n: int, args, last: dict, left: float) -> Optional[str]:
    form = REGISTRY[key]
    if key == "naive" and n > args.naive_max:
        return f"N above --naive-max {args.naive_max} (B·H·N² weights)"
    if n % form.multiple_of:
        return f"N is not a multiple of {form.multiple_of}"
    if left <= 0:
        return f"the table's budget of {args.budget_s:.0f} s was spent"
    if key in last:
        n0, t0 = last[key]
        per_run = t0 * (n / n0) ** form.growth
        if per_run > args.max_run_s:
            return f"one fwd+bwd predicted to take {per_run:.0f} s, over --max-run-s {args.max_run_s:g}"
        whole = per_run * 2 * (args.warmup + args.repeats + 1)  # fwd+bwd and fwd (a forward is less; a bound)
        if whole > left:
            return f"predicted {whole:.0f} s, {left:.0f} s of the budget left"
    return None


def run(args, device: torch.device, emit: Callable[[dict], None]) -> list[dict]:
    """Every (N, form) row in order, each handed to ``emit`` as it is known."""
    start = time.perf_counter()
    rows, last, dead = [], {}, {}
    for n in args.lengths:
        for key in args.forms:
            row = {
                "part": "kernels",
                "n": n,
                "form": REGISTRY[key].label,
                "key": key,
                "device": device.type,
                "dtype": args.dtype,
            }
            why = skip_reason(key, n, args, last, args.budget_s - (time.perf_counter() - start))
            if key in dead:
                row.update(dead[key])
            elif why is not None:
                row.update(status="skipped", note=why)
            else:
                try:
                    row.update(measure(key, n, args, device), status="ok")
                    last[key] = (n, row["fwd_bwd_ms"] / 1e3)
                except FormUnavailable as e:
                    row.update(status="unavailable", note=str(e))
                    dead[key] = {"status": "unavailable", "note": str(e)}
                except Exception as e:  # noqa: BLE001 - any failure of one form is that form's row
                    row.update(status="failed", note=failure_note(e))
                    if row["note"].startswith("OOM"):
                        dead[key] = {"status": "skipped", "note": f"OOM at N={n}"}
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            rows.append(row)
            emit(row)
    return rows


def summary(rows: list[dict], args, peak: Optional[float]) -> list[str]:
    """The ratios, growth and FLOP-rate tables of the rows measured."""
    ms = {
        (r["n"], r["key"], kind): r.get(kind) for r in rows if r["status"] == "ok" for kind in ("fwd_ms", "fwd_bwd_ms")
    }
    lengths = sorted({r["n"] for r in rows})
    out = ["", "Ratios: time of A ÷ time of B, both measured above in this process (> 1: B is faster)", ""]
    cells = []
    for pair in args.ratios:
        a, b = pair.split("/")
        for n in lengths:
            fwd, fb = (timing.ratio(ms.get((n, a, kind)), ms.get((n, b, kind))) for kind in ("fwd_ms", "fwd_bwd_ms"))
            if fwd or fb:
                cells.append(
                    [n, f"{REGISTRY[a].label} ÷ {REGISTRY[b].label}", timing.fmt_ratio(fwd), timing.fmt_ratio(fb)]
                )
    out += timing.table(["N", "ratio", "fwd", "fwd+bwd"], cells) if cells else ["(no pair measured at the same N)"]
    out += ["", "Growth: fwd+bwd time at N ÷ at the first N measured", ""]
    cells = []
    for key in args.forms:
        got = [(n, ms[n, key, "fwd_bwd_ms"]) for n in lengths if ms.get((n, key, "fwd_bwd_ms"))]
        cells += [
            [REGISTRY[key].label, f"{got[0][0]} → {n}", f"{t / got[0][1]:.2f}", f"{n / got[0][0]:g}"]
            for n, t in got[1:]
        ]
    out += timing.table(["form", "N", "time ratio", "N ratio"], cells) if cells else ["(one N only)"]
    counts = {
        "8·C·d + 8·d²": 8 * args.chunk_size * args.dim + 8 * args.dim**2,
        "4·C·d + 4·d²": 4 * args.chunk_size * args.dim + 4 * args.dim**2,
    }
    cells = []
    for n in lengths:
        for key in args.forms:
            t = ms.get((n, key, "fwd_ms"))
            if t and REGISTRY[key].chunk_flops:
                rates = [args.batch * args.heads * n * c / (t / 1e3) / 1e9 for c in counts.values()]
                cells.append(
                    [n, REGISTRY[key].label]
                    + [x for r in rates for x in (f"{r:.1f}", f"{100 * r / peak:.0f}%" if peak else "–")]
                )
    if cells:
        where = (
            f"float32 matmul peak ({args.peak_size}³ torch.mm) {peak:.1f} GFLOP/s"
            if peak
            else "no matmul peak measured (--peak-size 0)"
        )
        out += ["", f"FLOP rate of the forward; {where}", ""]
        out += timing.table(["N", "form"] + [h for c in counts for h in (f"GFLOP/s ({c})", "% of peak")], cells)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__ + "\nForms (--forms takes the key in brackets or the label):\n" + "\n".join(legend(REGISTRY)),
    )
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths N (default 1k … 64k)")
    p.add_argument("--quick", action="store_true", help="N = 1k, 2k, 4k only (a smoke run)")
    p.add_argument(
        "--forms",
        nargs="+",
        default=None,
        metavar="FORM",
        help="forms to time, in this order at each N (default on cpu: "
        f"{' '.join(DEFAULT_FORMS['cpu'])}; on cuda: {' '.join(DEFAULT_FORMS['cuda'])})",
    )
    p.add_argument(
        "--ratios",
        nargs="+",
        default=None,
        metavar="A/B",
        help="time ratios to print, each of two forms' keys (default on cpu: "
        f"{' '.join(DEFAULT_RATIOS['cpu'])}; on cuda: {' '.join(DEFAULT_RATIOS['cuda'])})",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="input dtype (default fp32)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=64, help="chunk size C of linrope's and the plain chunk form")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement; the median is reported")
    p.add_argument("--naive-max", type=int, default=4096, help="largest N for the naive form (B·H·N² weights)")
    p.add_argument(
        "--max-run-s",
        type=float,
        default=20.0,
        help="skip a form at an N where one fwd+bwd is predicted to take longer than this (default 20)",
    )
    p.add_argument("--budget-s", type=float, default=math.inf, help="wall-clock budget of the whole table")
    p.add_argument("--peak-size", type=int, default=2048, help="size of the matmul whose rate is the peak (0: none)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave malloc as it is; by default freed memory is kept for reuse, as train.py does "
        "(linrope.base.memory.retain_freed_memory), for every form alike",
    )
    p.add_argument("--jsonl", type=Path, default=None, help="append each row here as one JSON line")
    args = p.parse_args(argv)
    kind = torch.device(args.device).type
    args.lengths = args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    try:
        args.forms = [lookup(f).key for f in args.forms or DEFAULT_FORMS[kind]]
        pairs = [r.split("/") for r in args.ratios or DEFAULT_RATIOS[kind]]
        args.ratios = [f"{lookup(a).key}/{lookup(b).key}" for a, b in pairs]
    except (KeyError, ValueError) as e:
        p.error(f"--forms/--ratios: {e.args[0] if e.args else e} (a ratio is two forms' keys, A/B)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    timing.set_threads(args.threads)
    retained = False if args.system_malloc else retain_freed_memory()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    timing.header(
        f"kernel time: {where}; B={args.batch}, H={args.heads}, d={args.dim}, {args.dtype}, causal, "
        f"C={args.chunk_size}",
        f"fwd+bwd and fwd: median of {args.repeats} after {args.warmup} warm-up; malloc: "
        + ("freed memory kept for reuse" if retained else "as the system has it"),
    )
    print("\n".join(["Forms:"] + legend(args.forms) + [""] + timing.table(COLUMNS, [])[:2]), flush=True)

    def emit(row):
        print(row_line(row), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")

    rows = run(args, device, emit)
    peak = timing.matmul_rate(args.peak_size, device=device) if args.peak_size else None
    print("\n".join(summary(rows, args, peak)), flush=True)
    bad = [r for r in rows if r["status"] == "failed" or (r["status"] == "unavailable" and device.type == "cuda")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
