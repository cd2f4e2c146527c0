
#include "torch_api.h"
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
#include "features.h"

// rows positions of x (position stride sx, last dimension dense): f = elu(x) + 1 (row stride ldf), r = f rotated
// by the pairs (cos, sin) of cs (row stride d) (row stride ldr)
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void features(const T* x, int64_t sx, const T* cs, int64_t rows, int64_t d, T* f, int64_t ldf, T* r,
                     int64_t ldr) {
  for (int64_t i = 0; i < rows; ++i) elu_rope_row(x + i * sx, cs + i * d, d, f + i * ldf, r + i * ldr);
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

static const void* row_of(const c10::optional<at::Tensor>& t, int64_t b, int64_t h) {
  if (!t.has_value()) return nullptr;
  return static_cast<const char*>(t->data_ptr()) + (b * t->stride(0) + h * t->stride(1)) * t->element_size();
}
static void* row_of(at::Tensor& t, int64_t b, int64_t h, int dim = 0) {
  return static_cast<char*>(t.data_ptr()) + (b * t.stride(dim) + h * t.stride(dim + 1)) * t.element_size();
}

// Runs each(r, scratch) for the rows r = b * H + h on OpenMP threads (torch's thread count, one inside a parallel
// region), one row at a time each, every thread with a Scratch of its own and MKL held to one thread.
// at::parallel_for is not used: compiled here with OpenMP, its first call on a thread runs at::init_num_threads, which
// would set the heads' single-threaded workers (heads.py) back to torch's global thread count.
template <typename Scratch, typename F>
static void each_row(int64_t R, F&& each) {
  const int threads = static_cast<int>(std::min<int64_t>(at::in_parallel_region() ? 1 : at::get_num_threads(), R));
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    Scratch scratch;
    const int one = 1;
    const int mkl = mkl_set_num_threads_local_ ? mkl_set_num_threads_local_(&one) : 0;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < R; ++r) each(r, scratch);
    if (mkl_set_num_threads_local_) mkl_set_num_threads_local_(&mkl);
  }
}

// row r = b * H + h of forward's tensors
static Row row_at(int64_t r, at::Tensor& q, at::Tensor& k, at::Tensor& v,
                  const c10::optional<at::Tensor>& S0, const c10::optional<at::Tensor>& z0, at::Tensor& out,
                  at::Tensor& denom, at::Tensor& S, at::Tensor& z, at::Tensor& savedS,
                  at::Tensor& savedZ) {
  const int64_t H = q.size(1), b = r / H, h = r % H;
  const bool saved = savedS.size(0) > 0;
  Row w;
  w.q = row_of(q, b, h); w.k = row_of(k, b, h); w.v = row_of(v, b, h);
  w.S0 = row_of(S0, b, h); w.z0 = row_of(z0, b, h);
  w.out = row_of(out, b, h); w.denom = row_of(denom, b, h); w.S = row_of(S, b, h); w.z = row_of(z, b, h);
  w.savedS = saved ? row_of(savedS, b, h, 1) : nullptr;
  w.savedZ = saved ? row_of(savedZ, b, h, 1) : nullptr;
  w.sq = q.stride(2); w.sk = k.stride(2); w.sv = v.stride(2); w.so = out.stride(2); w.sd = denom.stride(2);
  return w;
}

