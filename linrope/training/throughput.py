"""Throughput and model-FLOPs utilisation while training, and the start-up summary's FLOPs.

``Throughput`` logs ``train/tokens_per_sec`` (the batch's tokens, every process's, over the wall time since the
previous batch ended; time spent validating not counted) and ``train/mfu`` (that rate times the model's training
FLOPs per token at the batch's context, ``linrope.models.flops``, over the peak FLOP/s of the devices), at
Lightning's logging interval (``trainer.log_every_n_steps``).  The peak is
``peak_flops`` when given (per device), else looked up by the device's name and the training precision
(``PEAK``, dense tensor-core figures from the vendors' datasheets), else, on a CPU, its nominal float32 vector
peak (threads × clock × FLOPs per cycle from /proc/cpuinfo; where there is none, a timed matrix product).  A GPU
not in the table gets tokens/s only, with a one-line note naming the option.  Nothing is read from the device:
the clock is the host's (on a GPU the rate is that of the host's queue, which the device's pace sets once it
fills).

``Summary`` is Lightning's model summary with the FLOPs the model really costs: Lightning's table counts FLOPs only
by running ``example_input_array`` (linrope's modules set none, so it printed 0 for every layer and in total);
here the per-layer column is dropped and the total is the model FLOPs per token at the training context."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import Callback, ModelSummary

from linrope.models.flops import flops_per_token, human

log = logging.getLogger(__name__)
summary_log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # where Lightning's summary goes

# Dense peak FLOP/s per device by (name fragment, precision class): NVIDIA datasheets (SXM parts unless named).
# "16": bf16/fp16 tensor cores; "tf32": float32 matmuls on TF32 tensor cores; "32": plain float32.
PEAK = {
    ("h200", "16"): 989.4e12,
    ("h200", "tf32"): 494.7e12,
    ("h200", "32"): 66.9e12,
    ("h100 pcie", "16"): 756.5e12,
    ("h100 pcie", "tf32"): 378.0e12,
    ("h100 pcie", "32"): 51.2e12,
    ("h100", "16"): 989.4e12,
    ("h100", "tf32"): 494.7e12,
    ("h100", "32"): 66.9e12,
    ("a100", "16"): 312e12,
    ("a100", "tf32"): 156e12,
    ("a100", "32"): 19.5e12,
    ("l40s", "16"): 362.1e12,
    ("l40s", "tf32"): 183.0e12,
    ("l40s", "32"): 91.6e12,
    ("l4", "16"): 121e12,
    ("l4", "tf32"): 60e12,
    ("l4", "32"): 30.3e12,
    ("v100", "16"): 125e12,
    ("v100", "32"): 15.7e12,
}


def precision_class(precision: Any) -> Optional[str]:
    """ "16" for bf16/fp16 training, "tf32" / "32" for float32 (TF32 when torch's float32 matmul precision allows
    it), None for float64."""
    p = str(precision)
    if "64" in p:
        return None
    if "16" in p:
        return "16"
    return "32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def table_peak(device_name: str, precision: Any) -> Optional[float]:
    """The datasheet peak of a device by its name (the longest matching fragment: "H100 PCIe" before "H100")."""
    cls = precision_class(precision)
    name = device_name.lower()
    hits = [(len(frag), peak) for (frag, c), peak in PEAK.items() if c == cls and frag in name]
    return max(hits)[1] if hits else None


def nominal_cpu_peak(cpuinfo: str = "/proc/cpuinfo") -> Optional[float]:
    """float32 FLOP/s the CPU's vector units can issue on torch's threads: threads × clock × FLOPs per cycle (two
    fused multiply-adds per cycle of 16 lanes with AVX-512, 8 with AVX2 + FMA; 8 per cycle without either), from
    /proc/cpuinfo (None where there is none, e.g. macOS).  A steady figure, unlike a timed product on a busy
    machine; an upper bound that real CPUs reach only near it (AMD's Zen 4 splits AVX-512 in two halves)."""
    try:
        text = open(cpuinfo).read()
    except OSError:
        return None
    mhz = [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    flags = next((line.split(":")[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    if not mhz:
        return None
    per_cycle = 64 if "avx512f" in flags else 32 if ("avx2" in flags and "fma" in flags) else 8
    return torch.get_num_threads() * max(mhz) * 1e6 * per_cycle


@functools.lru_cache(maxsize=None)
def measured_cpu_peak(size: int = 512, seconds: float = 0.25) -> float:
    """FLOP/s of a float32 square matrix product on this process's threads, the best of a few timed runs; once per
    process (the inputs from a generator of its own: training's random stream is untouched)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    torch.mm(a, b)  # warm up
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / max(time.perf_counter() - t, 1e-9))
    return best


def batch_tokens(batch) -> Optional[torch.Tensor]:
    """The first tensor of a batch (its inputs): its numel is the batch's tokens, its last dim the context."""
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = batch_tokens(item)
        if found is not None:
            return found
    return None


class Throughput(Callback):
    def __init__(self, peak_flops: Optional[float] = None):
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(
                f"callbacks.throughput.peak_flops must be positive FLOP/s per device or null; got {peak_flops}"
            )
        self.peak_flops = peak_flops
        self.peak: Optional[float] = None  # per device, resolved at the start of training
        self.source = ""
        self._flops: dict = {}  # context -> training FLOPs per token
        self._last: Optional[float] = None  # the clock at the end of the previous training batch

    def on_train_start(self, trainer, pl_module):
        if self.peak_flops is not None:
            self.peak, self.source = float(self.peak_flops), "given"
        elif trainer.strategy.root_device.type == "cuda":
            name = torch.cuda.get_device_name(trainer.strategy.root_device)
            self.peak, self.source = table_peak(name, trainer.precision), "datasheet"
            if self.peak is None and trainer.is_global_zero:
                log.info(f"train/mfu not logged: no peak FLOP/s known for {name!r} at precision {trainer.precision}; "
                         "set callbacks.throughput.peak_flops=<FLOP/s per device>")  # fmt: skip
        elif trainer.strategy.root_device.type == "cpu":
            self.peak, self.source = nominal_cpu_peak(), "the CPU's nominal float32 vector peak"
            if self.peak is None:
                self.peak, self.source = measured_cpu_peak(), "a timed float32 matmul"
        if self.peak is not None and trainer.is_global_zero:
            log.info(f"train/mfu against {human(self.peak)}FLOP/s per device ({self.source}) x {trainer.world_size}")

    def flops(self, pl_module, context: int) -> int:
        if context not in self._flops:
            self._flops[context] = flops_per_token(pl_module.model.cfg, context)["total"]
        return self._flops[context]

    def on_train_epoch_start(self, trainer, pl_module):
        self._last = None

    def on_validation_end(self, trainer, pl_module):
        self._last = None  # evaluation time is not training time

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """The batch's tokens (every process's) over the time since the previous batch ended: the first batch of an
        epoch and the first after a validation are not timed."""
        now, last = time.perf_counter(), self._last
        self._last = now
        x = batch_tokens(batch)
        if last is None or x is None:
            return
        rate = x.numel() * trainer.world_size / max(now - last, 1e-9)
        pl_module.log("train/tokens_per_sec", rate, prog_bar=True)
        if self.peak is not None and x.dim() > 1 and hasattr(pl_module, "model"):
            mfu = rate * self.flops(pl_module, int(x.shape[-1])) / (self.peak * trainer.world_size)
            pl_module.log("train/mfu", mfu)


class Summary(ModelSummary):
    """Lightning's summary without its per-layer FLOPs (0 without an example input), and the model's training
    FLOPs per token at ``context`` in place of its total."""

    def __init__(self, context: int, max_depth: int = 1):
        super().__init__(max_depth=max_depth)
        self.context = context

    def on_fit_start(self, trainer, pl_module):
        self._note = ""
        model = getattr(pl_module, "model", None)
        if model is not None and getattr(model, "cfg", None) is not None:
            f = flops_per_token(model.cfg, self.context)
            self._note = (
                f"{human(f['total'])}FLOPs per token to train at context {self.context} "
                f"(weights {human(f['weights'])}, attention {human(f['attention'])}; linrope.models.flops)"
            )
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **kwargs):  # fmt: skip
        from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

        cols = [c for c in summary_data if c[0] != "FLOPs"]
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, 0, *cols
        )
        lines = table.split("\n")
        lines = [ln for ln in lines if not ln.rstrip().endswith("Total Flops")]
        if self._note:
            lines.append(self._note)
        summary_log.info("\n" + "\n".join(lines))
