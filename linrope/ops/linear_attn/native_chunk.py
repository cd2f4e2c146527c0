"""The chunk form's forward and backward as native loops on a CPU: each (batch row, head) walked chunk by chunk in C++.

For the case studies train — elu+1 features, RoPE in the numerator only, causal, no decay, no packed documents,
normalised, float32 or float64 (bfloat16: ``native_bf16.py``'s walks) on a CPU — ``chunk_kernel.chunk_forward``
hands the whole walk to ``forward`` and ``chunk_kernel.chunk_backward`` to ``backward``.  Forward, per chunk of C positions, with every temporary in a few
small buffers of the thread's own (about 100 KiB at C = d = 64, so they stay in L1/L2):

    qf, kf = elu(q) + 1, elu(k) + 1;  qn, kn = qf, kf rotated       (one pass, exp_nonpos of ``native.py``)
    P   = tril(qn knᵀ)                                                (C×C)
    num = [P | qn] · [v ; S]                                          (one product, inner size C + d)
    den_i = qf_i · (z + Σ_{j≤i} kf_j);   o_i = num_i / (den_i + eps)
    S  += knᵀ v;   z += Σ_j kf_j

and the states entering every block of ``chunk.plan`` (whole chunks) are saved as the torch path saves them.
Backward, block by block in reverse: the states entering each chunk of the block recomputed from the saved one, then
the chunks in reverse carrying R = ∂L/∂S and r = ∂L/∂z (g = ∂L/∂o, D = den + eps, features recomputed):

    dnum = g / D;   dden_i = -(dnum_i · o_i);   dP = tril(dnum vᵀ)
    dqn = dP kn + dnum Sᵀ;   dkn = dPᵀ qn + v Rᵀ;   dv = Pᵀ dnum + kn R;   R += qnᵀ dnum
    dqf_i = dden_i (z + Σ_{j≤i} kf_j);   dkf_j = r + Σ_{i≥j} dden_i qf_i;   r += Σ_i dden_i qf_i
    dq = min(qf, 1) ⊙ (R⁻¹ dqn + dqf), dk likewise                   (``native.elu_rope_backward``'s formula)

The products call the BLAS's ``sgemm_``/``dgemm_`` (MKL's, exported by torch's libtorch_cpu here) on the chunk's
buffers; torch's batched products over a block of 4 096 positions kept ~10 tensors of 1 MiB live and ran from the
shared L3, and each block paid ~30 operators' dispatch.  The rows run on OpenMP threads (torch's thread count in a
call run whole, one inside the heads' tasks of ``heads.py``; MKL held to one thread inside), the GIL released.
Either direction works on the other path's saved states.

Compiled with ``load_inline`` on first use (then cached by torch).  Where the build fails, or the BLAS symbols are
missing (a torch without MKL or OpenBLAS exporting them), the torch path runs and ``why_not()`` says why (one
line, printed once).  ``ENABLED = False`` (or ``native.ENABLED = False``) runs the torch path everywhere."""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import Optional

import torch

from linrope.ops.rope import compute_dtype

from . import native, native_bf16
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
// ---- the backward -------------------------------------------------------------------------------------------
// f = elu(x) + 1 for the chunk's rows (as `features`) from x, and out = min(f, 1) * (R^-1 gn + gd): the gradient of
// x from those of its rotated (gn) and plain (gd) features, written for rows positions (out's position stride so)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void features_back(const T* f, const T* gn, const T* gd, const T* cs, int64_t rows, int64_t d, T* out,
                          int64_t so) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* fi = f + i * d; const T* gi = gn + i * d; const T* di = gd + i * d; const T* c = cs + i * d;
    T* oi = out + i * so;
    #pragma omp simd
    for (int64_t t = 0; t < d; t += 2) {
      const T a = gi[t], e = gi[t + 1], co = c[t], si = c[t + 1];
      const T u = a * co + e * si + di[t], w = e * co - a * si + di[t + 1];
      const T f0 = fi[t] < T(1) ? fi[t] : T(1), f1 = fi[t + 1] < T(1) ? fi[t + 1] : T(1);
      oi[t] = f0 * u;
      oi[t + 1] = f1 * w;
    }
  }
}

