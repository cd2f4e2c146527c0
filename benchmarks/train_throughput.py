"""Training throughput: tokens/s of whole training steps, ``linear_rope`` against ``softmax_rope``.

Each model (``--models``: presets of ``conf/model/``) is composed as ``python train.py model=<preset>`` composes it
(``conf/train.yaml``, ``size=small`` by default: d_model 256, 4 layers, 4 heads, d_ff 1024, bytes) and built by
``linrope.training.builders.build_module`` into the LightningModule train.py trains, all in this one process.  One
step = forward, the module's loss, backward, clipping at ``trainer.gradient_clip_val`` and a step of the optimizer
and schedule its ``configure_optimizers`` builds (AdamW, as in training), on random bytes.  At each context every
model runs ``--warmup`` untimed steps, then ``--steps`` timed rounds alternate the models step by step (so drift of
the machine hits them alike); each model's time is its median step.  Tokens/s = batch · context / median step; the
ratio is linear_rope's tokens/s over softmax_rope's.  ``--d-model``, ``--layers``, ``--heads``, ``--d-ff`` and
``--chunk-size`` override the composed sizes; more Hydra overrides go after ``--override``.  ``--tokens T`` holds
batch × context at T across the contexts (batch T ÷ context at each, instead of ``--batch``), so that every context
trains on the same tokens per step.

``--precision 32-true bf16-mixed`` times each model at each precision in the same process (bf16-mixed is Lightning's
autocast: forward and loss under ``torch.autocast(dtype=torch.bfloat16)``, weights and optimizer state float32) and
adds each model's bf16-mixed/32-true tokens/s.  ``--compile`` times each model eager and under ``torch.compile``
(``compile=true``) and adds compiled/eager tokens/s, compiled linear over compiled softmax, and the compile time (the
first warm-up step less the median step).

On a GPU (``--device cuda``) model, optimizer state and data live there, steps are synchronised, and each row adds
its peak memory: its weights and optimizer state plus the largest rise of allocated memory during one of its steps.
``--models`` also takes ``PRESET:KEY=VALUE[,KEY=VALUE]`` for a variant (its label is that string).  A model that
fails becomes a row saying what failed and the others go on (exit status 1); ``LINROPE_BENCH_FAIL=<label>`` makes
one fail on purpose.  ``--jsonl`` appends one JSON line per model and context (benchmarks/gpu_check.py reads them).

Usage:  python benchmarks/train_throughput.py                       # context 8192
        python benchmarks/train_throughput.py --context 1024 4096 8192 --steps 5
        python benchmarks/train_throughput.py --compile --context 256 --batch 8 --models linear_rope
        python benchmarks/train_throughput.py --context 1024 --override size=tiny optim.weight_decay=0
        python benchmarks/train_throughput.py --context 512 1024 2048 --tokens 4096     # batch 8, 4, 2
        python benchmarks/train_throughput.py --context 256 --batch 16 --precision 32-true bf16-mixed --steps 9
        python benchmarks/train_throughput.py --device cuda --precision bf16-mixed --override size=base \
            --context 4096 --batch 4 --models linear_rope linear_rope:model.attention.impl=fla softmax_rope
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

from benchmarks import timing  # noqa: E402
from linrope.base.errors import BackendUnavailable  # noqa: E402
from linrope.studies.sweeps import compose_train  # noqa: E402
from linrope.training.builders import build_module  # noqa: E402

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16}  # what Lightning's precision plugin autocasts to
DEFAULT_MODELS = ["linear_rope", "softmax_rope"]


def model_spec(text: str) -> tuple[str, list[str]]:
    """``PRESET[:KEY=VALUE[,KEY=VALUE]]`` -> (preset, overrides)."""
    preset, _, rest = text.partition(":")
    if preset not in PRESETS:
        raise argparse.ArgumentTypeError(f"{preset!r} is not a preset of conf/model/ ({', '.join(PRESETS)})")
    overrides = [o for o in rest.split(",") if o]
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad[0]!r} is not KEY=VALUE")
    return preset, overrides


def checked_spec(text: str) -> str:
    """argparse's check of a --models entry: ``text`` itself, if ``model_spec`` reads it."""
    return model_spec(text) and text


def compose_config(name: str, args, context: int, compiled: bool) -> DictConfig:
    """``conf/train.yaml`` with ``model=<name>`` (and a variant's overrides), this context and the sizes given
    on the command line."""
    preset, variant = model_spec(name)
    overrides = [f"model={preset}", f"context={context}", f"compile={str(compiled).lower()}", "logger=none"]
    sizes = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads, "d_ff": args.d_ff}
    overrides += [f"model.{k}={v}" for k, v in sizes.items() if v is not None]
    cfg = compose_train(overrides + list(args.override) + variant)
    cfg.optim.schedule_steps = int(cfg.trainer.max_steps)  # the schedule's length, as a Trainer would give it
    if args.chunk_size is not None and cfg.model.attention.get("kind") == "linear":
        cfg.model.attention.chunk_size = args.chunk_size
    return cfg


