"""Kernel time: forward and forward+backward of attention forms, side by side, and their ratios.

One process, one row per (N, form), printed as it is measured and labelled with what it times (benchmarks/forms.py;
the list ends this help): the median fwd+bwd and forward (under no_grad) of ``--repeats`` runs after ``--warmup``,
the peak memory allocated during one fwd+bwd above what was allocated before it (CUDA only; on a CPU see
benchmarks/memory.py) and the wall time of the first call (on a GPU: Triton's compile and fla's autotuning).  A form
that fails becomes a row saying what failed (OOM named as such; the form is skipped at larger N after an OOM); one
that cannot run here says "unavailable".  A row is skipped, saying why, above ``--naive-max`` for the naive form, at
an N that is not a multiple the form needs, or when one fwd+bwd is predicted (from the form's previous N, linear or
quadratic) to take over ``--max-run-s`` or the table's ``--budget-s`` would overrun.  The rows are B = ``--batch`` at
each of ``--lengths``, then one per ``--shapes BxN`` (another batch, e.g. a training step's shape).

After the rows: the time ratios A ÷ B of each ``--ratios A/B`` pair (both measured in this process; > 1: B is
faster); each form's growth (time at N ÷ at the first N); the forward's FLOP rate of the chunked linear forms, as a
share of a ``--peak-size``³ float32 torch.mm timed in the same run, for two counts per token and head: 8·C·d + 8·d²
(the count the targets were set in, twice the numerator's matmul work, so it can pass 100%) and 4·C·d + 4·d² (the
numerator's matmuls QKᵀ, PV, KᵀV, Q·S).

``--profile N…``: then each form measured at those N runs one more fwd+bwd under torch.profiler, and its time is
listed by kernel (on a CPU by operator), its own time summed by name: where a form spends it (the device check's
``--triton`` asks for 16k and 64k).

On CUDA (``--device cuda``) it is the device check's kernel table: by default sdpa flash, fla chunk_simple_gla (fla's
own Triton kernel: the speed bound), linrope on fla and linrope chunk, bf16, N = 1k, 4k, 16k, 64k, the median of 10
after 3 warm-up, no per-run limit, a table budget of 600 s and no matmul peak; without a CUDA GPU it says so and
measures nothing.  ``--jsonl`` appends each row as one JSON line (benchmarks/gpu_check.py reads them);
``LINROPE_BENCH_FAIL=<key or label>[,…]`` makes those forms raise.  Exit status 1 if a row failed (on CUDA also if
a form was unavailable).

Usage:  python benchmarks/kernel_time.py --quick
        python benchmarks/kernel_time.py --lengths 8192 16384 65536 --max-run-s 40
        python benchmarks/kernel_time.py --lengths 16384 --forms chunk sdpa
        python benchmarks/kernel_time.py --lengths 65536 --forms chunk-none fla-naive-torch \
            --ratios fla-naive-torch/chunk-none
        python benchmarks/kernel_time.py --device cuda
        python benchmarks/kernel_time.py --device cuda --lengths 1024 16384 --forms "sdpa flash" "linrope on fla"
        python benchmarks/kernel_time.py --device cuda --lengths 65536 --forms fla-triton triton --profile 65536
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, FormUnavailable, legend, lookup, make_inputs  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ("B", "N", "form", "fwd+bwd ms", "fwd ms", "peak MiB", "first call s", "status")
DEFAULT_FORMS = {
    "cpu": ["chunk", "plain", "naive", "sdpa", "chunk-none", "plain-none", "fla-naive-torch"],
    "cuda": ["sdpa-flash", "fla-triton", "fla", "chunk"],
}
DEFAULT_RATIOS = {
    "cpu": ["sdpa/chunk", "plain/chunk", "naive/chunk", "fla-naive-torch/chunk-none", "plain-none/chunk-none"],
    "cuda": ["fla/fla-triton", "sdpa-flash/fla", "sdpa-flash/chunk"],
}
DEFAULTS = {  # option: (default on cpu, on cuda: the device check's kernel table)
    "dtype": ("fp32", "bf16"),
    "lengths": ([2**i for i in range(10, 17)], [1024, 4096, 16384, 65536]),
    "warmup": (1, 3),
    "repeats": (5, 10),
    "max_run_s": (20.0, math.inf),
    "budget_s": (math.inf, 600.0),
    "peak_size": (2048, 0),
}
NEEDS_GPU = "--device cuda: no CUDA GPU here (torch.cuda.is_available() is False): nothing was measured"


def passes(key: str, b: int, n: int, args, device: torch.device):
    """(fwd+bwd, fwd) of form ``key`` on its inputs at (B, N) = (b, n): the calls a row times and a profile runs
    (``LINROPE_BENCH_FAIL`` can make the form raise)."""
    form = REGISTRY[key]
    fn = form.build(args.chunk_size, device)
    shape = dict(batch=b, heads=args.heads, dim=args.dim)
    (q, k, v), grad = make_inputs(form, n, device=device, dtype=DTYPES[args.dtype], seed=n, **shape)

    @functools.wraps(fn)  # keeps the form's ``plan`` (timing.passes)
    def checked(q, k, v):
        timing.forced_failure(key, form.label)
        return fn(q, k, v)

    return timing.passes(checked, q, k, v, grad)


def measure(key: str, b: int, n: int, args, device: torch.device) -> dict:
    fwd_bwd, fwd = passes(key, b, n, args, device)
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
    fb_ms, fwd_ms = (timing.median_time(f, **reps) * 1e3 for f in (fwd_bwd, fwd))
    return {"fwd_bwd_ms": fb_ms, "fwd_ms": fwd_ms, "peak_mib": peak, "first_s": first}


def row_line(r: dict) -> str:
    cells = [timing.fmt(r.get(k), d) for k, d in (("fwd_bwd_ms", 2), ("fwd_ms", 2), ("peak_mib", 0), ("first_s", 1))]
    return timing.table(COLUMNS, [[r["batch"], r["n"], r["form"], *cells, timing.status(r)]])[-1]


def skip_reason(key: str, b: int, n: int, args, last: dict, left: float) -> Optional[str]:
    form = REGISTRY[key]
    if key == "naive" and n > args.naive_max:
        return f"N above --naive-max {args.naive_max} (B·H·N² weights)"
    if n % form.multiple_of:
        return f"N is not a multiple of {form.multiple_of}"
    if left <= 0:
        return f"the table's budget of {args.budget_s:.0f} s was spent"
    if key in last:
        b0, n0, t0 = last[key]
        per_run = t0 * (b / b0) * (n / n0) ** form.growth
        if per_run > args.max_run_s:
            return f"one fwd+bwd predicted to take {per_run:.0f} s, over --max-run-s {args.max_run_s:g}"
        whole = per_run * 2 * (args.warmup + args.repeats + 1)  # fwd+bwd and fwd (a forward is less; a bound)
        if whole > left:
            return f"predicted {whole:.0f} s, {left:.0f} s of the budget left"
    return None


def run(args, device: torch.device, emit: Callable[[dict], None]) -> list[dict]:
    """Every (B, N, form) row in order, each handed to ``emit`` as it is known."""
    start = time.perf_counter()
    rows, last, dead = [], {}, {}
    for b, n in shapes(args):
        for key in args.forms:
            row = dict(part="kernels", batch=b, n=n, form=REGISTRY[key].label, key=key, device=device.type)
            row["dtype"] = args.dtype
            why = skip_reason(key, b, n, args, last, args.budget_s - (time.perf_counter() - start))
            if key in dead:
                row.update(dead[key])
            elif why is not None:
                row.update(status="skipped", note=why)
            else:
                try:
                    row.update(measure(key, b, n, args, device), status="ok")
                    last[key] = (b, n, row["fwd_bwd_ms"] / 1e3)
                except FormUnavailable as e:
                    row.update(status="unavailable", note=str(e))
                    dead[key] = {"status": "unavailable", "note": str(e)}
                except Exception as e:  # noqa: BLE001 - any failure of one form is that form's row
                    row.update(status="failed", note=timing.failure_note(e))
                    if row["note"].startswith("OOM"):
                        dead[key] = {"status": "skipped", "note": f"OOM at B={b}, N={n}"}
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            rows.append(row)
            emit(row)
    return rows


def summary(rows: list[dict], args, peak: Optional[float]) -> list[str]:
    """The ratios, growth and FLOP-rate tables of the rows measured."""
    ok = [r for r in rows if r["status"] == "ok"]
    ms = {(r["batch"], r["n"], r["key"], kind): r[kind] for r in ok for kind in ("fwd_ms", "fwd_bwd_ms")}
    measured = shapes(args)
    label = {k: f.label for k, f in REGISTRY.items()}
    out = ["", "Ratios: time of A ÷ time of B, both measured above in this process (> 1: B is faster)", ""]
    cells = []
    for x, y in (pair.split("/") for pair in args.ratios):
        for b, n in measured:
            times = ((ms.get((b, n, x, kind)), ms.get((b, n, y, kind))) for kind in ("fwd_ms", "fwd_bwd_ms"))
            fwd, fb = (timing.ratio(*pair) for pair in times)
            if fwd or fb:
                cells.append([b, n, f"{label[x]} ÷ {label[y]}", timing.fmt_ratio(fwd), timing.fmt_ratio(fb)])
    out += timing.table(["B", "N", "ratio", "fwd", "fwd+bwd"], cells) if cells else ["(no pair measured at one shape)"]
    out += ["", f"Growth: fwd+bwd time at N ÷ at the first N measured (B = {args.batch})", ""]
    cells, b = [], args.batch
    for key in args.forms:
        got = [(n, ms[b, n, key, "fwd_bwd_ms"]) for n in args.lengths if (b, n, key, "fwd_bwd_ms") in ms]
        cells += [[label[key], f"{got[0][0]} → {n}", f"{t / got[0][1]:.2f}", f"{n / got[0][0]:g}"] for n, t in got[1:]]
    out += timing.table(["form", "N", "time ratio", "N ratio"], cells) if cells else ["(one N only)"]
    cs, d = args.chunk_size, args.dim
    counts = {"8·C·d + 8·d²": 8 * cs * d + 8 * d**2, "4·C·d + 4·d²": 4 * cs * d + 4 * d**2}
    cells = []
    for b, n in measured:
        for key in args.forms:
            t = ms.get((b, n, key, "fwd_ms"))
            if t and REGISTRY[key].chunk_flops:
                rates = [b * args.heads * n * c / (t / 1e3) / 1e9 for c in counts.values()]
                cells.append(
                    [b, n, label[key]]
                    + [x for r in rates for x in (f"{r:.1f}", f"{100 * r / peak:.0f}%" if peak else "–")]
                )
    if cells:
        where = f"float32 matmul peak ({args.peak_size}³ torch.mm) {peak:.1f} GFLOP/s" if peak else "--peak-size 0"
        out += ["", f"FLOP rate of the forward; {where}", ""]
        out += timing.table(["B", "N", "form"] + [h for c in counts for h in (f"GFLOP/s ({c})", "% of peak")], cells)
    return out


def autotuned() -> list[str]:
    """The num_warps Triton's autotuner chose for linrope's Triton kernels in this process, one line per kernel and
    key (none if they did not run)."""
    kernels = sys.modules.get("linrope.ops.linear_attn.triton_kernels")
    out = []
    for name, kernel in (vars(kernels) if kernels is not None else {}).items():
        if not hasattr(kernel, "configs"):  # not an Autotuner (a plain kernel may keep a cache of its own)
            continue
        for key, config in kernel.cache.items():  # its key's values, then the tensors' dtypes
            named = ", ".join(f"{k} {v}" for k, v in zip(kernel.keys, key))
            out.append(
                f"{name} ({named}; {', '.join(map(str, key[len(kernel.keys) :]))}): num_warps {config.num_warps}"
            )
    return ["", "Autotuned (linrope triton):", *out] if out else []


PROFILE_TOP = 8  # kernels listed per (form, N) in the profile; the rest summed in one line
PROFILE_S = 20.0  # the profile's time after the table's --budget-s: one not begun by then is skipped


def profile(args, device: torch.device, rows: list[dict], emit: Callable[[dict], None], deadline: float) -> list[dict]:
    """Where the time of one fwd+bwd goes: each form measured at a ``--profile`` N (B = ``--batch``) runs once more
    (compiled, warm) under torch.profiler, and its kernels' own device time (CPU: its operators' own CPU time) is
    summed by name: a row per kernel, the largest ``PROFILE_TOP``, then the rest, each with its share of the pass.
    A diagnostic: a profile that fails (no CUPTI, say) is its row and leaves the exit status alone; one not begun
    by ``deadline`` (``time.perf_counter()``) is skipped, saying so."""
    measured = {(r["n"], r["key"]) for r in rows if r["status"] == "ok" and r["batch"] == args.batch}
    out = []
    for n in args.profile:
        for key in (k for k in args.forms if (n, k) in measured):
            label = REGISTRY[key].label
            base = dict(part="kernels:profile", batch=args.batch, n=n, form=label, key=key, device=device.type)
            none = dict(calls=0, ms=None, share=None)
            if time.perf_counter() > deadline:
                note = f"the table's budget and {PROFILE_S:.0f} s more are spent"
                listed = [dict(none, kernel="(not profiled)", status="skipped", note=note)]
            else:
                try:
                    listed = _profiled(key, n, args, device)
                except Exception as e:  # noqa: BLE001 - a diagnostic: its failure is its row, the table stands
                    listed = [dict(none, kernel="(profile failed)", status="failed", note=timing.failure_note(e))]
            for row in listed:
                out.append(dict(base, **row))
                emit(out[-1])
    return out


def _profiled(key: str, n: int, args, device: torch.device) -> list[dict]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    cuda = device.type == "cuda"
    fwd_bwd, _ = passes(key, args.batch, n, args, device)
    fwd_bwd()
    timing.sync(device)
    with profiler(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fwd_bwd()
        timing.sync(device)
    own = {}
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            calls, total = own.get(e.key, (0, 0.0))
            own[e.key] = (calls + e.count, total + us)
    if not own:
        return [dict(kernel="(no events recorded)", calls=0, ms=None, share=None, status="empty")]
    whole = sum(us for _, us in own.values())
    ranked = sorted(own.items(), key=lambda item: -item[1][1])
    rest = ranked[PROFILE_TOP:]
    if rest:
        ranked = ranked[:PROFILE_TOP] + [(f"({len(rest)} others)", tuple(map(sum, zip(*(x for _, x in rest)))))]
    return [dict(kernel=name[:80], calls=c, ms=us / 1e3, share=us / whole, status="ok") for name, (c, us) in ranked]


def profile_share(r: dict) -> str:
    """A profile row's share of its pass, or why it has none (the device check's report prints the same)."""
    return f"{100 * r['share']:.0f}%" if r.get("share") is not None else r.get("note", "–")


def profile_line(r: dict) -> str:
    cells = [r["batch"], r["n"], r["form"], r["kernel"], r["calls"], timing.fmt(r.get("ms"), 3), profile_share(r)]
    return timing.table(PROFILE_COLUMNS, [cells])[-1]


PROFILE_COLUMNS = ("B", "N", "form", "kernel (own time)", "calls", "ms", "share of the pass")


def shapes(args) -> list[tuple[int, int]]:
    """The (B, N) of the table's rows, in order: ``--batch`` at each of ``--lengths``, then ``--shapes``."""
    return [(args.batch, n) for n in args.lengths] + list(args.shapes)