// dnum_i = g_i / D_i, dden_i = -(dnum_i . o_i) for n rows (zeros to C); and the denominator's scans:
// dqf_i = dden_i (z + sum_{j<=i} kf_j), dkf_j = rz + sum_{i>=j} dden_i qf_i; rz ends as dL/dz entering the chunk
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void den_back(const T* g, int64_t sg, const T* o, int64_t so, const T* D, int64_t sd, int64_t n, int64_t C,
                     int64_t d, int64_t dv, const T* qf, const T* kf, const T* z, T* zc, T* rz, T* dnum, T* dden,
                     T* dqf, T* dkf) {
  for (int64_t i = 0; i < n; ++i) {
    const T* gi = g + i * sg; const T* oi = o + i * so; T* ni = dnum + i * dv;
    const T Di = D[i * sd];
    T acc = 0;
    #pragma omp simd reduction(+:acc)
    for (int64_t t = 0; t < dv; ++t) { ni[t] = gi[t] / Di; acc += ni[t] * oi[t]; }
    dden[i] = -acc;
  }
  std::fill(dnum + n * dv, dnum + C * dv, T(0));
  std::memcpy(zc, z, sizeof(T) * d);
  for (int64_t i = 0; i < n; ++i) {
    const T di = dden[i];
    #pragma omp simd
    for (int64_t t = 0; t < d; ++t) { zc[t] += kf[i * d + t]; dqf[i * d + t] = di * zc[t]; }
  }
  for (int64_t j = n - 1; j >= 0; --j) {
    const T dj = dden[j];
    #pragma omp simd
    for (int64_t t = 0; t < d; ++t) { rz[t] += dj * qf[j * d + t]; dkf[j * d + t] = rz[t]; }
  }
}

struct RowBack {  // one row of the backward: inputs, the forward's results, and the gradients written
  const void *q, *k, *v, *g, *o, *D, *S0, *z0, *gS, *gz, *savedS, *savedZ;
  void *dq, *dk, *dv, *dS0, *dz0;
  int64_t sq, sk, sv, sg, so, sD, sdq, sdk, sdv;
};

