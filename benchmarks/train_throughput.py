"""Benchmark: end-to-end training throughput of ``linear_rope`` against ``softmax_rope`` (issue #7, target 6).

Both models are ``linrope.model.TransformerLM`` at the same size (default: the repo's ``size=small`` shapes,
d_model=256, 4 layers, 4 heads, d_ff=1024, byte vocabulary 256), built in this one process:

  * ``linear_rope``  – linear attention, elu+1, RoPE in the numerator, ``impl="chunk"`` (C=64)
                       (= ``conf/model/linear_rope.yaml``),
  * ``softmax_rope`` – softmax attention through torch SDPA (causal), RoPE on q, k
                       (= ``conf/model/softmax_rope.yaml``).

One training step = forward, next-token cross-entropy, backward, gradient clipping at 1.0 and an AdamW step
(lr 2e-3, betas (0.9, 0.95), weight decay 0.1: the repo's optimiser settings) on random bytes.  For each
context length every model first runs ``--warmup`` untimed steps; then ``--steps`` timed rounds alternate
the models step by step (so slow drifts of the machine hit both alike), and each model's time per step is
the median over its timed steps.  Tokens/s = batch · context / median step time; the ratio is
linear_rope tokens/s over softmax_rope tokens/s at the same context.

With ``--compile`` each model is timed twice in the same process, eager and under ``torch.compile``
(``nn.Module.compile``, Inductor): the table then adds compiled/eager tokens/s per model, compiled linear_rope
over compiled softmax_rope, and the compile time (the first warm-up step's time less the median step time).

Usage:  python benchmarks/train_throughput.py                       # context 8192
        python benchmarks/train_throughput.py --context 1024 4096 8192 --steps 5
        python benchmarks/train_throughput.py --compile --context 256 --batch 8 --models linear_rope
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.memory import retain_freed_memory  # noqa: E402
from linrope.model import TransformerLM  # noqa: E402

ROPE = {"name": "rope", "base": 10000.0, "scaling": None, "factor": 1.0}
MODELS = {
    "linear_rope": {"kind": "linear", "feature_map": "elu", "placement": "numerator", "impl": "chunk",
                    "chunk_size": 64, "eps": 1e-6},
    "softmax_rope": {"kind": "softmax"},
}


def build(name: str, args, context: int, seed: int) -> TransformerLM:
    attention = dict(MODELS[name])
    if attention["kind"] == "linear":
        attention["chunk_size"] = args.chunk_size
    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, d_ff=args.d_ff,
               dropout=0.0, max_len=context, causal=True, attention=attention, position=dict(ROPE))
    return TransformerLM(cfg)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=2e-3, betas=(0.9, 0.95))


class Trainer:
    def __init__(self, name: str, args, context: int, compiled: bool = False):
        self.name = name + (" compiled" if compiled else "")
        self.model = build(name, args, context, args.seed)
        self.model.train()
        if compiled:
            self.model.compile()
        self.first: float = 0.0
        self.opt = make_optimizer(self.model)
        g = torch.Generator().manual_seed(args.seed)
        self.data = torch.randint(0, 256, (args.batch, context + 1), generator=g)
        self.times: list[float] = []

    def step(self) -> float:
        x, y = self.data[:, :-1], self.data[:, 1:]
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        dt = time.perf_counter() - t0
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: non-finite loss {loss.item()}")
        return dt


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--context", type=int, nargs="+", default=[8192], help="context lengths (tokens) to time")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models to time")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=64, help="chunk size of linear_rope's chunked kernel")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per model (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="time every model eager and compiled (torch.compile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--system-malloc", action="store_true",
                   help="leave malloc as it is; by default freed memory is kept for reuse, as train.py does "
                        "(linrope.memory.retain_freed_memory)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    retained = False if args.system_malloc else retain_freed_memory()

    print(f"# training throughput: d_model={args.d_model} layers={args.layers} heads={args.heads} d_ff={args.d_ff} "
          f"batch={args.batch}, float32, AdamW + clip 1.0")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.warmup} warm-up steps per model, "
          f"median of {args.steps} timed steps (models alternating); malloc: "
          + ("freed memory kept for reuse" if retained else "as the system has it"))
    rows = []
    for ctx in args.context:
        trainers = [Trainer(name, args, ctx, c) for name in args.models for c in ((False, True) if args.compile else (False,))]
        for tr in trainers:
            for i in range(args.warmup):
                dt = tr.step()
                tr.first = tr.first or dt
        for _ in range(args.steps):
            for tr in trainers:
                tr.times.append(tr.step())
        row = {"context": ctx}
        for tr in trainers:
            med = statistics.median(tr.times)
            row[tr.name] = med
            row[tr.name + " first"] = tr.first
            print(f"context={ctx} {tr.name}: first step {tr.first:.1f} s; step times " + ", ".join(f"{t * 1e3:.0f}" for t in tr.times)
                  + f" ms; median {med * 1e3:.0f} ms, {args.batch * ctx / med:.0f} tokens/s", flush=True)
        rows.append(row)
        del trainers

    print()
    names = [n + c for n in args.models for c in (("", " compiled") if args.compile else ("",))]
    head = ["context"] + [f"{n} ms/step" for n in names] + [f"{n} tokens/s" for n in names]
    both = "linear_rope" in names and "softmax_rope" in names
    if both:
        head.append("linear/softmax tokens/s")
        if args.compile:
            head.append("compiled linear/softmax tokens/s")
    if args.compile:
        head += [f"{n} compiled/eager tokens/s" for n in args.models] + [f"{n} compile s" for n in args.models]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        tok = lambda n: args.batch * r["context"] / r[n]  # noqa: E731
        cells = [str(r["context"])] + [f"{r[n] * 1e3:.0f}" for n in names] + [f"{tok(n):.0f}" for n in names]
        if both:
            cells.append(f"{r['softmax_rope'] / r['linear_rope']:.2f}×")
            if args.compile:
                cells.append(f"{r['softmax_rope compiled'] / r['linear_rope compiled']:.2f}×")
        if args.compile:
            cells += [f"{r[n] / r[n + ' compiled']:.2f}×" for n in args.models]
            cells += [f"{r[n + ' compiled first'] - r[n + ' compiled']:.0f}" for n in args.models]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
