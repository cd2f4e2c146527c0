"""Native loops for the chunk kernel on a CPU: the unrotated denominator's scans, and elu+1 features with RoPE.

The denominator of ``rope="numerator"`` is a running sum along the positions: den_i = qd_i · (z0 + Σ_{j≤i} kd_j),
and its backward two more (dqd_i = dden_i (z0 + Σ_{j≤i} kd_j); dkd_j = dz + Σ_{i≥j} dden_i qd_i).  torch's cumsum
along the positions of one head (4 096 × 64) takes about 280 µs on this machine and the kernel ran three of them
(and two flips) per block; these loops take about 35 µs for the forward's, each position once, its d numbers in
one SIMD pass.  ``elu_rope`` forms φ(x) = elu(x) + 1 and its rotation in one pass (torch's ops took three), and
``elu_rope_backward`` their gradient in one (four); docs/mathematics.md, "Native scans and features on a CPU".
The vectorised exp (``EXP_SOURCE``) is shared with the native chunk loop (``native_chunk.py``).

Compiled from ``SOURCE`` with ``torch.utils.cpp_extension.load_inline`` on first use (about 20 s; then cached by
torch under ~/.cache/torch_extensions, keyed by the source) and called with the GIL released, so that the heads'
tasks (``heads.py``) run side by side; inside, the loops run on ATen's intra-op threads (``at::parallel_for``).
Where the compiler or ninja is missing the kernel runs its torch ops and ``why_not()`` says why (one line, printed
once).  ``ENABLED = False`` runs the torch ops everywhere (the benchmarks' old plan; the tests of both paths)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Optional, Tuple

import torch

from .buffers import alloc

ENABLED = True

# exp(x) for x <= 0, vectorisable: shared with the native chunk loop (native_chunk.py)
EXP_SOURCE = r"""// exp for x <= 0 in float: Cody-Waite reduction by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2] (the
// minimax coefficients of e^r), about 1 ulp; written branch-free so that the loop vectorises.
static inline float exp_nonpos(float x) {
  const float low = -87.3365447f;  // ln 2^-126: below it e^x leaves float's normal range, and the feature is 0
  const float zero = x < low ? 0.0f : 1.0f;
  x = x < low ? low : x;
  const float big = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const float n = (x * 1.44269504088896341f + big) - big;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &e, sizeof(scale));
  return p * scale * zero;
}
static inline double exp_nonpos(double x) { return std::exp(x); }
"""

SOURCE = (
    r"""
#include <torch/extension.h>
#include <pybind11/pybind11.h>
#include <ATen/Parallel.h>

// Every loop runs on ATen's intra-op threads (at::parallel_for: one thread inside the heads' tasks, torch's
// thread count in a whole call), over rows of at least GRAIN numbers.
static constexpr int64_t GRAIN = 32768;

template <typename T>
static void den_rows(const T* q, const T* k, T* z, T* den, int64_t r0, int64_t r1, int64_t n, int64_t d) {
  for (int64_t r = r0; r < r1; ++r) {
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
                          int64_t r0, int64_t r1, int64_t n, int64_t d) {
  for (int64_t r = r0; r < r1; ++r) {
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
    at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / (n * d)), [&](int64_t r0, int64_t r1) {
      den_rows<scalar_t>(qd.data_ptr<scalar_t>(), kd.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(),
                         den.data_ptr<scalar_t>(), r0, r1, n, d);
    });
  });
}

// its backward: dden (B, H, n); z (B, H, d) the state entering (overwritten); acc (B, H, d) holds dL/dz of the
// state after the block and ends as dL/dz of the state entering; dq, dk (B, H, n, d) written
void denominator_backward(torch::Tensor qd, torch::Tensor kd, torch::Tensor dden, torch::Tensor z,
                          torch::Tensor acc, torch::Tensor dq, torch::Tensor dk) {
  const int64_t rows = qd.size(0) * qd.size(1), n = qd.size(2), d = qd.size(3);
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(qd.scalar_type(), "denominator_backward", [&] {
    at::parallel_for(0, rows, std::max<int64_t>(1, GRAIN / (n * d)), [&](int64_t r0, int64_t r1) {
      den_back_rows<scalar_t>(qd.data_ptr<scalar_t>(), kd.data_ptr<scalar_t>(), dden.data_ptr<scalar_t>(),
                              z.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(),
                              acc.data_ptr<scalar_t>(), r0, r1, n, d);
    });
  });
}
// ---- elu+1 features and their rotation (RoPE), one pass; their backward, one pass ----------------------------
"""
    + EXP_SOURCE
    + r"""