// One row's backward: block by block in reverse, the states entering each chunk of the block recomputed from the
// saved one, then the chunks in reverse carrying R = dL/dS and rz = dL/dz.
template <typename T>
static void walk_back(const RowBack& w, const T* cs, int64_t N, int64_t d, int64_t dv, int64_t C, int64_t block,
                      int64_t ssS, int64_t ssZ, std::vector<T>& buf) {
  const int64_t nch = (N + C - 1) / C, nblocks = (nch + block - 1) / block;
  const int64_t per = std::min(block, nch);
  buf.assign(per * (d * dv + d) + 2 * C * C + 8 * C * d + 4 * C * dv + d * dv + 2 * d + C, T(0));
  T* Sc = buf.data(); T* zs = Sc + per * d * dv; T* P = zs + per * d; T* dP = P + C * C;
  T* qf = dP + C * C; T* qn = qf + C * d; T* kf = qn + C * d; T* kn = kf + C * d; T* dqn = kn + C * d;
  T* dkn = dqn + C * d; T* V = dkn + C * d; T* dnum = V + C * dv; T* dV = dnum + C * dv; T* tmp = dV + C * dv;
  T* R = tmp + C * dv; T* rz = R + d * dv; T* zc = rz + d; T* dden = zc + d; T* dqf = dden + C; T* dkf = dqf + C * d;
  const T* q = static_cast<const T*>(w.q); const T* k = static_cast<const T*>(w.k);
  const T* v = static_cast<const T*>(w.v); const T* g = static_cast<const T*>(w.g);
  const T* o = static_cast<const T*>(w.o); const T* D = static_cast<const T*>(w.D);
  T* dq = static_cast<T*>(w.dq); T* dk = static_cast<T*>(w.dk); T* dvo = static_cast<T*>(w.dv);
  if (w.gS) std::memcpy(R, w.gS, sizeof(T) * d * dv);
  if (w.gz) std::memcpy(rz, w.gz, sizeof(T) * d);
  for (int64_t b = nblocks - 1; b >= 0; --b) {
    const int64_t c0 = b * block, c1 = std::min(nch, c0 + block);
    // the states entering chunks c0 .. c1-1
    const T* S_in = b == 0 ? static_cast<const T*>(w.S0) : static_cast<const T*>(w.savedS) + (b - 1) * ssS;
    const T* z_in = b == 0 ? static_cast<const T*>(w.z0) : static_cast<const T*>(w.savedZ) + (b - 1) * ssZ;
    if (S_in) std::memcpy(Sc, S_in, sizeof(T) * d * dv); else std::fill(Sc, Sc + d * dv, T(0));
    if (z_in) std::memcpy(zs, z_in, sizeof(T) * d); else std::fill(zs, zs + d, T(0));
    for (int64_t c = c0; c + 1 < c1; ++c) {
      const int64_t s = c * C, n = std::min(C, N - s), l = c - c0;
      T* Snext = Sc + (l + 1) * d * dv; T* znext = zs + (l + 1) * d;
      features<T>(k + s * w.sk, w.sk, cs + s * d, n, d, kf, d, kn, d);
      for (int64_t i = 0; i < n; ++i) std::memcpy(V + i * dv, v + (s + i) * w.sv, sizeof(T) * dv);
      std::memcpy(Snext, Sc + l * d * dv, sizeof(T) * d * dv);
      gemm(true, false, d, dv, n, kn, d, V, dv, T(1), Snext, dv);
      std::memcpy(znext, zs + l * d, sizeof(T) * d);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) znext[t] += kf[i * d + t];
    }
    for (int64_t c = c1 - 1; c >= c0; --c) {
      const int64_t s = c * C, n = std::min(C, N - s), l = c - c0;
      const T* S = Sc + l * d * dv;
      features<T>(q + s * w.sq, w.sq, cs + s * d, n, d, qf, d, qn, d);
      features<T>(k + s * w.sk, w.sk, cs + s * d, n, d, kf, d, kn, d);
      for (int64_t i = 0; i < n; ++i) std::memcpy(V + i * dv, v + (s + i) * w.sv, sizeof(T) * dv);
      if (n < C) {
        std::fill(qn + n * d, qn + C * d, T(0)); std::fill(qf + n * d, qf + C * d, T(0));
        std::fill(kn + n * d, kn + C * d, T(0)); std::fill(kf + n * d, kf + C * d, T(0));
        std::fill(V + n * dv, V + C * dv, T(0));
      }
      den_back<T>(g + s * w.sg, w.sg, o + s * w.so, w.so, D + s * w.sD, w.sD, n, C, d, dv, qf, kf, zs + l * d, zc,
                  rz, dnum, dden, dqf, dkf);
      gemm(false, true, C, C, d, qn, d, kn, d, T(0), P, C);  // P = tril(qn kn^T)
      gemm(false, true, C, C, dv, dnum, dv, V, dv, T(0), dP, C);  // dP = tril(dnum V^T)
      for (int64_t i = 0; i < C; ++i) {
        std::fill(P + i * C + i + 1, P + (i + 1) * C, T(0));
        std::fill(dP + i * C + i + 1, dP + (i + 1) * C, T(0));
      }
      gemm(false, false, C, d, C, dP, C, kn, d, T(0), dqn, d);  // dqn = dP kn + dnum S^T
      gemm(false, true, C, d, dv, dnum, dv, S, dv, T(1), dqn, d);
      gemm(true, false, C, d, C, dP, C, qn, d, T(0), dkn, d);  // dkn = dP^T qn + V R^T
      gemm(false, true, C, d, dv, V, dv, R, dv, T(1), dkn, d);
      gemm(true, false, C, dv, C, P, C, dnum, dv, T(0), dV, dv);  // dV = P^T dnum + kn R
      gemm(false, false, C, dv, d, kn, d, R, dv, T(1), dV, dv);
      gemm(true, false, d, dv, C, qn, d, dnum, dv, T(1), R, dv);  // R: dL/dS entering the chunk
      features_back<T>(qf, dqn, dqf, cs + s * d, n, d, dq + s * w.sdq, w.sdq);
      features_back<T>(kf, dkn, dkf, cs + s * d, n, d, dk + s * w.sdk, w.sdk);
      for (int64_t i = 0; i < n; ++i) std::memcpy(dvo + (s + i) * w.sdv, dV + i * dv, sizeof(T) * dv);
    }
  }
  std::memcpy(w.dS0, R, sizeof(T) * d * dv);
  std::memcpy(w.dz0, rz, sizeof(T) * d);
}

