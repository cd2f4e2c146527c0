"""The chunk form's forward as one native loop on a CPU: each (batch row, head) walked chunk by chunk in C++.

For the case studies train — elu+1 features, RoPE in the numerator only, causal, no decay, no packed documents,
normalised, float32 or float64 on a CPU — ``chunk_kernel.chunk_forward`` hands the whole walk to ``forward``.  Per
chunk of C positions, with every temporary in a few small buffers of the thread's own (about 100 KiB at C = d = 64,
so they stay in L1/L2):

    qf, kf = elu(q) + 1, elu(k) + 1;  qn, kn = qf, kf rotated       (one pass, exp_nonpos of ``native.py``)
    P   = tril(qn knᵀ)                                                (C×C)
    num = [P | qn] · [v ; S]                                          (one product, inner size C + d)
    den_i = qf_i · (z + Σ_{j≤i} kf_j);   o_i = num_i / (den_i + eps)
    S  += knᵀ v;   z += Σ_j kf_j

The products call the BLAS's ``sgemm_``/``dgemm_`` (MKL's, exported by torch's libtorch_cpu here) on the chunk's
buffers; torch's batched products over a block of 4 096 positions kept ~10 tensors of 1 MiB live and ran from the
shared L3, and each block paid ~30 operators' dispatch.  The rows run on ATen's intra-op threads
(``at::parallel_for``, one row per task: one thread inside the heads' tasks of ``heads.py``, torch's threads for a
call run whole), the GIL released.  The states entering every block of ``chunk.plan`` (whole chunks) are written
as the torch path writes them, so ``chunk_kernel.chunk_backward`` runs unchanged on them.

Compiled with ``load_inline`` on first use (then cached by torch).  Where the build fails, or the BLAS symbols are
missing (a torch without MKL or OpenBLAS exporting them), the torch path runs and ``why_not()`` says why (one
line, printed once).  ``ENABLED = False`` (or ``native.ENABLED = False``) runs the torch path everywhere."""

from __future__ import annotations

import sys
import threading
from typing import Optional

import torch

from . import native
from .buffers import alloc

ENABLED = True

