"""Native scans for the chunk kernel's unrotated denominator on a CPU (RoPE in the numerator only).

The denominator of ``rope="numerator"`` is a running sum along the positions: den_i = qd_i · (z0 + Σ_{j≤i} kd_j),
and its backward two more (dqd_i = dden_i (z0 + Σ_{j≤i} kd_j); dkd_j = dz + Σ_{i≥j} dden_i qd_i).  torch's cumsum
along the positions of one head (4 096 × 64) takes about 280 µs on this machine and the kernel ran three of them
(and two flips) per block; these loops take about 35 µs for the forward's, each position once, its d numbers in
one SIMD pass.

Compiled from ``SOURCE`` with ``torch.utils.cpp_extension.load_inline`` on first use (about 20 s; then cached by
torch under ~/.cache/torch_extensions, keyed by the source) and called with the GIL released, so that the heads'
tasks (``heads.py``) scan side by side.  Where the compiler or ninja is missing the kernel runs its torch ops
(``scans.dcumsum``) and ``why_not()`` says why (one line, printed once).  ``ENABLED = False`` runs the torch ops
everywhere (the benchmarks' old plan; the tests of both paths)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Optional, Tuple

import torch

from .buffers import alloc

ENABLED = True

SOURCE = r"""
#include <torch/extension.h>
#include <pybind11/pybind11.h>

template <typename T>
static void den_rows(const T* q, const T* k, T* z, T* den, int64_t rows, int64_t n, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* qr = q + r * n * d; const T* kr = k + r * n * d; T* zr = z + r * d;
    for (int64_t i = 0; i < n; ++i) {
      T acc = 0;
      #pragma omp simd reduction(+:acc)
      for (int64_t t = 0; t < d; ++t) { zr[t] += kr[i * d + t]; acc += qr[i * d + t] * zr[t]; }
      den[r * n + i] = acc;
    }
  }
}

template <typename T>
static void den_back_rows(const T* q, const T* k, const T* g, T* z, T* dq, T* dk, T* acc,
                          int64_t rows, int64_t n, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* qr = q + r * n * d; const T* kr = k + r * n * d; const T* gr = g + r * n;
    T* zr = z + r * d; T* dqr = dq + r * n * d; T* dkr = dk + r * n * d; T* ar = acc + r * d;
    for (int64_t i = 0; i < n; ++i) {
      const T gi = gr[i];
      #pragma omp simd
      for (int64_t t = 0; t < d; ++t) { zr[t] += kr[i * d + t]; dqr[i * d + t] = gi * zr[t]; }
    }
    for (int64_t j = n - 1; j >= 0; --j) {
      const T gj = gr[j];
      #pragma omp simd
      for (int64_t t = 0; t < d; ++t) { ar[t] += gj * qr[j * d + t]; dkr[j * d + t] = ar[t]; }
    }
  }
}

// qd, kd (B, H, n, d) contiguous; z (B, H, d) the state entering, updated to the state after the block;
// den (B, H, n) written: den_i = qd_i . (z + sum_{j<=i} kd_j)
void denominator(torch::Tensor qd, torch::Tensor kd, torch::Tensor z, torch::Tensor den) {
  const int64_t rows = qd.size(0) * qd.size(1), n = qd.size(2), d = qd.size(3);
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(qd.scalar_type(), "denominator", [&] {
    den_rows<scalar_t>(qd.data_ptr<scalar_t>(), kd.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(),
                       den.data_ptr<scalar_t>(), rows, n, d);
  });
}

