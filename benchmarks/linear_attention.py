"""Benchmark: chunked linear attention against the naive form and softmax attention (torch SDPA).

Shapes follow issue #3: B=1, H=8, d=64, float32, causal, feature map elu+1, RoPE in the numerator,
N from 1k to 64k.  For each N it times, in this one process (so that the ratios compare like with like):

  * ``chunk``  – linrope's chunked linear attention (``impl="chunk"``),
  * ``naive``  – linrope's quadratic reference, only up to ``--naive-max`` (it materialises B·H·N² weights),
  * ``sdpa``   – ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on the same q, k, v,
  * ``fla``    – flash-linear-attention's pure-PyTorch ``fla.ops.linear_attn.naive.naive_chunk_linear_attn``
                 with ``normalize=True`` when ``fla`` is importable (``pip install -e '.[gpu]'``), on the
                 raw q, k, v (no feature map, no RoPE there), set against
  * ``chunk_none`` – our chunk form with ``rope="none"`` (elu+1 included), timed only beside the fla row,
  * ``plain``  – the "before" of issue #7: a straightforward chunked form written in a few lines of PyTorch
                 (``plain_chunk_linear_attention`` below: features of the whole sequence, masked C×C products,
                 an exclusive cumsum of every chunk's state, autograd for the backward); it is checked
                 against the naive form before it is timed,

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

Generation (``--generation``, or ``--generation-only``): time per token of recurrent decoding at positions
1024 and 65536 (``--gen-positions``), for ``recurrent_step`` (B=1, H=8, d=64) and for the ``linear_rope``
TransformerLM's forward with states, one token at a time, each continuing from the real state of a prefix
of that length.  The RoPE angle is formed from the position itself, so the cost should not depend on it.

bfloat16 (``--bf16``): the chunk form's forward and forward+backward at ``--lengths`` (default 16 384) with
float32 inputs and with the same inputs in bfloat16, the two alternating for ``--rounds`` rounds (so that
the load of a shared machine hits both alike), each a median over its rounds; prints float32 time /
bfloat16 time (issue 24's target: ≥ 1.6× for forward+backward at N = 16 384) and, for scale, the same
ratio of a 2048³ ``torch.mm``.  It then prints what the bfloat16 products cost in accuracy: the relative
error (in norm) of the output, the final state and the gradients against the float64 naive form on the same
bfloat16 inputs (N = 2048, H = 2), with the bfloat16 products and with float32 products (the rule before
issue 24, ``chunk_kernel.matmul_dtype`` swapped for the run), beside the floor (the float64 output rounded
to bfloat16).

At the end the run prints issue #7's ratios that it measured (SDPA/chunk at 16k, fla/chunk(rope=none) at
64k, time(64k)/time(8k), % of matmul peak at 64k).

Usage:  python benchmarks/linear_attention.py --quick
        python benchmarks/linear_attention.py --lengths 1024 2048 4096 --repeats 5
        python benchmarks/linear_attention.py --lengths 8192 16384 65536 --forms chunk sdpa --budget-s 60 --no-memory
        python benchmarks/linear_attention.py --lengths 65536 --forms chunk_none fla --no-memory
        python benchmarks/linear_attention.py --generation-only
        python benchmarks/linear_attention.py --bf16 --rounds 9
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

from linrope.base.memory import retain_freed_memory  # noqa: E402
from linrope.ops import linear_attention  # noqa: E402
from linrope.ops.linear_attn.features import reference_features  # noqa: E402
from linrope.run.provenance import machine_line  # noqa: E402

B, H, D = 1, 8, 64
DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [1024, 2048, 4096]


# ------------------------------------------------------------------------------------------------------
# the forms being timed
# ------------------------------------------------------------------------------------------------------
def make_inputs(n: int, requires_grad: bool, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).to(dtype).requires_grad_(requires_grad) for _ in range(3)]


def plain_chunk_linear_attention(q, k, v, *, rope: str = "numerator", chunk_size: int = 64, eps: float = 1e-6):
    """Causal elu+1 linear attention as a first chunked version would write it (issue #7's "before").

    Every chunk's state kᵀv is materialised, (B, H, N/C, d, d_v), and turned into the states entering the
    chunks by a cumsum; autograd differentiates it all and keeps what it needs for the backward."""
    qn, kn, qd, kd = reference_features(q, k, feature_map="elu", rope=rope, positions=None, theta=None, dtype=q.dtype)
    n, C = q.shape[2], chunk_size
    nc = -(-n // C)

    def chunks(x):
        return F.pad(x, (0, 0, 0, nc * C - n)).unflatten(2, (nc, C))

    qc, kc, vc, qdc, kdc = map(chunks, (qn, kn, v, qd, kd))
    future = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    U = kc.transpose(-1, -2) @ vc
    num = (qc @ kc.transpose(-1, -2)).masked_fill(future, 0) @ vc + qc @ (U.cumsum(2) - U)
    zk = kdc.sum(3)
    den = (qdc @ kdc.transpose(-1, -2)).masked_fill(future, 0).sum(-1) + (qdc * (zk.cumsum(2) - zk).unsqueeze(3)).sum(-1)
    return (num / (den.unsqueeze(-1) + eps)).flatten(2, 3)[:, :, :n]


def check_plain(chunk_size: int) -> None:
    """The "before" form computes what the naive form computes (float64, N not a multiple of C)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3 * chunk_size + 5, 16, generator=g, dtype=torch.float64) for _ in range(3))
    for rope in ("numerator", "none"):
        ref = linear_attention(q, k, v, impl="naive", rope=rope)
        err = ((plain_chunk_linear_attention(q, k, v, rope=rope, chunk_size=chunk_size) - ref).norm() / ref.norm()).item()
        if not err < 1e-10:
            raise RuntimeError(f"plain chunked form disagrees with naive (rope={rope}): relative error {err:.2e}")


