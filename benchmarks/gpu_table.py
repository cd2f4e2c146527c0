"""Kernel table: causal attention forward+backward, linear attention's forms beside SDPA flash, on a GPU.

One process, one row per (N, form), each printed as it is measured; a form that fails (out of memory,
an import, a kernel error) becomes a row saying what failed, and the other forms go on.  The forms, each row
labelled with exactly what it times:

  sdpa flash            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) under
                        sdpa_kernel(SDPBackend.FLASH_ATTENTION) only: softmax attention, FlashAttention
  fla chunk_simple_gla  fla.ops.simple_gla.chunk_simple_gla(q, k, v, scale=1) on fla's [B, N, H, d] layout:
                        fla's own kernel, unnormalised linear attention (no feature map, no RoPE, no
                        denominator, no decay): the speed bound for the next form
  linrope on fla        linrope.ops.linear_attention(q, k, v, impl="fla"): elu+1, RoPE in the numerator,
                        normalised: the features in torch, then fla's chunk_simple_gla kernels twice
                        (numerator; denominator with a ones column), layout copies included
  linrope chunk         linrope.ops.linear_attention(q, k, v, impl="chunk"): the same computation in linrope's
                        own chunked kernel (PyTorch, C=64)

Shapes: B=1, H=8, d=64 (``--heads``, ``--dim``), bfloat16 inputs (``--dtype``), causal; N = 1k, 4k, 16k, 64k.
Per row: the median of ``--repeats`` timed forward+backward passes (CUDA events; wall clock on CPU) after
``--warmup`` untimed ones, the forward alone under ``torch.no_grad``, the peak memory allocated during one
forward+backward above what was allocated before it (CUDA only), and the wall time of the very first call
(fla: Triton's compile and autotuning, paid once per process and kept in Triton's cache).

``--device cpu`` runs the same code on the CPU (the stand-in of benchmarks/gpu_check.sh --cpu): the fla forms
then report "unavailable" (fla's Triton kernels need CUDA).  ``--budget-s`` bounds the whole table: a row
whose predicted time (from the form's previous N: linear in N for the linear forms, quadratic for SDPA) would
overrun what is left, and every row once the budget is spent, says so instead of running.  ``--jsonl`` appends
each row as one JSON line as it is measured (benchmarks/gpu_check.py builds its report from them).
``LINROPE_BENCH_FAIL=<form>[,<form>]`` makes those forms raise (to check that a failing form leaves the others).
Exit status 1 if a row failed (on CUDA also if a form was unavailable), else 0.

Usage:  python benchmarks/gpu_table.py
        python benchmarks/gpu_table.py --lengths 1024 16384 --forms "sdpa flash" "linrope on fla"
        python benchmarks/gpu_table.py --device cpu --lengths 256 1024     # the CPU stand-in
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.ops import linear_attention  # noqa: E402
from linrope.ops.linear_attn import fla_backend  # noqa: E402

NEEDS_GPU = ("benchmarks/gpu_table.py needs a CUDA GPU (torch.cuda.is_available() is False here): "
             "nothing was measured (--device cpu runs the CPU stand-in)")
SDPA, FLA_KERNEL, LINROPE_FLA, LINROPE_CHUNK = "sdpa flash", "fla chunk_simple_gla", "linrope on fla", "linrope chunk"
FORMS = (SDPA, FLA_KERNEL, LINROPE_FLA, LINROPE_CHUNK)  # measured in this order at each N: the baselines first
GROWTH = {SDPA: 2, FLA_KERNEL: 1, LINROPE_FLA: 1, LINROPE_CHUNK: 1}  # how time grows with N (for the budget)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLUMNS = ("N", "form", "fwd+bwd ms", "fwd ms", "peak MiB", "first call s", "status")
FAIL_ENV = "LINROPE_BENCH_FAIL"
OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5: only torch.cuda's


class FormUnavailable(Exception):
    """The form cannot run here (not a failure of the form): fla on a CPU."""


def forced_failure(label: str) -> None:
    """Raise if ``LINROPE_BENCH_FAIL`` names this form (or row label): the check's failure drill."""
    named = [s.strip() for s in os.environ.get(FAIL_ENV, "").split(",") if s.strip()]
    if label in named:
        raise RuntimeError(f"forced failure ({FAIL_ENV}={os.environ[FAIL_ENV]})")


def sdpa_flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def fla_kernel():
    """fla's own chunk_simple_gla, imported now (not merely found): an import error is this form's row."""
    why = fla_backend.unavailable("cuda")
    if why is not None and why.startswith("fla and triton are not installed"):
        raise FormUnavailable(why)
    from fla.ops.simple_gla import chunk_simple_gla

    return lambda q, k, v: chunk_simple_gla(q, k, v, scale=1.0)[0]


