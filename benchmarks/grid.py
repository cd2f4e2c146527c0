"""The chunk kernel's whole grid: every shape studies train and the long rows, fp32 and bf16, against SDPA and fla's
naive chunk, quiet and beside one busy process, and optionally against another commit's kernel.

Rows (``ROWS``: B, H, d, N): forward+backward of causal linear attention, elu+1, RoPE in the numerator, C = 64.
Each row is timed in a worker process: the median of ``--repeats`` (at least 5) calls after three untimed ones (for
a call under 0.5 s, of 5 × ``--repeats`` after five) of the chunk form (fp32 and bf16), and in fp32 of its forward
alone, SDPA (up to ``--sdpa-max``) and fla's pure-PyTorch ``naive_chunk_linear_attn`` (fla installed, B 1 rows), each
ratio taken inside the worker that measured both.  In each of ``--rounds`` rounds the workers run quiet, then beside a
process spinning one thread; with ``--compare REV [REV …]`` each state runs this checkout's worker and each REV's
(its ``linrope/`` from ``git archive``), alternating, the order reversed every other round.  Reported: medians
over the rounds.

Columns of the table (one line per row × dtype):
  chunk ms           the chunk form's fwd+bwd, quiet (this checkout)
  ÷ REV              this checkout's chunk time ÷ REV's, quiet and loaded (≤ 1.05: no slower), for each REV
  SDPA ÷ chunk       the chunk form's advantage over SDPA, quiet and loaded, and loaded ÷ quiet (the share kept)
  fla ÷ chunk        the same against fla's naive chunk
Below it: t(64k) ÷ t(8k), the forward's share of a float32 matmul's rate at 64k (4·C·d + 4·d² FLOPs per token and
head: the numerator's four matmuls) and bf16 ÷ fp32 at 16k.

Usage:  python benchmarks/grid.py                          # every row, 3 rounds (about 20 min on 2 cores)
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
sys.path.append(str(ROOT))  # benchmarks.timing; a worker puts the linrope it times first

from benchmarks import timing  # noqa: E402

ROWS = {  # name: (B, H, d, N)
    "tiny": (16, 4, 16, 64),  # size=tiny
    "headline": (16, 2, 64, 128),  # experiment=headline: the rope_study model
    "default": (16, 4, 64, 256),  # python train.py model=linear_rope: size=small
    "base": (4, 8, 64, 4096),  # size=base
    "long-1k": (1, 8, 64, 1024),
    "long-4k": (1, 8, 64, 4096),
    "long-8k": (1, 8, 64, 8192),
    "long-16k": (1, 8, 64, 16384),
    "long-64k": (1, 8, 64, 65536),
}
DTYPES = ("fp32", "bf16")


def worker(src: str, rows: List[str], repeats: int, sdpa_max: int, fla: bool, threads: int) -> Dict[str, float]:
    """{"<row>/<form>": seconds}: the chunk form of the linrope found in ``src`` (and, for this checkout, SDPA,
    fla's naive chunk and the forward alone), each the median of ``repeats`` (at least 5) calls after three untimed
    ones (for a call under 0.5 s, of 5 × ``repeats`` calls after five untimed ones).  The first calls are slow while
    torch warms its caches and the allocator its heap, and a call of half a second or more has a heavy tail here (at
    64k one in five took 0.6–1.0 s against a median of 0.5): one untimed call and a median of three, the rule before
    2026-11-30, read t(64k) ÷ t(8k) 8.76 where the median of many calls gives 7.3–8.4."""
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
            pass
    t = lambda x: x.transpose(1, 2)  # noqa: E731 - fla takes (B, N, H, d); transposes are views
    forms = {
        "chunk": lambda q, k, v: ops.linear_attention(q, k, v, impl="chunk", chunk_size=64),
        "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "fla": lambda q, k, v: t(naive_chunk(t(q), t(k), t(v), normalize=True)),
    }

    def median(call) -> float:
        short = timing.once(call) < 0.5
        return timing.median_time(call, warmup=4 if short else 2, repeats=repeats * 5 if short else max(repeats, 5))

    out: Dict[str, float] = {}
    for name in rows:
        B, H, d, N = ROWS[name]
        for dt in DTYPES:
            gen = torch.Generator().manual_seed(0)
            q, k, v, g = (torch.randn(B, H, N, d, generator=gen).to(dtypes[dt]) for _ in range(4))
            fwd_bwd, fwd = timing.passes(forms["chunk"], *(x.requires_grad_(True) for x in (q, k, v)), g)
            out[f"{name}/chunk/{dt}"] = median(fwd_bwd)
            if src != str(ROOT) or dt != "fp32":  # the rest: this checkout's, in float32
                continue
            out[f"{name}/chunk-fwd/{dt}"] = median(fwd)
            for other, runs in (("sdpa", N <= sdpa_max), ("fla", naive_chunk and B == 1 and N % 64 == 0)):
                if runs:
                    out[f"{name}/{other}/{dt}"] = median(timing.passes(forms[other], q, k, v, g)[0])
        print(f"grid worker: {name} done", file=sys.stderr, flush=True)
    if src == str(ROOT) and "long-64k" in rows:
        a = torch.randn(2048, 2048)
        out["matmul-gflops"] = 2 * 2048**3 / median(lambda: a @ a) / 1e9
    return out


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
    cmd += ["--sdpa-max", str(args.sdpa_max), "--threads", str(args.threads or 0)] + ([] if fla else ["--no-fla"])
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if res.returncode:
        raise SystemExit(f"grid: worker for {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def med(results: List[Dict[str, float]], a: str, b: Optional[str] = None) -> Optional[float]:
    """The median over workers of ``a`` (÷ ``b``, each ratio inside one worker)."""
    vals = [r[a] / (r[b] if b else 1) for r in results if a in r and (b is None or b in r)]
    return statistics.median(vals) if vals else None


def fmt(x: Optional[float], spec: str = ".2f", unit: str = "×") -> str:
    return "–" if x is None else f"{x:{spec}}{unit}"


def report(res: Dict[str, List[Dict[str, float]]], args, revs: List[str]) -> List[str]:
    new_q, new_l = res["new/quiet"], res.get("new/loaded", [])
    head = ["row", "B H d N", "dtype", "chunk ms"]
    for rev in revs:
        head += [f"÷ {rev} quiet", f"÷ {rev} loaded"]
    head += ["SDPA ÷ chunk", "loaded", "kept", "fla ÷ chunk", "loaded", "kept"]
    rows = []
    for name in args.rows:
        B, H, d, N = ROWS[name]
        for dt in DTYPES:
            c = f"{name}/chunk/{dt}"
            t = med(new_q, c)
            cells = [name, f"{B} {H} {d} {N}", dt, fmt(t and t * 1e3, ".1f", "")]
            for rev in revs:
                for state, new in (("quiet", new_q), ("loaded", new_l)):
                    a, b = med(new, c), med(res.get(f"{rev}/{state}", []), c)
                    cells.append(fmt(timing.ratio(a, b)))
            for other in ("sdpa", "fla"):
                o = f"{name}/{other}/{dt}"
                quiet, loaded = med(new_q, o, c), med(new_l, o, c)
                kept = timing.ratio(loaded, quiet)
                cells += [fmt(quiet), fmt(loaded), fmt(kept, ".0%", "")]
            rows.append(cells)
    lines = timing.table(head, rows) + [""]
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
    bf = med(new_q, "long-16k/chunk/fp32", "long-16k/chunk/bf16")
    if bf:
        lines.append(f"- fp32 ÷ bf16 chunk fwd+bwd at 16k: {bf:.2f}× (bf16 faster above 1)")
    return lines


def main(argv=None) -> int:
    p = timing.parser(__doc__)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="rows of the grid (all)")
    p.add_argument("--compare", metavar="REV", nargs="+", default=[], help="also time each REV's chunk kernel")
    p.add_argument("--rounds", type=int, default=3, help="worker rounds per state and source (3)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row inside a worker (3)")
    p.add_argument("--sdpa-max", type=int, default=16384, help="longest N for SDPA (16384)")
    p.add_argument("--no-loaded", action="store_true", help="quiet only (no competing process)")
    p.add_argument("--no-fla", action="store_true", help="no fla naive chunk column")
    p.add_argument("--out", type=Path, help="also write the table (markdown) here")
    p.add_argument("--worker", metavar="SRC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.repeats, args.sdpa_max, not args.no_fla, args.threads)))
        return 0
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
