"""Training throughput: tokens/s of whole training steps, ``linear_rope`` against ``softmax_rope``.

Each model is composed from the repo's own configs, as ``python train.py model=<preset>`` composes it
(``conf/train.yaml`` with ``conf/model/<preset>.yaml``, ``conf/size/small.yaml`` by default: d_model=256,
4 layers, 4 heads, d_ff=1024, byte vocabulary 256), and built by ``linrope.training.builders.build_module`` into the
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

On a GPU (``--device cuda``) the model, its optimizer state and the data live on the GPU, every step is timed
between two ``torch.cuda.synchronize()`` calls, ``bf16-mixed`` autocasts on CUDA (as Lightning does there), and
each model's row adds its peak memory: its own weights and optimizer state plus the largest rise of
``torch.cuda.max_memory_allocated`` above what was allocated when one of its steps began (the other models,
resident alongside, are not counted).  ``--models`` also takes ``PRESET:KEY=VALUE[,KEY=VALUE]`` for a
variant of a preset, e.g. ``linear_rope:model.attention.impl=fla``; the label is that string.  A model that
fails (out of memory, a backend missing) becomes a row saying what failed and the others go on (exit status
1); ``LINROPE_BENCH_FAIL=<label>`` makes that model fail on purpose.  ``--jsonl`` appends one JSON line per
model and context as it is timed (benchmarks/gpu_check.py builds its report from them).

Usage:  python benchmarks/train_throughput.py                       # context 8192
        python benchmarks/train_throughput.py --context 1024 4096 8192 --steps 5
        python benchmarks/train_throughput.py --compile --context 256 --batch 8 --models linear_rope
        python benchmarks/train_throughput.py --context 1024 --override size=tiny optim.weight_decay=0
        python benchmarks/train_throughput.py --context 256 --batch 16 --precision 32-true bf16-mixed --steps 9
        python benchmarks/train_throughput.py --device cuda --precision bf16-mixed --override size=base \
            --context 4096 --batch 4 --models linear_rope linear_rope:model.attention.impl=fla softmax_rope
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import timing  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from linrope.base.errors import BackendUnavailable  # noqa: E402
from linrope.base.memory import retain_freed_memory  # noqa: E402
from linrope.run.provenance import machine_line  # noqa: E402
from linrope.studies.sweeps import compose_train  # noqa: E402
from linrope.training.builders import build_module  # noqa: E402

CONF = ROOT / "conf"
PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16}  # what Lightning's precision plugin autocasts to
DEFAULT_MODELS = ["linear_rope", "softmax_rope"]
OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5: only torch.cuda's


def model_spec(text: str) -> tuple[str, list[str]]:
    """``PRESET[:KEY=VALUE[,KEY=VALUE]]`` -> (preset, overrides); argparse's check of --models."""
    preset, _, rest = text.partition(":")
    if preset not in PRESETS:
        raise argparse.ArgumentTypeError(f"{preset!r} is not a preset of conf/model/ ({', '.join(PRESETS)})")
    overrides = [o for o in rest.split(",") if o]
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad[0]!r} is not KEY=VALUE")
    return preset, overrides


def compose_config(name: str, args, context: int, compiled: bool) -> DictConfig:
    """``conf/train.yaml`` with ``model=<name>`` (and a variant's overrides), this context and the sizes given
    on the command line."""
    preset, variant = model_spec(name)
    overrides = [f"model={preset}", f"context={context}", f"compile={str(compiled).lower()}", "logger=none"]
    sizes = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads, "d_ff": args.d_ff}
    overrides += [f"model.{k}={v}" for k, v in sizes.items() if v is not None]
    overrides += list(args.override) + variant
    cfg = compose_train(overrides)
    cfg.optim.schedule_steps = int(cfg.trainer.max_steps)  # the schedule's length, as a Trainer would give it
    if args.chunk_size is not None and cfg.model.attention.get("kind") == "linear":
        cfg.model.attention.chunk_size = args.chunk_size
    return cfg


def classify(e: BaseException, device: torch.device) -> tuple[str, str]:
    """(status, one line saying what failed): fla missing on a CPU is "unavailable", OOM is named as such."""
    first = (str(e).strip().splitlines() or [""])[0][:160]
    if isinstance(e, BackendUnavailable) and device.type == "cpu":
        return "unavailable", first
    oom = isinstance(e, OOM) or "out of memory" in first.lower()
    return "failed", (f"OOM: {first}" if oom else f"{type(e).__name__}: {first}")


def tensor_mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t)) / 2**20