def batch_at(args, context: int) -> int:
    """The batch at ``context``: ``--tokens`` ÷ context when batch × context is held fixed, else ``--batch``."""
    return args.tokens // context if args.tokens else args.batch


def tensor_mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t)) / 2**20


class Trainer:
    """One model's training steps; a model that fails (to build or in a step) keeps only its row."""

    def __init__(self, name: str, args, context: int, compiled: bool = False, precision: str = "32-true"):
        self.model, self.precision, self.device = name, precision, torch.device(args.device)
        self.name = name + (" compiled" if compiled else "") + (f" {precision}" if len(args.precision) > 1 else "")
        self.autocast, self.batch = AUTOCAST[precision], batch_at(args, context)
        self.status, self.error, self.first, self.times, self.peak_mib = "ok", None, 0.0, [], None
        try:
            self.cfg = compose_config(name, args, context, compiled)
            torch.manual_seed(args.seed)
            self.module = build_module(self.cfg).to(self.device)
            self.module.configure_model()  # compile=true: compiles the model in place, as the Lightning Trainer would
            self.module.train()
            optimizers = self.module.configure_optimizers()
            self.opt, self.sched = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
            self.clip = self.cfg.trainer.get("gradient_clip_val")
            g = torch.Generator().manual_seed(args.seed)
            self.data = torch.randint(0, int(self.cfg.model.vocab_size), (self.batch, context + 1), generator=g)
            self.data = self.data.to(self.device)
        except Exception as e:  # noqa: BLE001 - one model's failure is its row; the others go on
            self.fail(e)

    def resident_mib(self) -> float:
        """This model's weights and optimizer state on the device."""
        state = [t for s in self.opt.state.values() for t in s.values()]
        return tensor_mib(list(self.module.parameters()) + state)

    def step(self) -> float:
        timing.forced_failure(self.model)
        batch = (self.data[:, :-1], self.data[:, 1:])
        cuda = self.device.type == "cuda"
        timing.sync(self.device)
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
        timing.sync(self.device)
        dt = time.perf_counter() - t0
        if cuda:
            rise = (torch.cuda.max_memory_allocated(self.device) - before) / 2**20
            self.peak_mib = max(self.peak_mib or 0.0, rise + self.resident_mib())
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: non-finite loss {loss.item()}")
        return dt

    def fail(self, e: BaseException) -> None:
        """Keep what failed as this model's row (fla missing on a CPU: "unavailable"); free its memory."""
        unavailable = isinstance(e, BackendUnavailable) and self.device.type == "cpu"
        self.status = "unavailable" if unavailable else "failed"
        self.error = (str(e).strip().splitlines() or [""])[0][:160] if unavailable else timing.failure_note(e)
        for attr in ("module", "opt", "sched", "data"):
            if hasattr(self, attr):
                delattr(self, attr)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def guarded_step(self) -> float | None:
        """One step; its time, or None once this model has failed (the failure is kept as its row)."""
        if self.error is not None:
            return None
        try:
            dt = self.step()
        except Exception as e:  # noqa: BLE001 - one model's failure is its row; the others go on
            return self.fail(e)
        self.first = self.first or dt
        return dt


def header(args, trainers, malloc: str) -> None:
    first = next((t for t in trainers if hasattr(t, "module")), None)  # None: every model failed to build
    m = first.cfg.model if first else None
    sizes = f"d_model={m.d_model} layers={m.n_layers} heads={m.n_heads} d_ff={m.d_ff} " if m is not None else ""
    opt = f"{type(first.opt).__name__} + clip {first.clip}" if first else "the optimizer did not build"
    batches = f"batch × context = {args.tokens}" if args.tokens else f"batch={args.batch}"
    timing.header(
        f"training throughput on {args.device}: {sizes}{batches}, {' / '.join(args.precision)}, {opt}",
        f"{args.warmup} warm-up steps per model, median of {args.steps} timed steps (models alternating); "
        f"malloc: {malloc}",
    )


def record(tr: Trainer, args, ctx: int) -> dict:
    """The jsonl row of one model at one context; its line printed."""
    rec = dict(part="train", model=tr.model, name=tr.name, precision=tr.precision, device=args.device, context=ctx)
    rec.update(batch=tr.batch, status=tr.status, note=tr.error)
    if tr.error is not None:
        print(f"context={ctx} {tr.name}: {tr.status}: {tr.error}", flush=True)
        return rec
    med = statistics.median(tr.times)
    rec.update(ms_per_step=med * 1e3, tokens_per_s=tr.batch * ctx / med, first_s=tr.first, peak_mib=tr.peak_mib)
    rec["steps"] = len(tr.times)
    if hasattr(tr, "cfg"):
        m = tr.cfg.model
        rec["size"] = f"d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, d_ff {m.d_ff}"
    peak = f", peak {tr.peak_mib:.0f} MiB" if tr.peak_mib is not None else ""
    steps = ", ".join(f"{t * 1e3:.0f}" for t in tr.times)
    print(
        f"context={ctx} {tr.name}: first step {tr.first:.1f} s; step times {steps} ms; median {med * 1e3:.0f} ms, "
        f"{tr.batch * ctx / med:.0f} tokens/s{peak}",
        flush=True,
    )
    return rec