def fla_import():
    """(naive_chunk_linear_attn, None) when flash-linear-attention imports, else (None, the reason)."""
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except Exception as exc:  # noqa: BLE001 - any failure to import means "no row"
        return None, f"{type(exc).__name__}: {exc}"
    return naive_chunk_linear_attn, None


def fla_callable():
    """fla's pure-PyTorch chunked form with its normaliser (``normalize=True``; no feature map, no RoPE)."""
    fn, _ = fla_import()
    if fn is None:
        return None

    def run(q, k, v):  # fla >= 0.2 takes (B, N, H, d) and returns (B, N, H, d)
        return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), normalize=True)

    return run


def forms(chunk_size: int, selected=None):
    out = {
        "chunk": lambda q, k, v: linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size),
        "naive": lambda q, k, v: linear_attention(q, k, v, impl="naive"),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "plain": lambda q, k, v: plain_chunk_linear_attention(q, k, v, chunk_size=chunk_size),
    }
    fla = fla_callable() if (selected is None or "fla" in selected) else None
    if fla is not None:  # the fla row compares with our chunk form without RoPE (what fla computes)
        out["chunk_none"] = lambda q, k, v: linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size, rope="none")
        out["plain_none"] = lambda q, k, v: plain_chunk_linear_attention(q, k, v, rope="none", chunk_size=chunk_size)
        out["fla"] = fla
    if selected is not None:
        out = {k: f for k, f in out.items() if k in selected}
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
    fn = forms(chunk_size, [form])[form]
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


def measure_memory(form: str, n: int, chunk_size: int, timeout: float, retained: bool):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", form, str(n), "--chunk-size", str(chunk_size)]
    cmd += ["--threads", str(torch.get_num_threads())]  # the children run with the parent's thread count
    if not retained:
        cmd.append("--system-malloc")
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


# ------------------------------------------------------------------------------------------------------
# generation: time per token of the recurrent form at a given position
# ------------------------------------------------------------------------------------------------------
def _step_rounds(step, positions, tokens: int, rounds: int):
    """Per position: the median over ``rounds`` of (time of ``tokens`` consecutive steps) / tokens.

    ``step(pos_index, position)`` runs one token; the positions are visited in turn within each round, so
    that a slow drift of the machine hits them alike."""
    per = {p: [] for p in positions}
    for i, pos in enumerate(positions):  # warm-up
        for t in range(min(tokens, 20)):
            step(i, pos + t)
    for _ in range(rounds):
        for i, pos in enumerate(positions):
            t0 = time.perf_counter()
            for t in range(tokens):
                step(i, pos + t)
            per[pos].append((time.perf_counter() - t0) / tokens)
    return {pos: statistics.median(v) for pos, v in per.items()}


