"""Benchmark: end-to-end training throughput of ``linear_rope`` against ``softmax_rope`` (issue #7, target 6).

Each model is composed from the repo's own configs, as ``python train.py model=<preset>`` composes it
(``conf/train.yaml`` with ``conf/model/<preset>.yaml``, ``conf/size/small.yaml`` by default: d_model=256,
4 layers, 4 heads, d_ff=1024, byte vocabulary 256), and built by ``linrope.training.build_module`` into the
LightningModule train.py trains, all in this one process:

  * ``linear_rope``  – linear attention, elu+1, RoPE in the numerator, ``impl="chunk"`` (C=64),
  * ``softmax_rope`` – softmax attention through torch SDPA (causal), RoPE on q, k
  (``--models`` takes any preset of ``conf/model/``).

One training step = forward, the module's own loss (next-token cross-entropy), backward, gradient clipping
at ``trainer.gradient_clip_val`` (1.0) and a step of the optimizer and learning-rate schedule the module's
``configure_optimizers`` builds from ``conf/optim/`` (AdamW, its weight-decay groups and warm-up/cosine
schedule, exactly as in training) on random bytes.  For each context length every model first runs
``--warmup`` untimed steps; then ``--steps`` timed rounds alternate the models step by step (so slow drifts
of the machine hit both alike), and each model's time per step is the median over its timed steps.
Tokens/s = batch · context / median step time; the ratio is linear_rope tokens/s over softmax_rope tokens/s
at the same context.  ``--d-model``, ``--layers``, ``--heads``, ``--d-ff`` and ``--chunk-size`` override the
composed sizes (``model.d_model=…`` and so on); more Hydra overrides go after ``--override``.

With ``--precision 32-true bf16-mixed`` each model is timed at each precision in the same process, the steps
of all of them alternating.  ``bf16-mixed`` is what Lightning's ``trainer.precision=bf16-mixed`` does on CPU:
the forward and the loss run under ``torch.autocast("cpu", dtype=torch.bfloat16)``, the backward and the
optimizer step outside it, weights and optimizer state float32.  The table then adds each model's
bf16-mixed/32-true tokens/s (issue 24's target: ≥ 1.5× for linear_rope at the default size and context,
with softmax_rope's ratio beside it).

With ``--compile`` each model is timed twice in the same process, eager and under ``torch.compile``
(``compile=true``: the module compiles its model in ``configure_model``, Inductor): the table then adds
compiled/eager tokens/s per model, compiled linear_rope over compiled softmax_rope, and the compile time
(the first warm-up step's time less the median step time).

Usage:  python benchmarks/train_throughput.py                       # context 8192
        python benchmarks/train_throughput.py --context 1024 4096 8192 --steps 5
        python benchmarks/train_throughput.py --compile --context 256 --batch 8 --models linear_rope
        python benchmarks/train_throughput.py --context 1024 --override size=tiny optim.weight_decay=0
        python benchmarks/train_throughput.py --context 256 --batch 16 --precision 32-true bf16-mixed --steps 9
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linrope.memory import retain_freed_memory  # noqa: E402
from linrope.provenance import machine_line  # noqa: E402
from linrope.sweeps import compose_train  # noqa: E402
from linrope.training import build_module  # noqa: E402

CONF = ROOT / "conf"
PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16}  # what Lightning's precision plugin does on CPU
DEFAULT_MODELS = ["linear_rope", "softmax_rope"]


def compose_config(name: str, args, context: int, compiled: bool) -> DictConfig:
    """``conf/train.yaml`` with ``model=<name>``, this context and the sizes given on the command line."""
    overrides = [f"model={name}", f"context={context}", f"compile={str(compiled).lower()}", "logger=none"]
    sizes = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads, "d_ff": args.d_ff}
    overrides += [f"model.{k}={v}" for k, v in sizes.items() if v is not None]
    overrides += list(args.override)
    cfg = compose_train(overrides)
    cfg.optim.schedule_steps = int(cfg.trainer.max_steps)  # the schedule's length, as a Trainer would give it
    if args.chunk_size is not None and cfg.model.attention.get("kind") == "linear":
        cfg.model.attention.chunk_size = args.chunk_size
    return cfg


class Trainer:
    def __init__(self, name: str, args, context: int, compiled: bool = False, precision: str = "32-true"):
        self.name = name + (" compiled" if compiled else "") + (f" {precision}" if len(args.precision) > 1 else "")
        self.autocast = AUTOCAST[precision]
        cfg = compose_config(name, args, context, compiled)
        self.cfg = cfg
        torch.manual_seed(args.seed)
        self.module = build_module(cfg)
        self.module.configure_model()  # compile=true: compiles the model in place, as the Lightning Trainer would
        self.module.train()
        optimizers = self.module.configure_optimizers()
        self.opt = optimizers["optimizer"]
        self.sched = optimizers["lr_scheduler"]["scheduler"]
        self.clip = cfg.trainer.get("gradient_clip_val")
        self.first: float = 0.0
        vocab = int(cfg.model.vocab_size)
        g = torch.Generator().manual_seed(args.seed)
        self.data = torch.randint(0, vocab, (args.batch, context + 1), generator=g)
        self.times: list[float] = []

    def step(self) -> float:
        batch = (self.data[:, :-1], self.data[:, 1:])
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with (torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext()):
            loss = self.module.loss(batch)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), float(self.clip))
        self.opt.step()
        self.sched.step()
        dt = time.perf_counter() - t0
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: non-finite loss {loss.item()}")
        return dt


def header(args, first: Trainer, retained: bool) -> None:
    m = first.cfg.model
    print(f"# training throughput: d_model={m.d_model} layers={m.n_layers} heads={m.n_heads} d_ff={m.d_ff} "
          f"batch={args.batch}, {' / '.join(args.precision)}, {type(first.opt).__name__} + clip {first.clip}")
    print(f"{machine_line()}; {args.warmup} warm-up steps per model, "
          f"median of {args.steps} timed steps (models alternating); malloc: "
          + ("freed memory kept for reuse" if retained else "as the system has it"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--context", type=int, nargs="+", default=[8192], help="context lengths (tokens) to time")
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=PRESETS, metavar="PRESET",
                   help=f"model presets (conf/model/) to time; default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--d-model", type=int, default=None, help="model.d_model (default: conf/size/small.yaml's)")
    p.add_argument("--layers", type=int, default=None, help="model.n_layers (default: the size config's)")
    p.add_argument("--heads", type=int, default=None, help="model.n_heads (default: the size config's)")
    p.add_argument("--d-ff", type=int, default=None, help="model.d_ff (default: the size config's)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=None,
                   help="chunk size of linear attention's chunked kernel (default: conf/attention/linear.yaml's)")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per model (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="time every model eager and compiled (torch.compile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--precision", nargs="+", default=["32-true"], choices=list(AUTOCAST),
                   help="trainer.precision values to time, each model at each (bf16-mixed: autocast as Lightning)")
    p.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE",
                   help="more Hydra overrides of conf/train.yaml for every model (size=tiny, optim.lr=1e-3, ...)")
    p.add_argument("--system-malloc", action="store_true",
                   help="leave malloc as it is; by default freed memory is kept for reuse, as train.py does "
                        "(linrope.memory.retain_freed_memory)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    retained = False if args.system_malloc else retain_freed_memory()

    rows = []
    for ctx in args.context:
        trainers = [Trainer(name, args, ctx, c, prec) for name in args.models
                    for c in ((False, True) if args.compile else (False,)) for prec in args.precision]
        if not rows:
            header(args, trainers[0], retained)
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
    suffixes = [f" {p_}" for p_ in args.precision] if len(args.precision) > 1 else [""]
    names = [n + c + s_ for n in args.models for c in (("", " compiled") if args.compile else ("",)) for s_ in suffixes]
    mixed = [n for n in args.models if len(args.precision) > 1 and not args.compile
             and {"32-true", "bf16-mixed"} <= set(args.precision)]
    head = ["context"] + [f"{n} ms/step" for n in names] + [f"{n} tokens/s" for n in names]
    both = "linear_rope" in names and "softmax_rope" in names
    if both:
        head.append("linear/softmax tokens/s")
        if args.compile:
            head.append("compiled linear/softmax tokens/s")
    if args.compile:
        head += [f"{n} compiled/eager tokens/s" for n in args.models] + [f"{n} compile s" for n in args.models]
    head += [f"{n} bf16-mixed/32-true tokens/s" for n in mixed]
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
        cells += [f"{r[n + ' 32-true'] / r[n + ' bf16-mixed']:.2f}×" for n in mixed]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