SOURCE = (
    r"""
#include <torch/extension.h>
#include <pybind11/pybind11.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstring>
#include <vector>

// The Fortran BLAS, declared weak: a torch whose libraries export no such symbol still loads this module, and
// have_blas() says so.
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*)
    __attribute__((weak));
extern "C" void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
                       const int*, const double*, const int*, const double*, double*, const int*)
    __attribute__((weak));

// MKL's thread count for the calling thread (Fortran interface: by pointer; returns the previous one): each row's
// products are small, and torch turns MKL's dynamic adjustment off, so inside a parallel region MKL would otherwise
// start a team of its own per product (measured: 60x slower at B 16 H 4 d 16 N 64).
extern "C" int mkl_set_num_threads_local_(const int*) __attribute__((weak));

bool have_blas() { return sgemm_ != nullptr && dgemm_ != nullptr; }

// Row-major C (m x n) = op(A) op(B) + beta C (ta, tb: A, B transposed); the column-major BLAS sees the transposes,
// so it computes C^T = op(B)^T op(A)^T.
static inline void gemm(bool ta, bool tb, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                        float beta, float* C, int ldc) {
  const float one = 1.0f;
  sgemm_(tb ? "T" : "N", ta ? "T" : "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}
static inline void gemm(bool ta, bool tb, int m, int n, int k, const double* A, int lda, const double* B, int ldb,
                        double beta, double* C, int ldc) {
  const double one = 1.0;
  dgemm_(tb ? "T" : "N", ta ? "T" : "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}
"""
    + native.EXP_SOURCE
    + r"""
// rows positions of x (position stride sx, last dimension dense): f = elu(x) + 1 (row stride ldf), r = f rotated
// by the pairs (cos, sin) of cs (row stride d) (row stride ldr)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void features(const T* x, int64_t sx, const T* cs, int64_t rows, int64_t d, T* f, int64_t ldf, T* r,
                     int64_t ldr) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * sx; const T* c = cs + i * d; T* fi = f + i * ldf; T* ri = r + i * ldr;
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

// den_i = qf_i . (z + sum_{j<=i} kf_j) for the chunk's n positions (z advanced), D = den + eps written to denom
// (stride sd), o_i = num_i / D to out (stride so)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void normalise(const T* qf, const T* kf, T* z, const T* num, int64_t n, int64_t d, int64_t dv, T eps,
                      T* denom, int64_t sd, T* out, int64_t so) {
  for (int64_t i = 0; i < n; ++i) {
    T acc = 0;
    #pragma omp simd reduction(+:acc)
    for (int64_t t = 0; t < d; ++t) { z[t] += kf[i * d + t]; acc += qf[i * d + t] * z[t]; }
    const T D = acc + eps;
    denom[i * sd] = D;
    T* oi = out + i * so; const T* ni = num + i * dv;
    #pragma omp simd
    for (int64_t t = 0; t < dv; ++t) oi[t] = ni[t] / D;
  }
}

struct Row {  // one (batch row, head): its inputs' and outputs' first elements and position strides
  const void *q, *k, *v, *S0, *z0;
  void *out, *denom, *S, *z, *savedS, *savedZ;
  int64_t sq, sk, sv, so, sd;
};

// One row's whole causal walk.  Buffers (row-major): A = [P | qn] (C x (C+d)); VS = [v ; S] ((C+d) x dv), S the
// running state; kn, qf, kf (C x d); num (C x dv); z (d).  Every `block` chunks the state entering is saved.
template <typename T>
static void walk(const Row& w, const T* cs, int64_t N, int64_t d, int64_t dv, int64_t C, int64_t block,
                 int64_t ssS, int64_t ssZ, T eps, std::vector<T>& buf) {
  const int64_t L = C + d;
  buf.assign(C * L + L * dv + 3 * C * d + C * dv + d, T(0));
  T* A = buf.data(); T* VS = A + C * L; T* kn = VS + L * dv; T* qf = kn + C * d; T* kf = qf + C * d;
  T* num = kf + C * d; T* z = num + C * dv; T* S = VS + C * dv;
  if (w.S0) std::memcpy(S, w.S0, sizeof(T) * d * dv);
  if (w.z0) std::memcpy(z, w.z0, sizeof(T) * d);
  const T* q = static_cast<const T*>(w.q); const T* k = static_cast<const T*>(w.k);
  const T* v = static_cast<const T*>(w.v);
  T* out = static_cast<T*>(w.out); T* denom = static_cast<T*>(w.denom);
  for (int64_t c = 0, s = 0; s < N; ++c, s += C) {
    if (c > 0 && c % block == 0) {  // the state entering block c / block
      const int64_t b = c / block - 1;
      std::memcpy(static_cast<T*>(w.savedS) + b * ssS, S, sizeof(T) * d * dv);
      std::memcpy(static_cast<T*>(w.savedZ) + b * ssZ, z, sizeof(T) * d);
    }
    const int64_t n = std::min(C, N - s);
    features<T>(q + s * w.sq, w.sq, cs + s * d, n, d, qf, d, A + C, L);
    features<T>(k + s * w.sk, w.sk, cs + s * d, n, d, kf, d, kn, d);
    for (int64_t i = 0; i < n; ++i) std::memcpy(VS + i * dv, v + (s + i) * w.sv, sizeof(T) * dv);
    if (n < C) {  // the last chunk, short: its missing keys and values are zeros
      std::fill(kn + n * d, kn + C * d, T(0));
      std::fill(kf + n * d, kf + C * d, T(0));
      std::fill(VS + n * dv, VS + C * dv, T(0));
    }
    gemm(false, true, n, C, d, A + C, L, kn, d, T(0), A, L);  // P = qn kn^T
    for (int64_t i = 0; i < n; ++i) std::fill(A + i * L + i + 1, A + i * L + C, T(0));  // causal: j <= i
    gemm(false, false, n, dv, L, A, L, VS, dv, T(0), num, dv);  // num = P v + qn S
    normalise<T>(qf, kf, z, num, n, d, dv, eps, denom + s * w.sd, w.sd, out + s * w.so, w.so);
    gemm(true, false, d, dv, n, kn, d, VS, dv, T(1), S, dv);  // S += kn^T v
  }
  std::memcpy(w.S, S, sizeof(T) * d * dv);
  std::memcpy(w.z, z, sizeof(T) * d);
}

static const void* row_of(const c10::optional<torch::Tensor>& t, int64_t b, int64_t h) {
  if (!t.has_value()) return nullptr;
  return static_cast<const char*>(t->data_ptr()) + (b * t->stride(0) + h * t->stride(1)) * t->element_size();
}
static void* row_of(torch::Tensor& t, int64_t b, int64_t h, int dim = 0) {
  return static_cast<char*>(t.data_ptr()) + (b * t.stride(dim) + h * t.stride(dim + 1)) * t.element_size();
}

// The rows (b, h) on OpenMP threads, one row at a time each.  at::parallel_for is not used: compiled here with
// OpenMP, its first call on a thread runs at::init_num_threads, which would set the heads' single-threaded workers
// (heads.py) back to torch's global thread count.
template <typename T>
static void rows(torch::Tensor& q, torch::Tensor& k, torch::Tensor& v, const T* cs,
                 const c10::optional<torch::Tensor>& S0, const c10::optional<torch::Tensor>& z0, torch::Tensor& out,
                 torch::Tensor& denom, torch::Tensor& S, torch::Tensor& z, torch::Tensor& savedS,
                 torch::Tensor& savedZ, int64_t C, int64_t block, T eps, int threads) {
  const int64_t H = q.size(1), N = q.size(2), d = q.size(3), dv = v.size(3), R = q.size(0) * H;
  const int64_t nb = savedS.size(0);
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<T> buf;
    const int one = 1;
    const int mkl = mkl_set_num_threads_local_ ? mkl_set_num_threads_local_(&one) : 0;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t b = r / H, h = r % H;
      Row w;
      w.q = row_of(q, b, h); w.k = row_of(k, b, h); w.v = row_of(v, b, h);
      w.S0 = row_of(S0, b, h); w.z0 = row_of(z0, b, h);
      w.out = row_of(out, b, h); w.denom = row_of(denom, b, h); w.S = row_of(S, b, h); w.z = row_of(z, b, h);
      w.savedS = nb ? row_of(savedS, b, h, 1) : nullptr;
      w.savedZ = nb ? row_of(savedZ, b, h, 1) : nullptr;
      w.sq = q.stride(2); w.sk = k.stride(2); w.sv = v.stride(2); w.so = out.stride(2); w.sd = denom.stride(2);
      walk<T>(w, cs, N, d, dv, C, block, nb ? savedS.stride(0) : 0, nb ? savedZ.stride(0) : 0, eps, buf);
    }
    if (mkl_set_num_threads_local_) mkl_set_num_threads_local_(&mkl);
  }
}

// q, k (B, H, N, d), v (B, H, N, dv): any strides, the last dimension dense; cs (N, d) contiguous; S0 (B, H, d, dv)
// and z0 (B, H, d) contiguous per row, or none; out (B, H, N, dv) and denom (B, H, N) written (any strides, out's
// last dimension dense); S, z (B, H, d, dv), (B, H, d) the final state; savedS, savedZ (nb, B, H, d, dv),
// (nb, B, H, d) contiguous: the states entering blocks 1 .. nb of `block` chunks each.
void forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cs, c10::optional<torch::Tensor> S0,
             c10::optional<torch::Tensor> z0, torch::Tensor out, torch::Tensor denom, torch::Tensor S,
             torch::Tensor z, torch::Tensor savedS, torch::Tensor savedZ, int64_t C, int64_t block, double eps) {
  const int64_t R = q.size(0) * q.size(1);
  const int threads = static_cast<int>(std::min<int64_t>(at::in_parallel_region() ? 1 : at::get_num_threads(), R));
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "native_chunk_forward", [&] {
    rows<scalar_t>(q, k, v, cs.data_ptr<scalar_t>(), S0, z0, out, denom, S, z, savedS, savedZ, C, block,
                   static_cast<scalar_t>(eps), threads);
  });
}
"""
)