template <typename T>
static void rows_back(torch::Tensor& q, torch::Tensor& k, torch::Tensor& v, torch::Tensor& g, torch::Tensor& o,
                      torch::Tensor& D, const T* cs, const c10::optional<torch::Tensor>& S0,
                      const c10::optional<torch::Tensor>& z0, const c10::optional<torch::Tensor>& gS,
                      const c10::optional<torch::Tensor>& gz, torch::Tensor& savedS, torch::Tensor& savedZ,
                      torch::Tensor& dq, torch::Tensor& dk, torch::Tensor& dv, torch::Tensor& dS0, torch::Tensor& dz0,
                      int64_t C, int64_t block, int threads) {
  const int64_t H = q.size(1), N = q.size(2), d = q.size(3), V = v.size(3), R = q.size(0) * H;
  const int64_t nb = savedS.size(0);
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<T> buf;
    const int one = 1;
    const int mkl = mkl_set_num_threads_local_ ? mkl_set_num_threads_local_(&one) : 0;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t b = r / H, h = r % H;
      RowBack w;
      w.q = row_of(q, b, h); w.k = row_of(k, b, h); w.v = row_of(v, b, h); w.g = row_of(g, b, h);
      w.o = row_of(o, b, h); w.D = row_of(D, b, h); w.S0 = row_of(S0, b, h); w.z0 = row_of(z0, b, h);
      w.gS = row_of(gS, b, h); w.gz = row_of(gz, b, h);
      w.savedS = nb ? row_of(savedS, b, h, 1) : nullptr;
      w.savedZ = nb ? row_of(savedZ, b, h, 1) : nullptr;
      w.dq = row_of(dq, b, h); w.dk = row_of(dk, b, h); w.dv = row_of(dv, b, h);
      w.dS0 = row_of(dS0, b, h); w.dz0 = row_of(dz0, b, h);
      w.sq = q.stride(2); w.sk = k.stride(2); w.sv = v.stride(2); w.sg = g.stride(2); w.so = o.stride(2);
      w.sD = D.stride(2); w.sdq = dq.stride(2); w.sdk = dk.stride(2); w.sdv = dv.stride(2);
      walk_back<T>(w, cs, N, d, V, C, block, nb ? savedS.stride(0) : 0, nb ? savedZ.stride(0) : 0, buf);
    }
    if (mkl_set_num_threads_local_) mkl_set_num_threads_local_(&mkl);
  }
}

// the backward of `forward`: g (B, H, N, dv) dL/dout; out, denom as forward wrote them; gS, gz dL/d(final state)
// or none; savedS, savedZ as forward wrote them; dq, dk (B, H, N, d), dv (B, H, N, dv) written (any strides, the
// last dimension dense); dS0, dz0 (B, H, d, dv), (B, H, d) contiguous: dL/d(initial state)
void backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cs, torch::Tensor g, torch::Tensor out,
              torch::Tensor denom, c10::optional<torch::Tensor> S0, c10::optional<torch::Tensor> z0,
              c10::optional<torch::Tensor> gS, c10::optional<torch::Tensor> gz, torch::Tensor savedS,
              torch::Tensor savedZ, torch::Tensor dq, torch::Tensor dk, torch::Tensor dv, torch::Tensor dS0,
              torch::Tensor dz0, int64_t C, int64_t block) {
  const int64_t R = q.size(0) * q.size(1);
  const int threads = static_cast<int>(std::min<int64_t>(at::in_parallel_region() ? 1 : at::get_num_threads(), R));
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "native_chunk_backward", [&] {
    rows_back<scalar_t>(q, k, v, g, out, denom, cs.data_ptr<scalar_t>(), S0, z0, gS, gz, savedS, savedZ, dq, dk, dv,
                        dS0, dz0, C, block, threads);
  });
}
"""
)

# one build folder per source: checkouts of other sources (a benchmark's --compare, another worktree's runs) that
# shared one would rebuild it in turn, and a process could load the other's build
NAME = "linrope_native_chunk_" + hashlib.sha1(SOURCE.encode()).hexdigest()[:10]
_lock = threading.Lock()
_state: dict = {}  # "ext": the compiled module, or "why": why there is none


def _load():
    with _lock:
        if not _state:
            try:
                from torch.utils.cpp_extension import load_inline

                if not native._built(NAME):
                    print(f"linrope: building {NAME} for the chunk kernel (once: torch caches it)", file=sys.stderr)
                ext = load_inline(
                    NAME,
                    cpp_sources=SOURCE,
                    functions=["have_blas", "forward", "backward"],
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
    no packed documents, q, k, v of one dtype, float32 or float64 (or bfloat16 where ``native_bf16.serves``), on a
    CPU, and the extension built."""
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
        and q.dtype in (torch.float32, torch.float64, torch.bfloat16)
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and q.shape[-1] % 2 == 0
        and _load() is not None
        and (q.dtype != torch.bfloat16 or native_bf16.serves(SOURCE, q, v, min(cfg.chunk_size, q.shape[2])))
    )


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _geometry(N: int, cfg, blocks) -> tuple:
    """(C, chunks per block) of the walk: the torch path's chunks, and its blocks (whole chunks, all but the last of
    one size)."""
    C = max(1, min(cfg.chunk_size, N))
    per = (blocks[0][1] - blocks[0][0]) // C if len(blocks) > 1 else -(-N // C)
    if len(blocks) > 1 and any(s != i * per * C for i, (s, _) in enumerate(blocks)):
        raise ValueError(f"blocks of whole chunks expected, got {blocks[:3]}…")
    return C, per