// q, k (B, H, N, d), v (B, H, N, dv): any strides, the last dimension dense; cs (N, d) contiguous; S0 (B, H, d, dv)
// and z0 (B, H, d) contiguous per row, or none; out (B, H, N, dv) and denom (B, H, N) written (any strides, out's
// last dimension dense); S, z (B, H, d, dv), (B, H, d) the final state; savedS, savedZ (nb, B, H, d, dv),
// (nb, B, H, d) contiguous: the states entering blocks 1 .. nb of `block` chunks each.
void forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor cs, c10::optional<at::Tensor> S0,
             c10::optional<at::Tensor> z0, at::Tensor out, at::Tensor denom, at::Tensor S,
             at::Tensor z, at::Tensor savedS, at::Tensor savedZ, int64_t C, int64_t block, double eps) {
  pybind11::gil_scoped_release no_gil;
  const int64_t N = q.size(2), d = q.size(3), dv = v.size(3), nb = savedS.size(0);
  const int64_t ssS = nb ? savedS.stride(0) : 0, ssZ = nb ? savedZ.stride(0) : 0;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "native_chunk_forward", [&] {
    const scalar_t* c = cs.data_ptr<scalar_t>();
    each_row<std::vector<scalar_t>>(q.size(0) * q.size(1), [&](int64_t r, std::vector<scalar_t>& buf) {
      walk<scalar_t>(row_at(r, q, k, v, S0, z0, out, denom, S, z, savedS, savedZ), c, N, d, dv, C, block, ssS, ssZ,
                     static_cast<scalar_t>(eps), buf);
    });
  });
}
// ---- the backward -------------------------------------------------------------------------------------------
// out = min(f, 1) * (R^-1 gn + gd) for rows positions (out's position stride so): the gradient of x from those of
// its rotated (gn) and plain (gd) features, f = elu(x) + 1 as `features` formed it
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
static void features_back(const T* f, const T* gn, const T* gd, const T* cs, int64_t rows, int64_t d, T* out,
                          int64_t so) {
  for (int64_t i = 0; i < rows; ++i)
    elu_rope_back_row<true>(f + i * d, gn + i * d, gd + i * d, cs + i * d, d, out + i * so);
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

// row r = b * H + h of backward's tensors
static RowBack row_back_at(int64_t r, at::Tensor& q, at::Tensor& k, at::Tensor& v, at::Tensor& g,
                           at::Tensor& o, at::Tensor& D, const c10::optional<at::Tensor>& S0,
                           const c10::optional<at::Tensor>& z0, const c10::optional<at::Tensor>& gS,
                           const c10::optional<at::Tensor>& gz, at::Tensor& savedS, at::Tensor& savedZ,
                           at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dS0,
                           at::Tensor& dz0) {
  const int64_t H = q.size(1), b = r / H, h = r % H;
  const bool saved = savedS.size(0) > 0;
  RowBack w;
  w.q = row_of(q, b, h); w.k = row_of(k, b, h); w.v = row_of(v, b, h); w.g = row_of(g, b, h);
  w.o = row_of(o, b, h); w.D = row_of(D, b, h); w.S0 = row_of(S0, b, h); w.z0 = row_of(z0, b, h);
  w.gS = row_of(gS, b, h); w.gz = row_of(gz, b, h);
  w.savedS = saved ? row_of(savedS, b, h, 1) : nullptr;
  w.savedZ = saved ? row_of(savedZ, b, h, 1) : nullptr;
  w.dq = row_of(dq, b, h); w.dk = row_of(dk, b, h); w.dv = row_of(dv, b, h);
  w.dS0 = row_of(dS0, b, h); w.dz0 = row_of(dz0, b, h);
  w.sq = q.stride(2); w.sk = k.stride(2); w.sv = v.stride(2); w.sg = g.stride(2); w.so = o.stride(2);
  w.sD = D.stride(2); w.sdq = dq.stride(2); w.sdk = dk.stride(2); w.sdv = dv.stride(2);
  return w;
}

// the backward of `forward`: g (B, H, N, dv) dL/dout; out, denom as forward wrote them; gS, gz dL/d(final state)
// or none; savedS, savedZ as forward wrote them; dq, dk (B, H, N, d), dv (B, H, N, dv) written (any strides, the
// last dimension dense); dS0, dz0 (B, H, d, dv), (B, H, d) contiguous: dL/d(initial state)
void backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor cs, at::Tensor g, at::Tensor out,
              at::Tensor denom, c10::optional<at::Tensor> S0, c10::optional<at::Tensor> z0,
              c10::optional<at::Tensor> gS, c10::optional<at::Tensor> gz, at::Tensor savedS,
              at::Tensor savedZ, at::Tensor dq, at::Tensor dk, at::Tensor dv, at::Tensor dS0,
              at::Tensor dz0, int64_t C, int64_t block) {
  pybind11::gil_scoped_release no_gil;
  const int64_t N = q.size(2), d = q.size(3), V = v.size(3), nb = savedS.size(0);
  const int64_t ssS = nb ? savedS.stride(0) : 0, ssZ = nb ? savedZ.stride(0) : 0;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "native_chunk_backward", [&] {
    const scalar_t* c = cs.data_ptr<scalar_t>();
    each_row<std::vector<scalar_t>>(q.size(0) * q.size(1), [&](int64_t r, std::vector<scalar_t>& buf) {
      walk_back<scalar_t>(row_back_at(r, q, k, v, g, out, denom, S0, z0, gS, gz, savedS, savedZ, dq, dk, dv, dS0, dz0),
                          c, N, d, V, C, block, ssS, ssZ, buf);
    });
  });
}
