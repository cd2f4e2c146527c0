"""The compute plan of a run, printed before it trains (``plan:`` in conf/train.yaml; ``experiment=scale``).

``plan.tokens_per_parameter`` sets the training length from the model's size, as the compute-optimal recipes
do (Hoffmann et al. 2022: about 20 tokens per parameter): ``trainer.max_steps`` = tokens_per_parameter ×
parameters (every parameter, the tied head once: ``linrope.models.flops``) / tokens per optimizer step (batch ×
context × gradient accumulation × devices × nodes), rounded up.  ``plan.measure_steps`` times that many forward
and backward passes of the model on a random batch of the run's shape, on the run's device and precision, before
training (the model's weights, its gradients and every random stream are left as they were), and prints the
hours the run will take at that pace, the device-hours and the model-FLOPs utilisation it implies.  The optimizer
step and data loading are not in the timed steps: the estimate is a floor.  ``torch.compile`` is not applied to
the timed steps either (a compiled run is usually faster than the estimate).  A ``trainer.max_steps`` given on the
command line wins over ``plan.tokens_per_parameter``; either way the plan's first line says where the steps
came from."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from linrope.models.flops import flops_per_token, human, parameter_counts


@dataclass
class Plan:
    parameters: int
    tokens_per_step: int
    steps: int
    flops_per_token: int
    seconds_per_step: Optional[float] = None
    devices: int = 1
    peak: Optional[float] = None  # FLOP/s per device

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def lines(self) -> list:
        out = [
            f"plan: {human(self.parameters)}parameters; {self.steps:,} steps x {self.tokens_per_step:,} tokens = "
            f"{human(self.tokens)}tokens ({self.tokens / self.parameters:.1f} per parameter); "
            f"{human(self.flops_per_token)}FLOPs per token, {human(self.flops_per_token * self.tokens)}FLOPs in all"
        ]
        if self.seconds_per_step is not None:
            hours = self.steps * self.seconds_per_step / 3600
            line = (
                f"plan: measured {self.seconds_per_step:.3g} s per step (forward and backward) -> about {hours:,.2f} h "
                f"on {self.devices} device(s), {hours * self.devices:,.2f} device-hours"
            )
            if self.peak:
                mfu = self.tokens_per_step * self.flops_per_token / self.seconds_per_step / (self.peak * self.devices)
                line += f", MFU {mfu:.1%}"
            out.append(line)
        return out


def tokens_per_step(cfg) -> int:
    t = cfg.trainer
    devices = t.get("devices", 1)
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    return (
        int(cfg.data.batch_size)
        * int(cfg.context)
        * int(t.get("accumulate_grad_batches") or 1)
        * devices
        * int(t.get("num_nodes") or 1)
    )


def steps_for(cfg, parameters: int) -> Optional[int]:
    per = (cfg.get("plan") or {}).get("tokens_per_parameter")
    if per is None:
        return None
    return max(1, math.ceil(float(per) * parameters / tokens_per_step(cfg)))


@torch.no_grad()
def _no_grad_copy(model):
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def measure(model, cfg, steps: int, device: torch.device) -> float:
    """Seconds per forward + backward of a (batch, context) random batch, the median of ``steps`` after one
    warm-up; the model's weights, gradients, device and every random stream as they were."""
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    grads = _no_grad_copy(model)
    where = next(model.parameters()).device
    was_training = model.training
    precision = str(cfg.trainer.get("precision", "32"))
    dtype = torch.bfloat16 if "bf16" in precision else torch.float16 if "16" in precision else None
    try:
        model.to(device).train()
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randint(0, int(model.cfg.vocab_size), (int(cfg.data.batch_size), int(cfg.context) + 1), generator=g)
        x = x.to(device)
        times = []
        for i in range(steps + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with (
                torch.enable_grad(),
                torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None),
            ):
                logits = model(x[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:  # the first is the warm-up
                times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]
    finally:
        for n, p in model.named_parameters():
            p.grad = grads[n]
        model.to(where).train(was_training)
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def given_steps(overrides: Sequence[str]) -> bool:
    """Whether the command line (a sweep job's overrides) sets ``trainer.max_steps`` itself."""
    return any(str(o).lstrip("+~").split("=", 1)[0] == "trainer.max_steps" for o in overrides)


def apply_plan(cfg, module, device: Optional[torch.device] = None, overrides: Sequence[str] = ()) -> Optional[Plan]:
    """Set ``trainer.max_steps`` from ``plan.tokens_per_parameter`` (if set) unless ``overrides`` (the command line's)
    set ``trainer.max_steps``: an explicit value wins, and the plan says which one it took and why; measure
    (``plan.measure_steps``), print the plan; None when ``plan`` asks for nothing."""
    settings = cfg.get("plan") or {}
    measure_steps = int(settings.get("measure_steps") or 0)
    if settings.get("tokens_per_parameter") is None and not measure_steps:
        return None
    model = module.model
    params = parameter_counts(model.cfg).total
    steps = steps_for(cfg, params)
    per = settings.get("tokens_per_parameter")
    if steps is not None and given_steps(overrides):
        print(
            f"plan: trainer.max_steps={int(cfg.trainer.max_steps):,} as given (plan.tokens_per_parameter={per} "
            f"would make it {steps:,})",
            flush=True,
        )
    elif steps is not None:
        print(
            f"plan: trainer.max_steps={steps:,} from plan.tokens_per_parameter={per} (was {cfg.trainer.max_steps}); "
            f"trainer.max_steps=N on the command line sets it instead",
            flush=True,
        )
        cfg.trainer.max_steps = steps
    steps = int(cfg.trainer.max_steps)
    plan = Plan(parameters=params, tokens_per_step=tokens_per_step(cfg), steps=steps,
                flops_per_token=flops_per_token(model.cfg, int(cfg.context))["total"])  # fmt: skip
    if measure_steps:
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        plan.seconds_per_step = measure(model, cfg, measure_steps, device)
        plan.devices = max(tokens_per_step(cfg) // (int(cfg.data.batch_size) * int(cfg.context)
                                                    * int(cfg.trainer.get("accumulate_grad_batches") or 1)), 1)  # fmt: skip
        from linrope.training.throughput import nominal_cpu_peak, table_peak

        if device.type == "cuda":
            plan.peak = table_peak(torch.cuda.get_device_name(device), cfg.trainer.get("precision", "32"))
        else:
            plan.peak = nominal_cpu_peak()
        # one process measures one device; several devices are assumed to run at the same pace
        plan.seconds_per_step *= int(cfg.trainer.get("accumulate_grad_batches") or 1)
    for line in plan.lines():
        print(line, flush=True)
    return plan