def summary(rows: list[dict], args) -> list[str]:
    """The table: ms/step and tokens/s per model, and the ratios the options ask for."""
    suffixes = [f" {p_}" for p_ in args.precision] if len(args.precision) > 1 else [""]
    compiled = ("", " compiled") if args.compile else ("",)
    names = [n + c + s_ for n in args.models for c in compiled for s_ in suffixes]
    mixed = args.models if not args.compile and {"32-true", "bf16-mixed"} <= set(args.precision) else []
    # each linear model (a preset, or a preset with overrides) against softmax_rope, in each precision and mode
    linear = [m for m in args.models if m.split(":")[0].startswith("linear")] if "softmax_rope" in args.models else []
    pairs = [(m + c + s_, "softmax_rope" + c + s_) for m in linear for c in compiled for s_ in suffixes]
    head = ["context", "batch"] + [f"{n} ms/step" for n in names] + [f"{n} tokens/s" for n in names]
    head += [f"{a} / {b} tokens/s" for a, b in pairs]
    if args.compile:
        head += [f"{n} compiled/eager tokens/s" for n in args.models] + [f"{n} compile s" for n in args.models]
    head += [f"{n} bf16-mixed/32-true tokens/s" for n in mixed]
    table = []
    for r in rows:

        def ratio(a, b, r=r):
            return f"{r[a] / r[b]:.2f}×" if a in r and b in r else "failed"

        batch = batch_at(args, r["context"])
        cells = [r["context"], batch] + [f"{r[n] * 1e3:.0f}" if n in r else "failed" for n in names]
        cells += [f"{batch * r['context'] / r[n]:.0f}" if n in r else "failed" for n in names]
        cells += [ratio(b, a) for a, b in pairs]  # tokens/s: the inverse of the step times' ratio
        if args.compile:
            cells += [ratio(n, n + " compiled") for n in args.models]
            cells += [
                f"{r[n + ' compiled first'] - r[n + ' compiled']:.0f}" if n + " compiled" in r else "failed"
                for n in args.models
            ]
        cells += [ratio(n + " 32-true", n + " bf16-mixed") for n in mixed]
        table.append(cells)
    return timing.table(head, table)


def main(argv=None) -> int:
    p = timing.parser(__doc__, malloc=True)
    p.add_argument("--context", type=int, nargs="+", default=[8192], help="context lengths (tokens) to time")
    models = f"PRESET[:KEY=VALUE,…]: presets of conf/model/, each with overrides (default {' '.join(DEFAULT_MODELS)})"
    p.add_argument("--models", nargs="+", type=checked_spec, default=DEFAULT_MODELS, metavar="MODEL", help=models)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: model, optimizer and data there")
    for flag, key in (("--d-model", "d_model"), ("--layers", "n_layers"), ("--heads", "n_heads"), ("--d-ff", "d_ff")):
        p.add_argument(flag, type=int, default=None, help=f"model.{key} (default: the size config's)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=None, help="batch × context held at this (batch = tokens ÷ context)")
    p.add_argument("--chunk-size", type=int, default=None, help="chunk size of linear attention (the config's)")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per model (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="time every model eager and compiled (torch.compile)")
    p.add_argument("--precision", nargs="+", default=["32-true"], choices=list(AUTOCAST), help="each model at each")
    p.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE", help="more Hydra overrides, every model")
    p.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per model and context here")
    args = p.parse_args(argv)
    uneven = [c for c in args.context if args.tokens is not None and (args.tokens < c or args.tokens % c)]
    if uneven:
        p.error(f"--tokens {args.tokens}: not a multiple of --context {uneven[0]} (batch = tokens ÷ context)")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False here")
    malloc = timing.start(args)

    rows, failed = [], False
    for ctx in args.context:
        compiled = (False, True) if args.compile else (False,)
        trainers = [Trainer(n, args, ctx, c, prec) for n in args.models for c in compiled for prec in args.precision]
        if not rows:
            header(args, trainers, malloc)
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
            timing.append_jsonl(args.jsonl, record(tr, args, ctx))
            failed = failed or tr.status == "failed"  # "unavailable": fla on a CPU
            if tr.error is None:
                row[tr.name], row[tr.name + " first"] = statistics.median(tr.times), tr.first
        rows.append(row)
        del trainers
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()
    print("\n" + "\n".join(summary(rows, args)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
