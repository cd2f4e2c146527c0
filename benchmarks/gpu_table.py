"""Kernel table on a GPU: benchmarks/kernel_time.py with the device check's forms, shapes and repeats.

The forms, in this order at each N (the baselines first), each row labelled with exactly what it times
(benchmarks/forms.py):

  sdpa flash            [sdpa-flash] scaled_dot_product_attention(is_causal=True), FlashAttention backend only
  fla chunk_simple_gla  [fla-triton] fla's own Triton kernel on its [B, N, H, d] layout: unnormalised linear
                        attention, no feature map, RoPE, denominator or decay: the speed bound for the next form
  linrope on fla        [fla] linear_attention(impl="fla"): elu+1, RoPE in the numerator, normalised, on two fla
                        calls (numerator; denominator with a ones column), features and layout copies included
  linrope chunk         [chunk] linear_attention(impl="chunk"): the same on linrope's own chunked kernel

Defaults: ``--device cuda --dtype bf16``, N = 1k, 4k, 16k, 64k, median of 10 after 3 warm-up, no per-run limit,
a table budget of 600 s; every option of kernel_time.py may follow and overrides them (``--forms`` takes keys or
labels).  Without a CUDA GPU it says so and measures nothing, unless ``--device cpu`` (the stand-in of
benchmarks/gpu_check.sh --cpu, where the fla forms report "unavailable").

Usage:  python benchmarks/gpu_table.py
        python benchmarks/gpu_table.py --lengths 1024 16384 --forms "sdpa flash" "linrope on fla"
        python benchmarks/gpu_table.py --device cpu --lengths 256 1024     # the CPU stand-in
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import kernel_time  # noqa: E402
from benchmarks.forms import REGISTRY  # noqa: E402

NEEDS_GPU = (
    "benchmarks/gpu_table.py needs a CUDA GPU (torch.cuda.is_available() is False here): "
    "nothing was measured (--device cpu runs the CPU stand-in)"
)
KEYS = ("sdpa-flash", "fla-triton", "fla", "chunk")
FORMS = tuple(REGISTRY[k].label for k in KEYS)  # the row labels gpu_check.py reads
SDPA, FLA_KERNEL, LINROPE_FLA, LINROPE_CHUNK = FORMS
DEFAULTS = [
    "--device",
    "cuda",
    "--dtype",
    "bf16",
    "--lengths",
    "1024",
    "4096",
    "16384",
    "65536",
    "--forms",
    *KEYS,
    "--ratios",
    *kernel_time.DEFAULT_RATIOS["cuda"],
    "--warmup",
    "3",
    "--repeats",
    "10",
    "--max-run-s",
    "inf",
    "--budget-s",
    "600",
    "--peak-size",
    "0",
]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return kernel_time.main(DEFAULTS + argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default="cuda")
    if torch.device(pre.parse_known_args(argv)[0].device).type == "cuda" and not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    return kernel_time.main(DEFAULTS + argv)


if __name__ == "__main__":
    sys.exit(main())
