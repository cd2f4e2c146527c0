
#include "torch_api.h"

// Every loop is an at::parallel_for over rows of at least GRAIN numbers; this module is compiled without OpenMP,
// so each runs its whole range on the calling thread (the heads' tasks of heads.py run side by side).
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
void denominator(at::Tensor qd, at::Tensor kd, at::Tensor z, at::Tensor den) {
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
void denominator_backward(at::Tensor qd, at::Tensor kd, at::Tensor dden, at::Tensor z,
                          at::Tensor acc, at::Tensor dq, at::Tensor dk) {
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
#include "features.h"


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
    elu_rope_row(xi, cs + i * d, d, f + o, r + o);
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
    T* oi = out + b * ob + h * oh + i * on;
    if (gd) elu_rope_back_row<true>(f + o, gn + o, gd + o, cs + i * d, d, oi);
    else elu_rope_back_row<false>(f + o, gn + o, gd, cs + i * d, d, oi);
  }
}

void elu_rope(at::Tensor x, at::Tensor cs, at::Tensor f, at::Tensor r) {
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

void elu_rope_backward(at::Tensor f, at::Tensor gn, c10::optional<at::Tensor> gd, at::Tensor cs,
                       at::Tensor out) {
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