// x (B, H, n, d) with strides sb, sh, sn (and 1); cs (n, d) holding (cos, sin) of every pair; f, r (B, H, n, d)
// contiguous: f = elu(x) + 1, r = f rotated (interleaved pairs)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void elu_rope_rows(const T* x, int64_t sb, int64_t sh, int64_t sn, const T* cs, T* f, T* r,
                          int64_t r0, int64_t r1, int64_t H, int64_t n, int64_t d) {
  for (int64_t row = r0; row < r1; ++row) {  // row = (b * H + h) * n + i
    const int64_t b = row / (H * n), h = row / n % H, i = row % n;
    const T* xi = x + b * sb + h * sh + i * sn;
    const int64_t o = row * d;
    T* fi = f + o; T* ri = r + o; const T* c = cs + i * d;
    #pragma omp simd
    for (int64_t t = 0; t < d; ++t) {
      const T v = xi[t];
      fi[t] = v > T(0) ? v + T(1) : exp_nonpos(v < T(0) ? v : T(0));
    }
    #pragma omp simd
    for (int64_t t = 0; t < d; t += 2) {
      const T a = fi[t], e = fi[t + 1], co = c[t], si = c[t + 1];
      ri[t] = a * co - e * si;
      ri[t + 1] = a * si + e * co;
    }
  }
}

// out = min(f, 1) * (R^-1 gn + gd): the gradient of x from those of its rotated (gn) and plain (gd, or none)
// features; f, gn, gd contiguous (B, H, n, d); out (B, H, n, d) of T with strides ob, oh, on (and 1)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void elu_rope_back_rows(const T* f, const T* gn, const T* gd, const T* cs, T* out, int64_t ob, int64_t oh,
                               int64_t on, int64_t r0, int64_t r1, int64_t H, int64_t n, int64_t d) {
  for (int64_t row = r0; row < r1; ++row) {  // row = (b * H + h) * n + i
    const int64_t b = row / (H * n), h = row / n % H, i = row % n;
    const int64_t o = row * d;
    const T* fi = f + o; const T* gi = gn + o; const T* di = gd ? gd + o : nullptr; const T* c = cs + i * d;
    T* oi = out + b * ob + h * oh + i * on;
    #pragma omp simd
    for (int64_t t = 0; t < d; t += 2) {
      const T a = gi[t], e = gi[t + 1], co = c[t], si = c[t + 1];
      T u = a * co + e * si, w = e * co - a * si;
      if (di) { u += di[t]; w += di[t + 1]; }
      const T f0 = fi[t] < T(1) ? fi[t] : T(1), f1 = fi[t + 1] < T(1) ? fi[t + 1] : T(1);
      oi[t] = f0 * u;
      oi[t + 1] = f1 * w;
    }
  }
}

void elu_rope(torch::Tensor x, torch::Tensor cs, torch::Tensor f, torch::Tensor r) {
  const int64_t B = x.size(0), H = x.size(1), n = x.size(2), d = x.size(3);
  const int64_t sb = x.stride(0), sh = x.stride(1), sn = x.stride(2);
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "elu_rope", [&] {
    at::parallel_for(0, B * H * n, std::max<int64_t>(1, GRAIN / d), [&](int64_t r0, int64_t r1) {
      elu_rope_rows<scalar_t>(x.data_ptr<scalar_t>(), sb, sh, sn, cs.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                              r.data_ptr<scalar_t>(), r0, r1, H, n, d);
    });
  });
}