def form_fn(name: str, device: torch.device) -> Callable:
    """The callable a row times; raises FormUnavailable where the form cannot run on ``device``."""
    if name in (FLA_KERNEL, LINROPE_FLA):
        why = fla_backend.unavailable(device)
        if why is not None:
            raise FormUnavailable(why)
    if name == SDPA:
        fn = sdpa_flash
    elif name == FLA_KERNEL:
        fn = fla_kernel()
    else:
        impl = "fla" if name == LINROPE_FLA else "chunk"
        fn = lambda q, k, v: linear_attention(q, k, v, impl=impl)  # noqa: E731

    def checked(q, k, v):
        forced_failure(name)
        return fn(q, k, v)

    return checked


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, n: int, args, device: torch.device) -> dict:
    fn = form_fn(name, device)
    g = torch.Generator(device=device).manual_seed(n)
    B, H, d = 1, args.heads, args.dim
    shape = (B, n, H, d) if name == FLA_KERNEL else (B, H, n, d)  # fla's own layout: no transposes timed
    dtype = DTYPES[args.dtype]
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype, generator=g)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    t0 = time.perf_counter()
    fwd_bwd()
    sync(device)
    first = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    return {"fwd_bwd_ms": timed(fwd_bwd, device, warmup=args.warmup, repeats=args.repeats) * 1e3,
            "fwd_ms": timed(fwd, device, warmup=args.warmup, repeats=args.repeats) * 1e3,
            "peak_mib": peak, "first_s": first}


def failure_note(e: BaseException) -> str:
    """One line saying what failed: OOM named as such, else the exception's type and first line."""
    first = (str(e).strip().splitlines() or [""])[0][:160]
    if isinstance(e, OOM) or "out of memory" in first.lower():
        return f"OOM: {first}"
    return f"{type(e).__name__}: {first}"


def fmt(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}".replace(",", " ")


def row_line(r: dict) -> str:
    """A row of the table as markdown: N | form | fwd+bwd ms | fwd ms | peak MiB | first call s | status."""
    status = r["status"] + (f": {r['note']}" if r.get("note") else "")
    cells = [str(r["n"]), r["form"], fmt(r.get("fwd_bwd_ms")), fmt(r.get("fwd_ms")), fmt(r.get("peak_mib"), 0),
             fmt(r.get("first_s"), 1), status.replace("|", "/")]
    return "| " + " | ".join(cells) + " |"


def header_lines() -> list[str]:
    return ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]


def run(args, device: torch.device, emit: Callable[[dict], None]) -> list[dict]:
    """Every (N, form) row in order, each handed to ``emit`` as it is known."""
    start = time.perf_counter()
    rows, last, dead = [], {}, {}
    for n in args.lengths:
        for name in args.forms:
            row = {"part": "kernels", "n": n, "form": name, "device": device.type, "dtype": args.dtype}
            left = args.budget_s - (time.perf_counter() - start)
            if name in dead:
                row.update(dead[name])
            elif left <= 0:
                row.update(status="skipped", note=f"the table's budget of {args.budget_s:.0f} s was spent")
            elif name in last and (predicted := _predicted(name, n, last[name], args)) > left:
                row.update(status="skipped", note=f"predicted {predicted:.0f} s, {left:.0f} s of the budget left")
            else:
                try:
                    row.update(measure(name, n, args, device), status="ok")
                    last[name] = (n, row["fwd_bwd_ms"] / 1e3)
                except FormUnavailable as e:
                    row.update(status="unavailable", note=str(e))
                    dead[name] = {"status": "unavailable", "note": str(e)}
                except Exception as e:  # noqa: BLE001 - any failure of one form is that form's row
                    row.update(status="failed", note=failure_note(e))
                    if row["note"].startswith("OOM"):
                        dead[name] = {"status": "skipped", "note": f"OOM at N={n}"}
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            rows.append(row)
            emit(row)
    return rows


def _predicted(name: str, n: int, last: tuple, args) -> float:
    n0, t0 = last
    per_call = t0 * (n / n0) ** GROWTH[name]
    return per_call * 2 * (args.warmup + args.repeats + 1)  # fwd+bwd and fwd (a forward is less; a bound)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS), metavar="FORM",
                   help=f"forms to time, in this order at each N (default: {', '.join(FORMS)})")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the stand-in)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=600.0, help="wall-clock budget of the whole table")
    p.add_argument("--jsonl", type=Path, default=None, help="append each row here as one JSON line")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# kernel table: {where}, torch {torch.__version__}; B=1, H={args.heads}, d={args.dim}, {args.dtype}, "
          f"causal; fwd+bwd and fwd: median of {args.repeats} after {args.warmup} warm-up", flush=True)
    print("\n".join(header_lines()), flush=True)

    def emit(row):
        print(row_line(row), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")

    rows = run(args, device, emit)
    bad = [r for r in rows if r["status"] == "failed" or (r["status"] == "unavailable" and device.type == "cuda")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
