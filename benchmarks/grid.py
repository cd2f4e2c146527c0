"""The chunk kernel's whole grid: every shape studies train and the long rows, fp32 and bf16, against SDPA and fla's
naive chunk, quiet and beside one busy process, and optionally against another commit's kernel.

Rows (forward+backward of causal linear attention, elu+1, RoPE in the numerator, C = 64, unless a column says
otherwise):

  tiny       B 16 H 4 d 16  N 64      (``size=tiny``)
  headline   B 16 H 2 d 64  N 128     (``experiment=headline``: the rope_study model)
  default    B 16 H 4 d 64  N 256     (``python train.py model=linear_rope``: ``size=small``)
  base       B 4  H 8 d 64  N 4096    (``size=base``)
  long-<N>   B 1  H 8 d 64  N 1k, 4k, 8k, 16k, 64k

Each row is timed in a worker process (``--worker``): the median of ``--repeats`` calls after one untimed call
(for a call under 0.5 s, of 5 × ``--repeats`` calls after five untimed ones),
for the chunk form (fp32 and bf16), its forward alone (fp32), SDPA causal softmax (up to ``--sdpa-max``) and fla's
pure-PyTorch ``naive_chunk_linear_attn`` (fla installed, B 1 rows), each ratio taken inside the worker that measured
both.  The workers run in rounds (``--rounds``): in each round, quiet, then beside a competing process spinning one
thread; with ``--compare REV [REV …]`` each state runs this checkout's worker and each REV's (its ``linrope/``
extracted with ``git archive``), alternating (the order reversed every other round), so drift of the machine hits
them alike.  Reported: medians over the rounds.

Columns of the table (one line per row × dtype):
  chunk ms           the chunk form's fwd+bwd, quiet (this checkout)
  ÷ REV              this checkout's chunk time ÷ REV's, quiet and loaded (≤ 1.05: no slower), for each REV
  SDPA ÷ chunk       the chunk form's advantage over SDPA, quiet and loaded, and loaded ÷ quiet (the share kept)
  fla ÷ chunk        the same against fla's naive chunk
Below it: t(64k) ÷ t(8k), the forward's share of a float32 matmul's rate at 64k (4·C·d + 4·d² FLOPs per token and
head: the numerator's four matmuls) and bf16 ÷ fp32 at 16k.

Usage:  python benchmarks/grid.py                          # every row, 3 rounds (about 15 min on 2 cores)
        python benchmarks/grid.py --compare 536e44e HEAD --out /tmp/grid.md
        python benchmarks/grid.py --rows headline default --rounds 2 --no-loaded
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]

ROWS = {  # name: (B, H, d, N)
    "tiny": (16, 4, 16, 64),
    "headline": (16, 2, 64, 128),
    "default": (16, 4, 64, 256),
    "base": (4, 8, 64, 4096),
    "long-1k": (1, 8, 64, 1024),
    "long-4k": (1, 8, 64, 4096),
    "long-8k": (1, 8, 64, 8192),
    "long-16k": (1, 8, 64, 16384),
    "long-64k": (1, 8, 64, 65536),
}
DTYPES = ("fp32", "bf16")


# ----------------------------------------------------------------------------------------------------------------
# the worker: one process, one kernel source, every row once
# ----------------------------------------------------------------------------------------------------------------
def worker(src: str, rows: List[str], repeats: int, sdpa_max: int, fla: bool, threads: int) -> Dict[str, float]:
    """{"<row>/<form>": seconds}: the chunk form of the linrope found in ``src`` (and, for this checkout, SDPA,
    fla's naive chunk and the forward alone), each the median of ``repeats`` calls after one untimed call."""
    sys.path.insert(0, src)
    import torch

    import linrope.ops as ops

    if not Path(ops.__file__).resolve().is_relative_to(Path(src).resolve()):
        raise SystemExit(f"grid worker: imported linrope from {ops.__file__}, not from {src}")
    if threads:
        torch.set_num_threads(threads)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    naive_chunk = None
    if fla:
        try:
            from fla.ops.linear_attn.naive import naive_chunk_linear_attn as naive_chunk
        except Exception:  # noqa: BLE001 - fla missing or broken: no fla column
            naive_chunk = None

    def fwd_bwd(fn, q, k, v, g):
        def call():
            for x in (q, k, v):
                x.grad = None
            fn(q, k, v).backward(g)

        return call

    def chunk(q, k, v):
        return ops.linear_attention(q, k, v, impl="chunk", chunk_size=64)

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fla_naive(q, k, v):  # fla takes (B, N, H, d); transposes are views
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        return t(naive_chunk(t(q), t(k), t(v), normalize=True))

    def median(call) -> float:
        t0 = time.perf_counter()
        call()
        short = time.perf_counter() - t0 < 0.5  # a short call: more warm-up (the first few calls of a form are
        for _ in range(4 if short else 0):  # slow while torch warms its caches) and more timed calls
            call()
        times = []
        for _ in range(repeats * (5 if short else 1)):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out: Dict[str, float] = {}
    for name in rows:
        B, H, d, N = ROWS[name]
        for dt in DTYPES:
            gen = torch.Generator().manual_seed(0)
            q, k, v, g = (torch.randn(B, H, N, d, generator=gen).to(dtypes[dt]) for _ in range(4))
            for x in (q, k, v):
                x.requires_grad_(True)
            out[f"{name}/chunk/{dt}"] = median(fwd_bwd(chunk, q, k, v, g))
            if src != str(ROOT):
                continue
            if dt == "fp32":
                with torch.no_grad():
                    out[f"{name}/chunk-fwd/{dt}"] = median(lambda q=q, k=k, v=v: chunk(q, k, v))
                if N <= sdpa_max:
                    out[f"{name}/sdpa/{dt}"] = median(fwd_bwd(sdpa, q, k, v, g))
                if naive_chunk is not None and B == 1 and N % 64 == 0:
                    out[f"{name}/fla/{dt}"] = median(fwd_bwd(fla_naive, q, k, v, g))
        print(f"grid worker: {name} done", file=sys.stderr, flush=True)
    if src == str(ROOT) and "long-64k" in rows:
        a = torch.randn(2048, 2048)
        out["matmul-gflops"] = 2 * 2048**3 / median(lambda: a @ a) / 1e9
    return out


# ----------------------------------------------------------------------------------------------------------------
# the driver: rounds of workers, quiet and loaded, this checkout against REV
# ----------------------------------------------------------------------------------------------------------------
def extract(rev: str, into: Path) -> str:
    """REV's ``linrope/`` under ``into`` (git archive): the source tree its worker imports."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    if sha.returncode:
        raise SystemExit(f"grid: --compare {rev}: not a commit of this repository ({sha.stderr.strip()})")
    archive = subprocess.run(["git", "archive", rev, "linrope"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return sha.stdout.strip()


def run_worker(src: str, args, fla: bool) -> Dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", src, "--rows", *args.rows, "--repeats", str(args.repeats)]
    cmd += ["--sdpa-max", str(args.sdpa_max), "--threads", str(args.threads)] + ([] if fla else ["--no-fla"])
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if res.returncode:
        raise SystemExit(f"grid: worker for {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def med(results: List[Dict[str, float]], key: str) -> Optional[float]:
    vals = [r[key] for r in results if key in r]
    return statistics.median(vals) if vals else None


def med_ratio(results: List[Dict[str, float]], a: str, b: str) -> Optional[float]:
    """The median over workers of a ÷ b, each ratio inside one worker."""
    vals = [r[a] / r[b] for r in results if a in r and b in r]
    return statistics.median(vals) if vals else None


def fmt(x: Optional[float], spec: str = ".2f", unit: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{unit}"


def report(res: Dict[str, List[Dict[str, float]]], args, revs: List[str]) -> List[str]:
    new_q, new_l = res["new/quiet"], res.get("new/loaded", [])
    head = ["row", "B H d N", "dtype", "chunk ms"]
    for rev in revs:
        head += [f"÷ {rev} quiet", f"÷ {rev} loaded"]
    head += ["SDPA ÷ chunk", "loaded", "kept", "fla ÷ chunk", "loaded", "kept"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in args.rows:
        B, H, d, N = ROWS[name]
        for dt in DTYPES:
            c = f"{name}/chunk/{dt}"
            t = med(new_q, c)
            cells = [name, f"{B} {H} {d} {N}", dt, fmt(None if t is None else t * 1e3, ".1f")]
            for rev in revs:
                for state, new in (("quiet", new_q), ("loaded", new_l)):
                    a, b = med(new, c), med(res.get(f"{rev}/{state}", []), c)
                    cells.append(fmt(a / b if a and b else None, ".2f", "×"))
            for other in ("sdpa", "fla"):
                o = f"{name}/{other}/{dt}"
                quiet, loaded = med_ratio(new_q, o, c), med_ratio(new_l, o, c)
                kept = loaded / quiet if quiet and loaded else None
                cells += [fmt(quiet, ".2f", "×"), fmt(loaded, ".2f", "×"), fmt(kept, ".0%")]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    t64, t8 = med(new_q, "long-64k/chunk/fp32"), med(new_q, "long-8k/chunk/fp32")
    if t64 and t8:
        lines.append(f"- t(64k) ÷ t(8k), chunk fwd+bwd fp32: {t64 / t8:.2f} (8 if linear)")
    fwd, peak = med(new_q, "long-64k/chunk-fwd/fp32"), med(new_q, "matmul-gflops")
    if fwd and peak:
        B, H, d, N = ROWS["long-64k"]
        flops = B * H * N * (4 * 64 * d + 4 * d * d)
        lines.append(
            f"- chunk forward at 64k: {flops / fwd / 1e9:.1f} GFLOP/s, {flops / fwd / 1e9 / peak:.0%} of a float32 "
            f"2048³ matmul's {peak:.1f} GFLOP/s (numerator matmuls only)"
        )
    bf = med_ratio(new_q, "long-16k/chunk/fp32", "long-16k/chunk/bf16")
    if bf:
        lines.append(f"- fp32 ÷ bf16 chunk fwd+bwd at 16k: {bf:.2f}× (bf16 faster above 1)")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="rows of the grid (all)")
    p.add_argument("--compare", metavar="REV", nargs="+", default=[], help="also time each REV's chunk kernel")
    p.add_argument("--rounds", type=int, default=3, help="worker rounds per state and source (3)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row inside a worker (3)")
    p.add_argument("--sdpa-max", type=int, default=16384, help="longest N for SDPA (16384)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in the workers (0: torch's default)")
    p.add_argument("--no-loaded", action="store_true", help="quiet only (no competing process)")
    p.add_argument("--no-fla", action="store_true", help="no fla naive chunk column")
    p.add_argument("--out", type=Path, help="also write the table (markdown) here")
    p.add_argument("--worker", metavar="SRC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.repeats, args.sdpa_max, not args.no_fla, args.threads)))
        return 0
    sys.path.insert(0, str(ROOT))  # the driver, not a worker: this checkout's helpers
    from benchmarks import timing

    if args.out and not args.out.parent.is_dir():
        p.error(f"--out {args.out}: folder {args.out.parent} does not exist")
    states = ["quiet"] + ([] if args.no_loaded else ["loaded"])
    with tempfile.TemporaryDirectory(prefix="linrope-grid-") as tmp:
        sources = [("new", str(ROOT))]
        for i, rev in enumerate(args.compare):
            (Path(tmp) / str(i)).mkdir()
            sources.append((extract(rev, Path(tmp) / str(i)), str(Path(tmp) / str(i))))
        revs = [who for who, _ in sources[1:]]
        res: Dict[str, List[Dict[str, float]]] = {}
        t0 = time.time()
        print(f"grid: {len(args.rows)} rows × {len(states)} states × {len(sources)} sources × {args.rounds} rounds")
        for r in range(args.rounds):
            for state in states:
                for who, src in sources if r % 2 == 0 else sources[::-1]:
                    with timing.busy_process(state == "loaded"):
                        out = run_worker(src, args, fla=not args.no_fla)
                    res.setdefault(f"{who}/{state}", []).append(out)
                    print(
                        f"grid: round {r + 1}/{args.rounds} {state} {who} done ({time.time() - t0:.0f} s)", flush=True
                    )
    from linrope.run.provenance import machine_line

    title = f"# Chunk kernel grid ({args.rounds} rounds × {args.repeats} repeats, medians)"
    against = "; against " + ", ".join(f"{a} ({r})" for a, r in zip(args.compare, revs)) if revs else ""
    lines = [title, machine_line() + against, ""] + report(res, args, revs)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