def generation_timing(positions, tokens: int, rounds: int, model_size: dict):
    """Time per generated token at each position: (a) ``recurrent_step`` at B=1, H=8, d=64, (b) the
    ``linear_rope`` TransformerLM's ``forward`` with states, one token at a time.  The state entering each
    position is the real one, built by the chunk form (op) or the model's forward (model) over a prefix of
    that length; the timed tokens then continue from it (positions pos, pos+1, …)."""
    from linrope.models.model import TransformerLM
    from linrope.ops import chunk_linear_attention
    from linrope.ops import recurrent_step

    results = {}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        # (a) the op
        states, steps_in = [], []
        for pos in positions:
            q, k, v = (torch.randn(B, H, pos, D, generator=g) for _ in range(3))
            _, st = chunk_linear_attention(q, k, v, output_final_state=True)
            states.append(st)
            steps_in.append([torch.randn(B, H, D, generator=g) for _ in range(3)])
            del q, k, v

        def op_step(i, pos):
            q, k, v = steps_in[i]
            _, states[i] = recurrent_step(q, k, v, states[i], position=pos)

        results["recurrent_step"] = _step_rounds(op_step, positions, tokens, rounds)

        # (b) the model
        torch.manual_seed(0)
        model = TransformerLM(dict(vocab_size=256, max_len=1024, causal=True,
                                   attention={"kind": "linear", "feature_map": "elu", "placement": "numerator",
                                              "impl": "chunk", "chunk_size": 64, "eps": 1e-6},
                                   position={"name": "rope", "base": 10000.0, "scaling": None, "factor": 1.0},
                                   **model_size)).eval()
        mstates, toks = [], []
        for pos in positions:
            prompt = torch.randint(0, 256, (1, pos), generator=g)
            _, st = model(prompt, return_states=True)
            mstates.append(st)
            toks.append(torch.randint(0, 256, (1, 1), generator=g))

        def model_step(i, pos):
            _, mstates[i] = model(toks[i], offset=pos, states=mstates[i], return_states=True)

        results["model"] = _step_rounds(model_step, positions, tokens, rounds)
    return results