def batch_by_length(text: str) -> tuple[int, int]:
    """argparse's reading of a ``--shapes`` entry: ``BxN`` -> (B, N)."""
    b, x, n = text.lower().partition("x")
    if not (x and b.isdigit() and n.isdigit() and int(b) > 0 and int(n) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not BxN (a batch and a length, e.g. 4x4096)")
    return int(b), int(n)


def parse_args(argv=None):
    p = timing.parser(
        __doc__,
        malloc=True,
        epilog="\nForms (--forms takes the key in brackets or the label):\n" + "\n".join(legend(REGISTRY)),
    )
    p.add_argument(
        "--lengths", type=int, nargs="+", help="sequence lengths N (default 1k, 2k, … 64k; on cuda 1k, 4k, 16k, 64k)"
    )
    p.add_argument(
        "--shapes", type=batch_by_length, nargs="+", default=[], metavar="BxN", help="more rows at another batch"
    )
    p.add_argument("--quick", action="store_true", help="N = 1k, 2k, 4k only (a smoke run)")
    for name, default, what in (
        ("forms", DEFAULT_FORMS, "forms to time, in this order at each N"),
        ("ratios", DEFAULT_RATIOS, "time ratios A/B to print, each of two forms' keys"),
    ):
        on = "; ".join(f"on {kind}: {' '.join(v)}" for kind, v in default.items())
        p.add_argument(f"--{name}", nargs="+", default=None, help=f"{what} (default {on})")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", choices=DTYPES, help="input dtype (default fp32; on cuda bf16)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=64, help="chunk size C of linrope's and the plain chunk form")
    p.add_argument("--warmup", type=int, help="untimed runs before timing (default 1; on cuda 3)")
    p.add_argument("--repeats", type=int, help="timed runs per measurement; the median is reported (5; on cuda 10)")
    p.add_argument("--naive-max", type=int, default=4096, help="largest N for the naive form (B·H·N² weights)")
    p.add_argument("--max-run-s", type=float, help="longest predicted fwd+bwd run at an N (20; on cuda no limit)")
    p.add_argument("--budget-s", type=float, help="wall-clock budget of the whole table (none; on cuda 600)")
    p.add_argument("--peak-size", type=int, help="size of the matmul whose rate is the peak (0: none; 2048, cuda 0)")
    p.add_argument("--jsonl", type=Path, default=None, help="append each row here as one JSON line")
    p.add_argument(
        "--profile",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="after the table, one fwd+bwd of each form measured at these N under torch.profiler: time by kernel",
    )
    args = p.parse_args(argv)
    kind = torch.device(args.device).type
    if args.quick and args.lengths is None:
        args.lengths = [1024, 2048, 4096]
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default[kind == "cuda"])
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
    if device.type == "cuda" and not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    malloc = timing.start(args)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    timing.header(
        f"kernel time: {where}; B={args.batch}, H={args.heads}, d={args.dim}, {args.dtype}, causal, C={args.chunk_size}",
        f"fwd+bwd and fwd: median of {args.repeats} after {args.warmup} warm-up; malloc: {malloc}",
    )
    print("\n".join(["Forms:"] + legend(args.forms) + [""] + timing.table(COLUMNS, [])[:2]), flush=True)

    def emit(row):
        print(row_line(row), flush=True)
        timing.append_jsonl(args.jsonl, row)

    start = time.perf_counter()
    rows = run(args, device, emit)
    peak = timing.matmul_rate(args.peak_size, device=device) if args.peak_size else None
    print("\n".join(summary(rows, args, peak) + autotuned()), flush=True)
    if args.profile:
        kind = "device time of each kernel" if device.type == "cuda" else "CPU time of each operator"
        print(f"\nWhere one fwd+bwd's time goes (torch.profiler; the {kind}, its own, summed by name):\n", flush=True)
        print("\n".join(timing.table(PROFILE_COLUMNS, [])[:2]), flush=True)

        def emit_profile(row):
            print(profile_line(row), flush=True)
            timing.append_jsonl(args.jsonl, row)

        profile(args, device, rows, emit_profile, start + args.budget_s + PROFILE_S)
    bad = [r for r in rows if r["status"] == "failed" or (r["status"] == "unavailable" and device.type == "cuda")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