class Trainer:
    def __init__(self, name: str, args, context: int, compiled: bool = False, precision: str = "32-true"):
        self.model = name
        self.precision = precision
        self.name = name + (" compiled" if compiled else "") + (f" {precision}" if len(args.precision) > 1 else "")
        self.device = torch.device(args.device)
        self.autocast = AUTOCAST[precision]
        self.error: str | None = None
        self.status = "ok"
        self.first: float = 0.0
        self.times: list[float] = []
        self.peak_mib: float | None = None
        cfg = compose_config(name, args, context, compiled)
        self.cfg = cfg
        torch.manual_seed(args.seed)
        self.module = build_module(cfg).to(self.device)
        self.module.configure_model()  # compile=true: compiles the model in place, as the Lightning Trainer would
        self.module.train()
        optimizers = self.module.configure_optimizers()
        self.opt = optimizers["optimizer"]
        self.sched = optimizers["lr_scheduler"]["scheduler"]
        self.clip = cfg.trainer.get("gradient_clip_val")
        vocab = int(cfg.model.vocab_size)
        g = torch.Generator().manual_seed(args.seed)
        self.data = torch.randint(0, vocab, (args.batch, context + 1), generator=g).to(self.device)

    def resident_mib(self) -> float:
        """This model's weights and optimizer state on the device."""
        state = [t for s in self.opt.state.values() for t in s.values()]
        return tensor_mib(list(self.module.parameters()) + state)

    def step(self) -> float:
        timing.forced_failure(self.model)
        batch = (self.data[:, :-1], self.data[:, 1:])
        cuda = self.device.type == "cuda"
        sync(self.device)
        if cuda:
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        autocast = torch.autocast(self.device.type, dtype=self.autocast) if self.autocast else contextlib.nullcontext()
        with autocast:
            loss = self.module.loss(batch)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), float(self.clip))
        self.opt.step()
        self.sched.step()
        sync(self.device)
        dt = time.perf_counter() - t0
        if cuda:
            rise = (torch.cuda.max_memory_allocated(self.device) - before) / 2**20
            self.peak_mib = max(self.peak_mib or 0.0, rise + self.resident_mib())
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: non-finite loss {loss.item()}")
        return dt

    def fail(self, e: BaseException) -> None:
        self.status, self.error = classify(e, self.device)
        for attr in ("module", "opt", "sched", "data"):  # free its memory for the models still running
            if hasattr(self, attr):
                delattr(self, attr)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def guarded_step(self) -> float | None:
        """One step; its time, or None once this model has failed (the failure is kept as its row)."""
        if self.error is None:
            try:
                dt = self.step()
            except Exception as e:  # noqa: BLE001 - one model's failure is its row; the others go on
                self.fail(e)
                return
            self.first = self.first or dt
            return dt
        return None


class Failed:
    """A model whose construction failed: it only has its row."""

    def __init__(self, name: str, args, compiled: bool, precision: str, e: BaseException):
        self.model, self.precision, self.first, self.times, self.peak_mib = name, precision, 0.0, [], None
        self.name = name + (" compiled" if compiled else "") + (f" {precision}" if len(args.precision) > 1 else "")
        self.status, self.error = classify(e, torch.device(args.device))

    def guarded_step(self) -> None:
        return None


def make_trainer(name: str, args, context: int, compiled: bool, precision: str):
    try:
        return Trainer(name, args, context, compiled, precision)
    except Exception as e:  # noqa: BLE001
        return Failed(name, args, compiled, precision, e)