NAME = "linrope_native_chunk"
_lock = threading.Lock()
_state: dict = {}  # "ext": the compiled module, or "why": why there is none


def _load():
    with _lock:
        if not _state:
            try:
                from torch.utils.cpp_extension import load_inline

                ext = load_inline(
                    NAME,
                    cpp_sources=SOURCE,
                    functions=["have_blas", "forward"],
                    extra_cflags=["-O3", "-fopenmp"],  # the rows' parallel region (forward)
                    extra_ldflags=["-fopenmp"],  # libgomp.so.1: the runtime torch has already loaded
                )
                if not ext.have_blas():
                    raise RuntimeError("torch's libraries export no sgemm_/dgemm_")
                _state["ext"] = ext
            except Exception as e:  # noqa: BLE001 - no compiler, no BLAS symbols, a failed build: the torch path runs
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                _state["why"] = f"linrope: native chunk loop unavailable ({first}); the chunk kernel uses torch ops"
                print(_state["why"], file=sys.stderr)
        return _state.get("ext")


def why_not() -> Optional[str]:
    """Why the native chunk loop does not run (None when it does, or has not been tried)."""
    if not (ENABLED and native.ENABLED):
        return "native_chunk.ENABLED or native.ENABLED is False"
    return None if (not _state or "ext" in _state) else _state["why"]


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg, log_gamma, documents) -> bool:
    """The one predicate for the native walk: elu+1 features, RoPE in the numerator, causal, normalised, no decay,
    no packed documents, q, k, v of one dtype, float32 or float64, on a CPU, and the extension built."""
    return (
        ENABLED
        and native.ENABLED
        and cfg.feature_map == "elu"
        and cfg.rope == "numerator"
        and cfg.causal
        and cfg.normalize
        and log_gamma is None
        and documents is None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and q.shape[-1] % 2 == 0
        and _load() is not None
    )


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(q, k, v, S0, z0, rot, cfg, blocks, out=None, denom=None):
    """``chunk_kernel.chunk_forward``'s results for a call ``usable`` accepts: (out, denom, S_final, z_final,
    saved_S, saved_z), the saved states those entering ``blocks[1:]``; ``out``/``denom`` as there."""
    B, H, N, d = q.shape
    dv, dtype = v.shape[-1], q.dtype
    C = max(1, min(cfg.chunk_size, N))
    per = (blocks[0][1] - blocks[0][0]) // C if len(blocks) > 1 else -(-N // C)  # chunks per block
    if len(blocks) > 1 and any(s != i * per * C for i, (s, _) in enumerate(blocks)):
        raise ValueError(f"blocks of whole chunks expected, got {blocks[:3]}…")
    q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
    cs = torch.view_as_real(rot).to(dtype).reshape(N, d).contiguous()
    if out is None:
        out = alloc((B, H, N, dv), dtype=v.dtype, device=v.device)
    if denom is None:
        denom = alloc((B, H, N), dtype=dtype, device=q.device)
    S0 = None if S0 is None else S0.to(dtype).contiguous()
    z0 = None if z0 is None else z0.to(dtype).contiguous()
    S = alloc((B, H, d, dv), dtype=dtype, device=q.device)
    z = alloc((B, H, d), dtype=dtype, device=q.device)
    nb = len(blocks) - 1
    saved_S = alloc((nb, B, H, d, dv), dtype=dtype, device=q.device)
    saved_z = alloc((nb, B, H, d), dtype=dtype, device=q.device)
    _load().forward(q, k, v, cs, S0, z0, out, denom, S, z, saved_S, saved_z, C, per, float(cfg.eps))
    return out, denom, S, z, (saved_S if nb else None), (saved_z if nb else None)


__all__ = ["ENABLED", "usable", "why_not", "forward"]