// its backward: dden (B, H, n); z (B, H, d) the state entering (overwritten); acc (B, H, d) holds dL/dz of the
// state after the block and ends as dL/dz of the state entering; dq, dk (B, H, n, d) written
void denominator_backward(torch::Tensor qd, torch::Tensor kd, torch::Tensor dden, torch::Tensor z,
                          torch::Tensor acc, torch::Tensor dq, torch::Tensor dk) {
  const int64_t rows = qd.size(0) * qd.size(1), n = qd.size(2), d = qd.size(3);
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(qd.scalar_type(), "denominator_backward", [&] {
    den_back_rows<scalar_t>(qd.data_ptr<scalar_t>(), kd.data_ptr<scalar_t>(), dden.data_ptr<scalar_t>(),
                            z.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(),
                            acc.data_ptr<scalar_t>(), rows, n, d);
  });
}
"""

NAME = "linrope_native_scans"
_lock = threading.Lock()
_state: dict = {}  # "ext": the compiled module, or "why": why there is none


def _load():
    with _lock:
        if not _state:
            try:
                from torch.utils.cpp_extension import load_inline

                if not _built():
                    print(f"linrope: building {NAME} for the chunk kernel (once: torch caches it)", file=sys.stderr)
                _state["ext"] = load_inline(
                    NAME,
                    cpp_sources=SOURCE,
                    functions=["denominator", "denominator_backward"],
                    extra_cflags=["-O3", "-fopenmp-simd"],
                )
            except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build: the torch ops run
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                _state["why"] = f"linrope: native scans unavailable ({first}); the chunk kernel uses torch's cumsum"
                print(_state["why"], file=sys.stderr)
        return _state.get("ext")


def _built() -> bool:
    """torch's cache holds a build of the extension (of some source: a changed one is rebuilt, silently)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory  # private: the notice is all that rests on it

        return any(Path(_get_build_directory(NAME, False)).glob("*.so"))
    except Exception:  # noqa: BLE001
        return False


def why_not() -> Optional[str]:
    """Why the native scans do not run (None when they do, or have not been tried)."""
    return None if ENABLED and (not _state or "ext" in _state) else (_state.get("why") or "native.ENABLED is False")


def usable(x: torch.Tensor, ch) -> bool:
    """The native scans serve this block: a CPU tensor of float32 or float64, no decay, no packed documents."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not ch.decay
        and ch.docs is None
        and _load() is not None
    )


def _state_copy(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """A (B, H, d) state of ``like``'s dtype the scan may overwrite: a copy of ``t``, or zeros."""
    shape = like.shape[:2] + like.shape[-1:]
    return like.new_zeros(shape) if t is None else t.to(like.dtype, copy=True).contiguous()


def _dense(*ts: torch.Tensor) -> None:
    for t in ts:  # the loops index rows · n · d: no other layout
        if not t.is_contiguous():
            raise ValueError(f"native scans need contiguous tensors, got strides {t.stride()} for {tuple(t.shape)}")


def denominator(qd: torch.Tensor, kd: torch.Tensor, z0: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(den, z): den_i = qd_i · (z0 + Σ_{j≤i} kd_j) (B, H, n) and the state after the block (B, H, d); z0 None: 0."""
    qd, kd = qd.contiguous(), kd.contiguous()
    _dense(qd, kd)
    z = _state_copy(z0, kd)
    den = alloc(qd.shape[:3], dtype=qd.dtype, device=qd.device)
    _load().denominator(qd, kd, z, den)
    return den, z


def denominator_backward(
    qd: torch.Tensor, kd: torch.Tensor, dden: torch.Tensor, z0: Optional[torch.Tensor], dz: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dqd, dkd, dz0) for ``denominator``'s den (∂L/∂den = ``dden``) and its final state (∂L/∂z = ``dz``, None: 0):
    dqd_i = dden_i (z0 + Σ_{j≤i} kd_j), dkd_j = dz + Σ_{i≥j} dden_i qd_i, and dz0 = dkd_0."""
    qd, kd, dden = qd.contiguous(), kd.contiguous(), dden.to(qd.dtype).contiguous()
    z, acc = _state_copy(z0, kd), _state_copy(dz, kd)
    dqd = alloc(qd.shape, dtype=qd.dtype, device=qd.device)
    dkd = alloc(kd.shape, dtype=kd.dtype, device=kd.device)
    _load().denominator_backward(qd, kd, dden, z, acc, dqd, dkd)
    return dqd, dkd, acc


__all__ = ["ENABLED", "usable", "why_not", "denominator", "denominator_backward"]