def header(args, first, retained: bool) -> None:
    m = first.cfg.model if hasattr(first, "cfg") else None  # None: every model failed to build
    sizes = f"d_model={m.d_model} layers={m.n_layers} heads={m.n_heads} d_ff={m.d_ff} " if m is not None else ""
    opt = f"{type(first.opt).__name__} + clip {first.clip}" if hasattr(first, "opt") else "the optimizer did not build"
    print(f"# training throughput on {args.device}: {sizes}batch={args.batch}, {' / '.join(args.precision)}, {opt}")
    print(
        f"{machine_line()}; {args.warmup} warm-up steps per model, "
        f"median of {args.steps} timed steps (models alternating); malloc: "
        + ("freed memory kept for reuse" if retained else "as the system has it"),
        flush=True,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--context", type=int, nargs="+", default=[8192], help="context lengths (tokens) to time")
    p.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_MODELS,
        metavar="PRESET[:KEY=VALUE,...]",
        help=f"model presets (conf/model/) to time, each optionally with overrides of its own; "
        f"default: {' '.join(DEFAULT_MODELS)}",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: model, optimizer and data there")
    p.add_argument("--d-model", type=int, default=None, help="model.d_model (default: conf/size/small.yaml's)")
    p.add_argument("--layers", type=int, default=None, help="model.n_layers (default: the size config's)")
    p.add_argument("--heads", type=int, default=None, help="model.n_heads (default: the size config's)")
    p.add_argument("--d-ff", type=int, default=None, help="model.d_ff (default: the size config's)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="chunk size of linear attention's chunked kernel (default: conf/attention/linear.yaml's)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per model (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="time every model eager and compiled (torch.compile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument(
        "--precision",
        nargs="+",
        default=["32-true"],
        choices=list(AUTOCAST),
        help="trainer.precision values to time, each model at each (bf16-mixed: autocast as Lightning)",
    )
    p.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="more Hydra overrides of conf/train.yaml for every model (size=tiny, optim.lr=1e-3, ...)",
    )
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave malloc as it is; by default freed memory is kept for reuse, as train.py does "
        "(linrope.base.memory.retain_freed_memory)",
    )
    p.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per model and context here")
    args = p.parse_args(argv)
    for m in args.models:
        try:
            model_spec(m)
        except argparse.ArgumentTypeError as e:
            p.error(f"--models: {e}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False here")
    if args.threads:
        torch.set_num_threads(args.threads)
    retained = False if args.system_malloc else retain_freed_memory()

    rows, failed = [], False
    for ctx in args.context:
        trainers = [
            make_trainer(name, args, ctx, c, prec)
            for name in args.models
            for c in ((False, True) if args.compile else (False,))
            for prec in args.precision
        ]
        if not rows:
            header(args, next((t for t in trainers if hasattr(t, "cfg")), trainers[0]), retained)
        for tr in trainers:
            for _ in range(args.warmup):
                tr.guarded_step()
        for _ in range(args.steps):
            for tr in trainers:
                dt = tr.guarded_step()
                if dt is not None:
                    tr.times.append(dt)
        row = {"context": ctx}
        for tr in trainers:
            rec = {
                "part": "train",
                "model": tr.model,
                "name": tr.name,
                "precision": tr.precision,
                "device": args.device,
                "context": ctx,
                "batch": args.batch,
                "status": tr.status,
                "note": tr.error,
            }
            if tr.error is None:
                med = statistics.median(tr.times)
                row[tr.name] = med
                row[tr.name + " first"] = tr.first
                rec.update(
                    ms_per_step=med * 1e3,
                    tokens_per_s=args.batch * ctx / med,
                    first_s=tr.first,
                    peak_mib=tr.peak_mib,
                    steps=len(tr.times),
                )
                if hasattr(tr, "cfg"):
                    m = tr.cfg.model
                    rec["size"] = f"d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, d_ff {m.d_ff}"
                peak = f", peak {tr.peak_mib:.0f} MiB" if tr.peak_mib is not None else ""
                print(
                    f"context={ctx} {tr.name}: first step {tr.first:.1f} s; step times "
                    + ", ".join(f"{t * 1e3:.0f}" for t in tr.times)
                    + f" ms; median {med * 1e3:.0f} ms, {args.batch * ctx / med:.0f} tokens/s{peak}",
                    flush=True,
                )
            else:
                failed = failed or tr.status == "failed"  # "unavailable": fla on a CPU
                print(f"context={ctx} {tr.name}: {tr.status}: {tr.error}", flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(rec) + "\n")
        rows.append(row)
        del trainers
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()

    print()
    suffixes = [f" {p_}" for p_ in args.precision] if len(args.precision) > 1 else [""]
    names = [n + c + s_ for n in args.models for c in (("", " compiled") if args.compile else ("",)) for s_ in suffixes]
    mixed = [
        n
        for n in args.models
        if len(args.precision) > 1 and not args.compile and {"32-true", "bf16-mixed"} <= set(args.precision)
    ]
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

        def ratio(a, b, fmt="{:.2f}×", r=r):
            return fmt.format(r[a] / r[b]) if a in r and b in r else "failed"

        cells = [str(r["context"])] + [f"{r[n] * 1e3:.0f}" if n in r else "failed" for n in names]
        cells += [f"{args.batch * r['context'] / r[n]:.0f}" if n in r else "failed" for n in names]
        if both:
            cells.append(ratio("softmax_rope", "linear_rope"))
            if args.compile:
                cells.append(ratio("softmax_rope compiled", "linear_rope compiled"))
        if args.compile:
            cells += [ratio(n, n + " compiled") for n in args.models]
            cells += [
                f"{r[n + ' compiled first'] - r[n + ' compiled']:.0f}" if n + " compiled" in r else "failed"
                for n in args.models
            ]
        cells += [ratio(n + " 32-true", n + " bf16-mixed") for n in mixed]
        print("| " + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