void elu_rope_backward(torch::Tensor f, torch::Tensor gn, c10::optional<torch::Tensor> gd, torch::Tensor cs,
                       torch::Tensor out) {
  const int64_t B = f.size(0), H = f.size(1), n = f.size(2), d = f.size(3);
  const int64_t ob = out.stride(0), oh = out.stride(1), on = out.stride(2);
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "elu_rope_backward", [&] {
    at::parallel_for(0, B * H * n, std::max<int64_t>(1, GRAIN / d), [&](int64_t r0, int64_t r1) {
      elu_rope_back_rows<scalar_t>(f.data_ptr<scalar_t>(), gn.data_ptr<scalar_t>(),
                                   gd.has_value() ? gd->data_ptr<scalar_t>() : nullptr, cs.data_ptr<scalar_t>(),
                                   out.data_ptr<scalar_t>(), ob, oh, on, r0, r1, H, n, d);
    });
  });
}
"""
)

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
                    functions=["denominator", "denominator_backward", "elu_rope", "elu_rope_backward"],
                    extra_cflags=["-O3", "-fopenmp-simd"],
                )
            except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build: the torch ops run
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                _state["why"] = f"linrope: native scans unavailable ({first}); the chunk kernel uses torch's cumsum"
                print(_state["why"], file=sys.stderr)
        return _state.get("ext")


def _built(name: str = NAME) -> bool:
    """torch's cache holds a build of the extension ``name`` (of some source: a changed one is rebuilt, silently)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory  # private: the notice is all that rests on it

        return any(Path(_get_build_directory(name, False)).glob("*.so"))
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


def features_usable(x: torch.Tensor, feature_map: str, rope: str, dtype: torch.dtype) -> bool:
    """The fused elu+1 features and rotation serve this block (``elu_rope``): elu+1 with RoPE on a CPU, computed in
    float32 or float64, the last dimension dense."""
    return (
        ENABLED
        and feature_map == "elu"
        and rope != "none"
        and x.device.type == "cpu"
        and dtype in (torch.float32, torch.float64)
        and x.stride(-1) == 1
        and _load() is not None
    )


def _cos_sin(rot: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, d): the rotors' (cos, sin) of every pair, in pair order."""
    return torch.view_as_real(rot).to(dtype).reshape(rot.shape[0], -1).contiguous()


def elu_rope(x: torch.Tensor, rot: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(f, r): f = elu(x) + 1 and r = f rotated by ``rot`` (complex (n, d/2), interleaved pairs), both (B, H, n, d)
    of ``dtype``, in one pass over x (``split_features`` for elu+1 with RoPE)."""
    if x.dtype != dtype:
        x = x.to(dtype)  # 16-bit inputs: converted by torch first (read in the loop, bfloat16 at d = 16 ran 10x slower)
    f = alloc(x.shape, dtype=dtype, device=x.device)
    r = alloc(x.shape, dtype=dtype, device=x.device)
    _load().elu_rope(x, _cos_sin(rot, dtype), f, r)
    return f, r


def elu_rope_backward(
    f: torch.Tensor, g_num: torch.Tensor, g_den: Optional[torch.Tensor], rot: torch.Tensor, out: torch.Tensor
) -> None:
    """out = ∂L/∂x = min(f, 1) ⊙ (R⁻¹ g_num + g_den) for f = elu(x) + 1 (``elu_rope``), from the gradients of the
    rotated features (``g_num``) and of the plain ones (``g_den``, None when the placement shares them); ``out``
    may be a strided view, of another dtype (then written through a copy)."""
    dtype = f.dtype
    g_num = g_num.to(dtype).contiguous()
    g_den = None if g_den is None else g_den.to(dtype).contiguous()
    direct = out.dtype == dtype and out.stride(-1) == 1
    target = out if direct else alloc(f.shape, dtype=dtype, device=f.device)
    _load().elu_rope_backward(f.contiguous(), g_num, g_den, _cos_sin(rot, dtype), target)
    if not direct:
        out.copy_(target)


__all__ = [
    "ENABLED",
    "usable",
    "why_not",
    "denominator",
    "denominator_backward",
    "features_usable",
    "elu_rope",
    "elu_rope_backward",
]
