"""Whether linrope's Hopper guard keeps fla's training-shape call from faulting: one process per variant.

On Hopper linrope pads every width it hands fla to 64 and drops fla's 16- and 32-wide autotune configurations
(``fla_backend.HOPPER_GUARD``; why: docs/benchmarks.md, "Device check").  Each variant runs the training-shape call
(bf16, elu+1, RoPE in the numerator, (B, H, N, d) = (4, 8, 4096, 64), forward and backward, ``--repeats`` times,
synchronised after each) in a process of its own, since a fault ends the CUDA context:

  as-is      the guard off: widths padded to even only, every autotune configuration
  guarded    linrope as it is (on Hopper: the guard on)

One line per variant: ok / fault (the error's first line) / timeout, and the seconds taken.

Usage:  python benchmarks/fla_probe.py                      # every variant, each in its own process
        python benchmarks/fla_probe.py --variant as-is --repeats 3
Without a CUDA GPU it says so and runs nothing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (4, 8, 4096, 64)
VARIANTS = {"as-is": False, "guarded": True}  # name -> fla_backend.HOPPER_GUARD
NEEDS_GPU = "benchmarks/fla_probe.py needs a CUDA GPU (torch.cuda.is_available() is False here): nothing ran"


def run_variant(name: str, repeats: int) -> dict:
    """The training-shape call, forward and backward, ``repeats`` times in this process."""
    import torch

    from linrope.ops import linear_attention
    from linrope.ops.linear_attn import fla_backend

    fla_backend.HOPPER_GUARD = VARIANTS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(SHAPE, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_() for _ in "qkv")
    start = time.perf_counter()
    for _ in range(repeats):
        out = linear_attention(q, k, v, impl="fla", feature_map="elu", rope="numerator")
        out.float().square().mean().backward()
        torch.cuda.synchronize()
    finite = all(bool(torch.isfinite(t).all()) for t in (out, q.grad, k.grad, v.grad))
    return {
        "variant": name,
        "status": "ok" if finite else "non-finite",
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variant", choices=sorted(VARIANTS), help="run this one here (default: each in a process)")
    p.add_argument("--repeats", type=int, default=5, help="forward and backward calls per variant (default 5)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per variant's process (default 240)")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    if a.variant:
        print(json.dumps(run_variant(a.variant, a.repeats)), flush=True)
        return 0
    failed = 0
    for name in VARIANTS:
        start = time.perf_counter()
        cmd = [sys.executable, __file__, "--variant", name, "--repeats", str(a.repeats)]
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout)
            error = next((x for x in reversed(r.stderr.splitlines()) if "Error" in x), r.stderr[-200:])
            status = f"fault: {error.strip()[:160]}"
            row = next((json.loads(x) for x in reversed(r.stdout.splitlines()) if x.startswith("{")), None)
            row = row if r.returncode == 0 and row else {"variant": name, "status": status}
        except subprocess.TimeoutExpired:
            row = {"variant": name, "status": f"timeout after {a.timeout:g} s"}
        row.setdefault("seconds", round(time.perf_counter() - start, 1))
        failed += row["status"] != "ok"
        print(f"{row['variant']:9s} {row['status']}  ({row['seconds']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