def print_generation(args) -> None:
    size = dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024)
    pos = args.gen_positions
    print(f"## recurrent generation: time per token, {args.gen_tokens} consecutive tokens from each position, "
          f"median of {args.gen_rounds} rounds (positions interleaved)")
    print(f"op: recurrent_step B={B} H={H} d={D} float32, elu+1, RoPE numerator;  model: linear_rope "
          f"TransformerLM d_model={size['d_model']} layers={size['n_layers']} heads={size['n_heads']}, "
          "forward(token, offset=pos, states=…)")
    res = generation_timing(pos, args.gen_tokens, args.gen_rounds, size)
    print()
    head = ["form"] + [f"µs/token at {p}" for p in pos] + [f"ratio {pos[-1]}/{pos[0]}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for form, per in res.items():
        cells = [form] + [f"{per[p] * 1e6:.1f}" for p in pos] + [f"{per[pos[-1]] / per[pos[0]]:.3f}"]
        print("| " + " | ".join(cells) + " |")
    print()


def print_bf16_ratio(args) -> None:
    """float32 / bfloat16 time of the chunk form (fwd, fwd+bwd) and of a 2048³ matmul, rounds alternating."""
    C = args.chunk_size
    fn = forms(C, ["chunk"])["chunk"]
    lengths = args.lengths or [16384]
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    print(f"# chunk form, float32 vs bfloat16 inputs: B={B} H={H} d={D} causal, elu+1, RoPE numerator, C={C}")
    print(f"{machine_line()}, median of {args.rounds} alternating rounds")
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    mm = {name: [] for name in dtypes}
    for _ in range(args.rounds):
        for name, dt in dtypes.items():
            x, y = a.to(dt), b.to(dt)
            x @ y
            t0 = time.perf_counter()
            x @ y
            mm[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in mm.items()}
    print(f"2048³ torch.mm: float32 {2 * 2048**3 / med['float32'] / 1e9:.0f} GFLOP/s, bfloat16 "
          f"{2 * 2048**3 / med['bfloat16'] / 1e9:.0f} GFLOP/s: {med['float32'] / med['bfloat16']:.2f}×")
    print()
    print("| N | float32 fwd ms | bfloat16 fwd ms | fwd ratio | float32 f+b ms | bfloat16 f+b ms | f+b ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        times = {(name, bwd): [] for name in dtypes for bwd in (False, True)}
        inputs = {(name, bwd): make_inputs(n, bwd, dtype=dt) for name, dt in dtypes.items() for bwd in (False, True)}
        for key, (q, k, v) in inputs.items():
            for _ in range(args.warmup):
                run_once(fn, q, k, v, key[1])
        for _ in range(args.rounds):
            for key, (q, k, v) in inputs.items():
                t0 = time.perf_counter()
                run_once(fn, q, k, v, key[1])
                times[key].append(time.perf_counter() - t0)
        m = {key: statistics.median(v) * 1e3 for key, v in times.items()}
        f32f, bff, f32b, bfb = m["float32", False], m["bfloat16", False], m["float32", True], m["bfloat16", True]
        print(f"| {n} | {f32f:.1f} | {bff:.1f} | {f32f / bff:.2f}× | {f32b:.1f} | {bfb:.1f} | {f32b / bfb:.2f}× |",
              flush=True)


def print_bf16_errors(n: int = 2048, heads: int = 2) -> None:
    """Relative errors of the chunk form on bfloat16 inputs against float64 naive (docs/design.md, "Precision")."""
    import linrope.ops.linear_attn.chunk_kernel as CK
    from linrope.ops.rope import compute_dtype

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    rules = {"bfloat16 products": CK.matmul_dtype, "float32 products": lambda dtype, rope: compute_dtype(dtype)}
    print()
    print(f"errors against float64 naive on the same bfloat16 inputs (N={n}, H={heads}, d={D}; relative, in norm)")
    print()
    print("| feature map, placement, decay | products | output (floor) | final S | dq | dk | dv |")
    print("|---|---|---|---|---|---|---|")
    cases = [("elu", "numerator", None), ("elu", "numerator", torch.tensor([0.999, 0.99])),
             ("cosine", "numerator", None), ("elu", "none", None)]
    try:
        for fm, rope, decay in cases:
            g = torch.Generator().manual_seed(1)
            q, k, v = (torch.randn(1, heads, n, D, generator=g).bfloat16() for _ in range(3))
            w = torch.randn(1, heads, n, D, generator=g, dtype=torch.float64)
            kw = dict(feature_map=fm, rope=rope, decay=decay)
            ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
            ref, ref_state = linear_attention(*ref_leaves, impl="naive", output_final_state=True, **kw)
            (ref * w).sum().backward()
            floor = rel(ref.detach().bfloat16(), ref.detach())
            for label, rule in rules.items():
                CK.matmul_dtype = rule
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                out, state = linear_attention(*leaves, impl="chunk", output_final_state=True, **kw)
                (out.double() * w).sum().backward()
                errs = [rel(out.detach(), ref.detach()), rel(state.S, ref_state.S.detach())]
                errs += [rel(x.grad, r.grad) for x, r in zip(leaves, ref_leaves)]
                print(f"| {fm}, {rope}, {'decay' if decay is not None else 'no decay'} | {label} | {errs[0]:.1e} "
                      f"({floor:.1e}) | " + " | ".join(f"{e:.1e}" for e in errs[1:]) + " |", flush=True)
    finally:
        CK.matmul_dtype = rules["bfloat16 products"]


def print_targets(rows, peak: float) -> None:
    """Issue #7's ratios, where this run measured what they need: chunk (after) and plain (before)."""
    by_n = {r["n"]: r for r in rows}

    def get(n, key):
        return by_n.get(n, {}).get(key)

    def ratio(a, b):
        return a / b if a and b else None

    def both(after, before, fmt):
        cells = [f"chunk {fmt(after)}"] if after is not None else []
        if before is not None:
            cells.append(f"plain (before) {fmt(before)}")
        return ";  ".join(cells)

    times = lambda x: f"{x:.2f}×"  # noqa: E731
    lines = []
    for label, target, after, before, fmt in (
        ("1. SDPA / form, fwd+bwd at N=16384", "≥ 15×", ratio(get(16384, "sdpa_bwd"), get(16384, "chunk_bwd")),
         ratio(get(16384, "sdpa_bwd"), get(16384, "plain_bwd")), times),
        ("2. fla naive_chunk (normalize=True) / form with rope=none, fwd+bwd at N=65536", "≥ 3×",
         ratio(get(65536, "fla_bwd"), get(65536, "chunk_none_bwd")),
         ratio(get(65536, "fla_bwd"), get(65536, "plain_none_bwd")), times),
        ("3. fwd+bwd time(65536) / time(8192)", "≤ 9", ratio(get(65536, "chunk_bwd"), get(8192, "chunk_bwd")),
         ratio(get(65536, "plain_bwd"), get(8192, "plain_bwd")), lambda x: f"{x:.2f}"),
        ("4. fwd at N=65536, 8·C·d + 8·d² count, % of the matmul peak", "≥ 25%", get(65536, "gflops"),
         get(65536, "gflops_plain"), lambda x: f"{100 * x / peak:.0f}%"),
    ):
        text = both(after, before, fmt)
        if text:
            lines.append(f"{label}: {text} (target {target})")
    if lines:
        print("Issue #7 targets measured in this run:")
        for line in lines:
            print("  " + line)
        print()


def print_table(rows, peak: float, has_fla: bool) -> None:
    """One markdown row per N: times in ms, then ratios (how many times faster chunk is), then FLOP rates."""
    times = [("chunk", "chunk"), ("plain", "plain"), ("naive", "naive"), ("sdpa", "SDPA")]
    ratios = [("sdpa", "chunk"), ("sdpa", "plain"), ("plain", "chunk"), ("naive", "chunk")]
    if has_fla:
        times += [("chunk_none", "chunk rope=none"), ("plain_none", "plain rope=none"), ("fla", "fla")]
        ratios += [("fla", "chunk_none"), ("fla", "plain_none")]
    head = ["N"] + [f"{label} {kind} ms" for _, label in times for kind in ("fwd", "f+b")]
    head += [f"{a}/{b} {kind}" for a, b in ratios for kind in ("fwd", "f+b")]
    head += ["chunk fwd GFLOP/s (8Cd+8d²)", "% of mm peak", "plain fwd % of mm peak (8Cd+8d²)",
             "chunk fwd GFLOP/s (4Cd+4d²)", "% of mm peak"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        g = r.get
        cells = [str(r["n"])] + [fmt_ms(g(f"{form}_{kind}")) for form, _ in times for kind in ("fwd", "bwd")]
        cells += [fmt_ratio(g(f"{a}_{kind}"), g(f"{b}_{kind}")) for a, b in ratios for kind in ("fwd", "bwd")]
        pct = lambda key: "–" if g(key) is None else f"{100 * g(key) / peak:.0f}%"  # noqa: E731
        cells += ["–" if g("gflops") is None else f"{g('gflops'):.1f}", pct("gflops"), pct("gflops_plain"),
                  "–" if g("gflops_mm") is None else f"{g('gflops_mm'):.1f}", pct("gflops_mm")]
        print("| " + " | ".join(cells) + " |")
    print()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths N (default 1k … 64k)")
    p.add_argument("--forms", nargs="+", default=None, choices=["chunk", "naive", "sdpa", "plain", "chunk_none", "plain_none", "fla"],
                   help="forms to time (default: all; chunk_none and plain_none, the chunk and plain forms "
                        "with rope='none', come with fla)")
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
    p.add_argument("--generation", action="store_true",
                   help="also time recurrent generation per token at --gen-positions (issue #7, target 5)")
    p.add_argument("--generation-only", action="store_true", help="only the generation timing")
    p.add_argument("--bf16", action="store_true",
                   help="only the chunk form's float32 / bfloat16-input time ratio (issue 24), rounds alternating")
    p.add_argument("--rounds", type=int, default=9, help="alternating rounds of --bf16; medians reported")
    p.add_argument("--gen-positions", type=int, nargs="+", default=[1024, 65536],
                   help="positions at which generation is timed (the ratio is last / first)")
    p.add_argument("--gen-tokens", type=int, default=200, help="consecutive tokens timed per position and round")
    p.add_argument("--gen-rounds", type=int, default=7, help="rounds per position; the median is reported")
    p.add_argument("--system-malloc", action="store_true",
                   help="leave malloc as it is; by default the benchmark, like train.py, keeps freed memory for "
                        "reuse (linrope.base.memory.retain_freed_memory), for every form alike")
    p.add_argument("--_child", nargs=2, metavar=("FORM", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    retained = False if args.system_malloc else retain_freed_memory()
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
    if args.bf16:
        print_bf16_ratio(args)
        print_bf16_errors()
        return
    if args.generation_only:
        print(f"{machine_line()}")
        print_generation(args)
        return

    fns = forms(C, args.forms)
    if "plain" in fns or "plain_none" in fns:
        check_plain(C)
    print(f"# linear attention benchmark: B={B} H={H} d={D} float32 causal, elu+1, RoPE numerator, chunk C={C}")
    print(f"{machine_line()}, median of {repeats} after {args.warmup} warm-up")
    peak = matmul_peak_gflops()
    print(f"float32 matmul peak (2048³ torch.mm): {peak:.1f} GFLOP/s")
    print("malloc: " + ("freed memory kept for reuse (linrope.base.memory.retain_freed_memory)" if retained
                        else "as the system has it (--system-malloc, or not glibc)"))
    if "fla" not in fns and (args.forms is None or "fla" in args.forms):
        print(f"fla row skipped: flash-linear-attention not importable ({fla_import()[1]})")
    elif "fla" in fns:
        print("fla row: fla.ops.linear_attn.naive.naive_chunk_linear_attn(normalize=True) on the raw q, k, v "
              "(no feature map, no RoPE), against chunk_none = our chunk form with rope='none' (elu+1 included)")
    print()

    issue_flops = 8 * C * D + 8 * D * D  # the issue's count per token per head
    matmul_flops = 4 * C * D + 4 * D * D  # QKᵀ, PV, KᵀV, Q·S of the numerator, 2 FLOPs per multiply-add
    scaling = {"chunk": 1, "chunk_none": 1, "plain": 1, "plain_none": 1, "fla": 1, "naive": 2, "sdpa": 2}
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
        for form, key in (("chunk", "gflops"), ("plain", "gflops_plain")):
            if row.get(form + "_fwd"):
                row[key] = B * H * n * issue_flops / row[form + "_fwd"] / 1e9
        if row.get("chunk_fwd"):
            row["gflops_mm"] = B * H * n * matmul_flops / row["chunk_fwd"] / 1e9
        rows.append(row)
        print(f"N={n}: " + ", ".join(f"{k}={v * 1e3:.1f}ms" for k, v in row.items() if k.endswith(("_fwd", "_bwd"))),
              flush=True)
    print()
    print_table(rows, peak, "fla" in fns)
    print(f"FLOPs per token per head, forward: 8·C·d + 8·d² = {issue_flops} (the issue's count) and "
          f"4·C·d + 4·d² = {matmul_flops} (the numerator's matmuls QKᵀ, PV, KᵀV, Q·S at 2 FLOPs per multiply-add; "
          "the denominator, feature map and RoPE are not counted).  "
          "'–': not run (naive above --naive-max, or predicted over --budget-s).")
    print()
    print_targets(rows, peak)
    if args.generation:
        print_generation(args)

    if args.no_memory:
        return
    print()
    print("Peak RSS of a fresh process running one forward+backward (MB above the RSS before the call; total peak in brackets)")
    print()
    mem_forms = [f for f in fns if f not in ("fla", "chunk_none", "plain_none")]
    print("| N | " + " | ".join(mem_forms) + " | inputs q,k,v |")
    print("|" + "---|" * (len(mem_forms) + 2))
    for r in rows:
        n = r["n"]
        cells = []
        for form in mem_forms:
            if (form + "_bwd") not in r:
                cells.append("–")
                continue
            m = measure_memory(form, n, C, timeout=max(120.0, 20 * r[form + "_bwd"]), retained=retained)
            cells.append(m.get("error") or f"{m['delta_mb']:.0f} ({m['peak_mb']:.0f})")
        inputs_mb = 3 * B * H * n * D * 4 / 2**20
        print(f"| {n} | " + " | ".join(cells) + f" | {inputs_mb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
