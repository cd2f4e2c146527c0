"""Memory: the peak resident memory of one forward+backward of each form, each in a fresh process.

For each (N, form) a child process runs one forward+backward at N = 256 first (one-time library set-up, not
counted), builds q, k, v at N, resets the resident-set high-water mark (``VmHWM`` of /proc/self/status, through
/proc/self/clear_refs) and runs one forward+backward.  Its row: the rise of the peak above the RSS just before the
call (MB), the total peak (MB), and the size of q, k, v themselves.  It is what the operating system saw,
allocator caching included, not a count of tensor bytes.  (``ru_maxrss`` is no use here: Linux carries it over
from the parent across fork/exec.)  Linux only.  On a GPU, benchmarks/kernel_time.py --device cuda reports the
peak memory allocated per row instead.

The naive form runs only up to ``--naive-max`` (it materialises B·H·N² weights); a child that fails or exceeds
``--timeout-s`` gives a row saying so.  Shapes: B=1, H=8, d=64, float32, causal, C=64; the children run with this
process's thread count and malloc setting.

Usage:  python benchmarks/memory.py --lengths 4096 16384 65536 --forms chunk naive sdpa
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, B, C, D, H, legend, lookup, make_inputs  # noqa: E402

COLUMNS = ("N", "form", "MB above the RSS before the call", "peak RSS MB", "q, k, v MB", "status")


def proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(key: str, n: int, chunk_size: int) -> dict:
    """One forward+backward of one form at N, in this (fresh) process: the RSS high-water mark and its rise."""
    form = REGISTRY[key]
    fn = form.build(chunk_size, torch.device("cpu"))

    def fwd_bwd_at(n: int):
        (q, k, v), grad = make_inputs(form, n)
        return timing.passes(fn, q, k, v, grad)[0]

    fwd_bwd_at(256)()  # one-time library set-up, not counted
    fwd_bwd = fwd_bwd_at(n)
    try:  # reset the high-water mark to the current RSS (Linux >= 4.0); else it counts from process start
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = proc_status_kb("VmRSS")
    fwd_bwd()
    peak = proc_status_kb("VmHWM")
    return {"peak_mb": peak / 1024, "delta_mb": (peak - before) / 1024}


def measure(key: str, n: int, args) -> dict:
    cmd = [sys.executable, __file__, "--_child", key, str(n), "--chunk-size", str(args.chunk_size)]
    cmd += ["--threads", str(torch.get_num_threads())] + (["--system-malloc"] if args.system_malloc else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "note": f"over --timeout-s {args.timeout_s:g}"}
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        return {"status": "failed", "note": last[:200]}
    return dict(json.loads(lines[-1]), status="ok")


def main(argv=None) -> int:
    p = timing.parser(__doc__, malloc=True, epilog="\nForms:\n" + "\n".join(legend(REGISTRY)))
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536], help="sequence lengths N")
    p.add_argument("--forms", nargs="+", default=["chunk", "naive", "sdpa"], help="forms (keys or labels)")
    p.add_argument("--chunk-size", type=int, default=C)
    p.add_argument("--naive-max", type=int, default=4096, help="largest N for the naive form (B·H·N² weights)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="time limit of each child process")
    p.add_argument("--_child", nargs=2, metavar=("FORM", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    malloc = timing.start(args)
    if args._child:
        print(json.dumps(child(args._child[0], int(args._child[1]), args.chunk_size)), flush=True)
        return 0
    try:
        keys = [lookup(f).key for f in args.forms]
    except KeyError as e:
        p.error(f"--forms: {e.args[0]}")
    timing.header(
        f"memory: peak RSS of one forward+backward in a fresh process; B={B}, H={H}, d={D}, float32, "
        f"causal, C={args.chunk_size}",
        f"malloc: {malloc}",
    )
    print("\n".join(["Forms:"] + legend(keys) + [""] + timing.table(COLUMNS, [])[:2]), flush=True)
    failed = False
    for n in args.lengths:
        for key in keys:
            if key == "naive" and n > args.naive_max:
                r = {"status": "skipped", "note": f"N above --naive-max {args.naive_max}"}
            else:
                r = measure(key, n, args)
            failed = failed or r["status"] == "failed"
            mb = [timing.fmt(x, 0) for x in (r.get("delta_mb"), r.get("peak_mb"), 3 * B * H * n * D * 4 / 2**20)]
            print(timing.table(COLUMNS, [[n, REGISTRY[key].label, *mb, timing.status(r)]])[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
