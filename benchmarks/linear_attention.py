"""Benchmark: chunked linear attention against the naive form and softmax attention (torch SDPA).

Shapes follow issue #3: B=1, H=8, d=64, float32, causal, feature map elu+1, RoPE in the numerator,
N from 1k to 64k.  For each N it times, in this one process (so that the ratios compare like with like):

  * ``chunk``  – linrope's chunked linear attention (``impl="chunk"``),
  * ``naive``  – linrope's quadratic reference, only up to ``--naive-max`` (it materialises B·H·N² weights),
  * ``sdpa``   – ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on the same q, k, v,
  * ``fla``    – flash-linear-attention's ``naive_chunk_linear_attn`` when ``fla`` is importable
                 (no feature map, RoPE or normaliser there: a kernel-only row),

forward (under ``torch.no_grad``) and forward+backward, after warm-up runs, as the median of ``--repeats``.
A form is skipped at an N where its time predicted from the previous N (quadratic for naive/sdpa, linear
for chunk) exceeds ``--budget-s`` per run.

Memory: the peak resident set size (``VmHWM`` of /proc/self/status, reset just before the call) of a fresh
child process that runs one forward+backward of one form at N = 256 (one-time library set-up), builds the
inputs and runs one forward+backward at N, minus its RSS just before that call.  It is what the operating system saw (allocator caching included), not a count of tensor
bytes.  (``ru_maxrss`` is no use here: Linux carries it over from the parent across fork/exec.)

FLOPs: the issue's count for chunked linear attention, 8·C·d + 8·d² per token per head (C = chunk size),
applied to the forward, and beside it the numerator's own matmuls (QKᵀ, PV, KᵀV, Q·S: 4·C·d + 4·d²; the
issue's count is twice that, so its rate can pass 100% of peak).  Both rates are set against a float32
matmul peak measured in the same run (the median rate of a 2048³ ``torch.mm``).

Usage:  python benchmarks/linear_attention.py --quick
        python benchmarks/linear_attention.py --lengths 1024 2048 4096 --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.ops import linear_attention  # noqa: E402

B, H, D = 1, 8, 64
DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [1024, 2048, 4096]


# ------------------------------------------------------------------------------------------------------
# the forms being timed
# ------------------------------------------------------------------------------------------------------
def make_inputs(n: int, requires_grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def fla_callable():
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except Exception:  # noqa: BLE001 - any failure to import means "no row"
        return None

    def run(q, k, v):  # recent fla takes (B, N, H, d); older releases (B, H, N, d)
        try:
            return naive_chunk_linear_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        except Exception:  # noqa: BLE001
            return naive_chunk_linear_attn(q, k, v)

    return run


def forms(chunk_size: int):
    out = {
        "chunk": lambda q, k, v: linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size),
        "naive": lambda q, k, v: linear_attention(q, k, v, impl="naive"),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    fla = fla_callable()
    if fla is not None:
        out["fla"] = fla
    return out


def first_tensor(res):
    return res[0] if isinstance(res, (tuple, list)) else res


def run_once(fn, q, k, v, backward: bool) -> None:
    if backward:
        for t in (q, k, v):
            t.grad = None
        first_tensor(fn(q, k, v)).sum().backward()
    else:
        with torch.no_grad():
            fn(q, k, v)


def time_it(fn, n: int, backward: bool, repeats: int, warmup: int) -> float:
    q, k, v = make_inputs(n, requires_grad=backward)
    for _ in range(warmup):
        run_once(fn, q, k, v, backward)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_once(fn, q, k, v, backward)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * size**3 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


# ------------------------------------------------------------------------------------------------------
# memory: one fresh child process per (form, N)
# ------------------------------------------------------------------------------------------------------
def proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_main(form: str, n: int, chunk_size: int) -> None:
    """One forward+backward; prints the RSS high-water mark (VmHWM) and its rise during the call."""
    fn = forms(chunk_size)[form]
    run_once(fn, *make_inputs(256, requires_grad=True), backward=True)  # one-time library set-up, not counted
    q, k, v = make_inputs(n, requires_grad=True)
    try:  # reset the high-water mark to the current RSS (Linux >= 4.0); else it counts from process start
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = proc_status_kb("VmRSS")
    run_once(fn, q, k, v, backward=True)
    peak = proc_status_kb("VmHWM")
    print(json.dumps({"peak_mb": peak / 1024, "delta_mb": (peak - before) / 1024}))


def measure_memory(form: str, n: int, chunk_size: int, timeout: float):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", form, str(n), "--chunk-size", str(chunk_size)]
    cmd += ["--threads", str(torch.get_num_threads())]  # the children run with the parent's thread count
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
        return json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"error": type(exc).__name__}


# ------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------
def fmt_ms(t):
    return "–" if t is None else f"{t * 1e3:.1f}"


def fmt_ratio(a, b):
    return "–" if a is None or b is None else f"{a / b:.2f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths N (default 1k … 64k)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement; the median is reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    p.add_argument("--chunk-size", type=int, default=64, help="chunk size C of the chunk form")
    p.add_argument("--naive-max", type=int, default=4096, help="largest N for the naive form (B·H·N² weights)")
    p.add_argument("--budget-s", type=float, default=20.0,
                   help="skip a form at an N when one run is predicted to take longer than this")
    p.add_argument("--no-memory", action="store_true", help="skip the per-config child processes that measure RSS")
    p.add_argument("--quick", action="store_true", help="N = 1k, 2k, 4k only (a smoke run)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the timings (default: torch's default)")
    p.add_argument("--_child", nargs=2, metavar=("FORM", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        if args.threads:
            torch.set_num_threads(args.threads)
        child_main(args._child[0], int(args._child[1]), args.chunk_size)
        return
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    repeats = args.repeats
    C = args.chunk_size
    if args.threads:
        torch.set_num_threads(args.threads)

    fns = forms(C)
    print(f"# linear attention benchmark: B={B} H={H} d={D} float32 causal, elu+1, RoPE numerator, chunk C={C}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {repeats} after {args.warmup} warm-up")
    peak = matmul_peak_gflops()
    print(f"float32 matmul peak (2048³ torch.mm): {peak:.1f} GFLOP/s")
    if "fla" not in fns:
        print("fla not importable, row skipped")
    print()

    issue_flops = 8 * C * D + 8 * D * D  # the issue's count per token per head
    matmul_flops = 4 * C * D + 4 * D * D  # QKᵀ, PV, KᵀV, Q·S of the numerator, 2 FLOPs per multiply-add
    scaling = {"chunk": 1, "fla": 1, "naive": 2, "sdpa": 2}
    last = {}  # form -> (n, seconds of one fwd+bwd run) for the time prediction
    rows = []
    for n in lengths:
        row = {"n": n}
        for form, fn in fns.items():
            if form == "naive" and n > args.naive_max:
                continue
            if form == "fla" and n % 64:
                continue
            if form in last:
                n0, t0 = last[form]
                if t0 * (n / n0) ** scaling[form] > args.budget_s:
                    row[form + "_skipped"] = True
                    continue
            try:
                row[form + "_bwd"] = time_it(fn, n, True, repeats, args.warmup)
                row[form + "_fwd"] = time_it(fn, n, False, repeats, args.warmup)
                last[form] = (n, row[form + "_bwd"])
            except Exception as exc:  # noqa: BLE001 - report and carry on
                print(f"{form} failed at N={n}: {type(exc).__name__}: {exc}")
        if row.get("chunk_fwd"):
            row["gflops"] = B * H * n * issue_flops / row["chunk_fwd"] / 1e9
            row["gflops_mm"] = B * H * n * matmul_flops / row["chunk_fwd"] / 1e9
        rows.append(row)
        print(f"N={n}: " + ", ".join(f"{k}={v * 1e3:.1f}ms" for k, v in row.items() if k.endswith(("_fwd", "_bwd"))),
              flush=True)
    print()
    has_fla = "fla" in fns
    head = ["N", "chunk fwd ms", "chunk f+b ms", "naive fwd ms", "naive f+b ms", "SDPA fwd ms", "SDPA f+b ms",
            "SDPA/chunk fwd", "SDPA/chunk f+b", "naive/chunk fwd", "naive/chunk f+b"]
    if has_fla:
        head += ["fla fwd ms", "fla/chunk fwd"]
    head += ["chunk fwd GFLOP/s (8Cd+8d²)", "% of mm peak", "chunk fwd GFLOP/s (4Cd+4d²)", "% of mm peak"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        g = lambda key: r.get(key)  # noqa: E731
        cells = [str(r["n"]), fmt_ms(g("chunk_fwd")), fmt_ms(g("chunk_bwd")), fmt_ms(g("naive_fwd")), fmt_ms(g("naive_bwd")),
                 fmt_ms(g("sdpa_fwd")), fmt_ms(g("sdpa_bwd")), fmt_ratio(g("sdpa_fwd"), g("chunk_fwd")),
                 fmt_ratio(g("sdpa_bwd"), g("chunk_bwd")), fmt_ratio(g("naive_fwd"), g("chunk_fwd")),
                 fmt_ratio(g("naive_bwd"), g("chunk_bwd"))]
        if has_fla:
            cells += [fmt_ms(g("fla_fwd")), fmt_ratio(g("fla_fwd"), g("chunk_fwd"))]
        for key in ("gflops", "gflops_mm"):
            cells += ["–" if g(key) is None else f"{r[key]:.1f}", "–" if g(key) is None else f"{100 * r[key] / peak:.0f}%"]
        print("| " + " | ".join(cells) + " |")
    print()
    print(f"FLOPs per token per head, forward: 8·C·d + 8·d² = {issue_flops} (the issue's count) and "
          f"4·C·d + 4·d² = {matmul_flops} (the numerator's matmuls QKᵀ, PV, KᵀV, Q·S at 2 FLOPs per multiply-add; "
          "the denominator, feature map and RoPE are not counted).  "
          "'–': not run (naive above --naive-max, or predicted over --budget-s).")

    if args.no_memory:
        return
    print()
    print("Peak RSS of a fresh process running one forward+backward (MB above the RSS before the call; total peak in brackets)")
    print()
    mem_forms = [f for f in fns if f != "fla"]
    print("| N | " + " | ".join(mem_forms) + " | inputs q,k,v |")
    print("|" + "---|" * (len(mem_forms) + 2))
    for r in rows:
        n = r["n"]
        cells = []
        for form in mem_forms:
            if (form + "_bwd") not in r:
                cells.append("–")
                continue
            m = measure_memory(form, n, C, timeout=max(120.0, 20 * r[form + "_bwd"]))
            cells.append(m.get("error") or f"{m['delta_mb']:.0f} ({m['peak_mb']:.0f})")
        inputs_mb = 3 * B * H * n * D * 4 / 2**20
        print(f"| {n} | " + " | ".join(cells) + f" | {inputs_mb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