def _cos_sin(rot: torch.Tensor, N: int, d: int, dtype) -> torch.Tensor:
    return torch.view_as_real(rot).to(dtype).reshape(N, d).contiguous()


def forward(q, k, v, S0, z0, rot, cfg, blocks, out=None, denom=None):
    """``chunk_kernel.chunk_forward``'s results for a call ``usable`` accepts: (out, denom, S_final, z_final,
    saved_S, saved_z), the saved states those entering ``blocks[1:]``; ``out``/``denom`` as there."""
    B, H, N, d = q.shape
    dv, dtype = v.shape[-1], compute_dtype(q.dtype)  # float32 for bfloat16 (native_bf16.py)
    C, per = _geometry(N, cfg, blocks)
    q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
    cs = _cos_sin(rot, N, d, dtype)
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
    walk = native_bf16.extension(SOURCE).forward_bf16 if q.dtype == torch.bfloat16 else _load().forward
    walk(q, k, v, cs, S0, z0, out, denom, S, z, saved_S, saved_z, C, per, float(cfg.eps))
    return out, denom, S, z, (saved_S if nb else None), (saved_z if nb else None)


def backward(g_out, g_S, g_z, q, k, v, S0, z0, rot, out, denom, saved_S, saved_z, cfg, needs, blocks, grads=None):
    """``chunk_kernel.chunk_backward``'s (dq, dk, dv, dS0, dz0) for a call ``usable`` accepts whose forward
    ``forward`` (or the torch path: the same saved states) ran; ``needs`` and ``grads`` as there."""
    B, H, N, d = q.shape
    dv, dtype = v.shape[-1], compute_dtype(q.dtype)
    C, per = _geometry(N, cfg, blocks)
    q, k, v, g_out, out = (_dense_last(t) for t in (q, k, v, g_out, out))

    def small(t):
        return None if t is None else t.to(dtype).contiguous()

    S0c, z0c, g_S, g_z = small(S0), small(z0), small(g_S), small(g_z)
    nb = len(blocks) - 1
    if saved_S is None:
        saved_S = q.new_empty((0, B, H, d, dv), dtype=dtype)
        saved_z = q.new_empty((0, B, H, d), dtype=dtype)
    given = [None, None, None] if grads is None else list(grads)
    bufs = [t if (t is not None and t.stride(-1) == 1 and t.dtype == x.dtype) else alloc(x.shape, dtype=x.dtype,
            device=x.device) for t, x in zip(given, (q, k, v))]  # fmt: skip
    dS0 = alloc((B, H, d, dv), dtype=dtype, device=q.device)
    dz0 = alloc((B, H, d), dtype=dtype, device=q.device)
    if saved_S.shape[0] != nb:
        raise ValueError(f"{saved_S.shape[0]} saved states for {nb + 1} blocks")
    walk = native_bf16.extension(SOURCE).backward_bf16 if q.dtype == torch.bfloat16 else _load().backward
    walk(q, k, v, _cos_sin(rot, N, d, dtype), g_out, out, denom, S0c, z0c, g_S, g_z, saved_S, saved_z, *bufs, dS0,
         dz0, C, per)  # fmt: skip
    for t, b in zip(given, bufs):
        if t is not None and t is not b:
            t.copy_(b)
    res = [(t if t is not None else b) if need else None for t, b, need in zip(given, bufs, needs[:3])]
    dS0 = dS0.to(S0.dtype) if (S0 is not None and needs[3]) else None
    dz0 = dz0.to(z0.dtype) if (z0 is not None and needs[4]) else None
    return (*res, dS0, dz0)


__all__ = ["ENABLED", "usable", "why_not", "forward", "backward"]
