"""Precision: what bfloat16 inputs buy a form in time, and what they cost linrope's chunk kernel in accuracy.

Speed: a form's forward and forward+backward (default ``chunk``, linrope's chunked kernel; any key of
benchmarks/forms.py) at ``--lengths`` (default 16 384) with float32 inputs and with the same inputs in bfloat16,
the four alternating for ``--rounds`` rounds (benchmarks/timing.py: the load of a shared machine hits them
alike), each a median over its rounds; printed: float32 time ÷ bfloat16 time, and for scale the same ratio of
a 2048³ ``torch.mm``.  B=1, H=8, d=64, causal, elu+1, RoPE in the numerator, C=64.

Accuracy: the relative error (in norm) of linrope chunk's output, final state and gradients on bfloat16 inputs
against the float64 naive form on the same inputs (N = ``--error-length`` 2048, H = 2), once with the bfloat16
products the kernel uses and once with float32 products (``chunk_kernel.matmul_dtype`` swapped for the run,
then restored, and the native walk off: elu+1 with RoPE in the numerator and no decay walks natively, its products
bfloat16, ``native_bf16.py``), beside the floor: the float64 output rounded to bfloat16.  docs/mathematics.md, "Precision", gives
the rule.

Usage:  python benchmarks/precision.py --rounds 9
        python benchmarks/precision.py --threads 1 --no-errors
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY, B, C, D, H, legend, lookup, make_inputs  # noqa: E402
from linrope.ops import linear_attention  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def speed(key: str, lengths, rounds: int, warmup: int, mm_size: int) -> list[str]:
    form = REGISTRY[key]
    fn = form.build(C, torch.device("cpu"))
    a, b = torch.randn(mm_size, mm_size), torch.randn(mm_size, mm_size)
    mats = {name: (a.to(dt), b.to(dt)) for name, dt in DTYPES.items()}
    mm = {name: (lambda x=x, y=y: x @ y) for name, (x, y) in mats.items()}
    rate = {name: 2 * mm_size**3 / t / 1e9 for name, t in timing.medians(timing.rounds(mm, rounds=rounds)).items()}
    f32, bf16 = rate["float32"], rate["bfloat16"]
    out = [f"{mm_size}³ torch.mm: float32 {f32:.0f} GFLOP/s, bfloat16 {bf16:.0f} GFLOP/s: {bf16 / f32:.2f}×", ""]
    rows = []
    for n in lengths:
        calls = {}
        for name, dt in DTYPES.items():
            (q, k, v), grad = make_inputs(form, n, dtype=dt)
            calls[name, "fwd+bwd"], calls[name, "fwd"] = timing.passes(fn, q, k, v, grad)
        m = {key_: t * 1e3 for key_, t in timing.medians(timing.rounds(calls, rounds=rounds, warmup=warmup)).items()}
        rows.append([n, form.label])
        for p in ("fwd", "fwd+bwd"):
            f32, bf16 = m["float32", p], m["bfloat16", p]
            rows[-1] += [f"{f32:.1f}", f"{bf16:.1f}", timing.fmt_ratio(timing.ratio(f32, bf16))]
    head = ["N", "form"] + [
        f"{p} {h}" for p in ("fwd", "fwd+bwd") for h in ("float32 ms", "bfloat16 ms", "float32 ÷ bfloat16")
    ]
    return out + timing.table(head, rows)


def errors(n: int, heads: int = 2) -> list[str]:
    """Relative errors of linrope chunk on bfloat16 inputs against float64 naive, bfloat16 and float32 products."""
    import linrope.ops.linear_attn.chunk_kernel as CK
    from linrope.ops.linear_attn import native_chunk
    from linrope.ops.rope import compute_dtype

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    rules = {"bfloat16 products": CK.matmul_dtype, "float32 products": lambda dtype, rope: compute_dtype(dtype)}
    decay = torch.tensor([0.999, 0.99])
    cases = [
        ("elu", "numerator", None),
        ("elu", "numerator", decay),
        ("cosine", "numerator", None),
        ("elu", "none", None),
    ]
    rows = []
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
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            walk = native_chunk.ENABLED and label == "bfloat16 products"  # the bfloat16 walk's products are bfloat16
            with mock.patch.object(CK, "matmul_dtype", rule), mock.patch.object(native_chunk, "ENABLED", walk):
                out, state = linear_attention(*leaves, impl="chunk", output_final_state=True, **kw)
                (out.double() * w).sum().backward()
            errs = [rel(out.detach(), ref.detach()), rel(state.S, ref_state.S.detach())]
            errs += [rel(x.grad, r.grad) for x, r in zip(leaves, ref_leaves)]
            case = f"{fm}, {rope}, {'decay' if decay is not None else 'no decay'}"
            rows.append([case, label, f"{errs[0]:.1e} ({floor:.1e})"] + [f"{e:.1e}" for e in errs[1:]])
    return [
        f"linrope chunk on bfloat16 inputs against float64 linrope naive on the same inputs (N={n}, H={heads}, "
        f"d={D}; relative error, in norm)",
        "",
    ] + timing.table(["feature map, placement, decay", "products", "output (floor)", "final S", "dq", "dk", "dv"], rows)


def main(argv=None) -> None:
    p = timing.parser(__doc__)
    p.add_argument("--form", default="chunk", help="the form timed in both precisions (a key of benchmarks/forms.py)")
    p.add_argument("--lengths", type=int, nargs="+", default=[16384], help="sequence lengths N of the speed table")
    p.add_argument("--rounds", type=int, default=9, help="alternating rounds; medians reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each before the rounds")
    p.add_argument("--mm-size", type=int, default=2048, help="size of the matmul timed for scale")
    p.add_argument("--error-length", type=int, default=2048, help="N of the accuracy table")
    p.add_argument("--no-errors", action="store_true", help="only the speed table")
    args = p.parse_args(argv)
    try:
        key = lookup(args.form).key
    except KeyError as e:
        p.error(f"--form: {e.args[0]}")
    timing.start(args)
    timing.header(
        f"precision: float32 vs bfloat16 inputs, B={B} H={H} d={D} causal, C={C}",
        f"median of {args.rounds} alternating rounds after {args.warmup} warm-up",
    )
    lines = legend([key]) + [""] + speed(key, args.lengths, args.rounds, args.warmup, args.mm_size)
    print("\n".join(lines), flush=True)
    if not args.no_errors:
        print("\n".join([""] + errors(args.error_length)), flush=True)


if __name__ == "__main__":
    main()
