
// ---- bfloat16: the walk with AVX-512 BF16 products (native_bf16.py) ------------------------------------------
#include <immintrin.h>
#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

bool has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

typedef uint32_t word_t;  // two bfloat16: the first in the low half

BF16 static inline __m256i narrow16(const float* x) {  // 16 floats to bfloat16, rounded to nearest even
  return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x));
}
BF16 static inline __m256i load16(const uint16_t* x) { return _mm256_loadu_si256((const __m256i*)x); }
BF16 static inline __m256i load16(const float* x) { return narrow16(x); }

// rows x cols (cols % 16 == 0): bfloat16 to float, float to bfloat16 (row strides lx, ly)
BF16 static void widen(const uint16_t* x, int64_t lx, int64_t rows, int64_t cols, float* y, int64_t ly) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16)
      _mm512_storeu_ps(y + r * ly + c,
                       _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load16(x + r * lx + c)), 16)));
}
BF16 static void narrow(const float* x, int64_t lx, int64_t rows, int64_t cols, uint16_t* y, int64_t ly) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) _mm256_storeu_si256((__m256i*)(y + r * ly + c), narrow16(x + r * lx + c));
}

// out[p][c] = (x[2p][c], x[2p+1][c]) for p < rows / 2: two rows interleaved (x rows x cols, row stride lx, float or
// bfloat16; rows even, cols % 16 == 0); out's row stride cols
template <typename X>
BF16 static void pack_rows(const X* x, int64_t lx, int64_t rows, int64_t cols, word_t* out) {
  for (int64_t p = 0; p < rows / 2; ++p)
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(load16(x + 2 * p * lx + c));
      const __m512i hi = _mm512_cvtepu16_epi32(load16(x + (2 * p + 1) * lx + c));
      _mm512_storeu_si512(out + p * cols + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

// y = x^T for words: x rows x cols, y cols x rows (both dense; rows and cols multiples of 8)
BF16 static void transpose_words(const word_t* x, int64_t rows, int64_t cols, word_t* y) {
  for (int64_t r = 0; r < rows; r += 8)  // 8 x 8 blocks in registers (rows and cols are multiples of 8)
    for (int64_t c = 0; c < cols; c += 8) {
      __m256 t[8], u[8];
      #pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) t[i] = _mm256_loadu_ps((const float*)(x + (r + i) * cols + c));
      #pragma GCC unroll 4
      for (int i = 0; i < 8; i += 2) {
        u[i] = _mm256_unpacklo_ps(t[i], t[i + 1]);
        u[i + 1] = _mm256_unpackhi_ps(t[i], t[i + 1]);
      }
      #pragma GCC unroll 2
      for (int i = 0; i < 8; i += 4) {
        t[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
        t[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
        t[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
        t[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
      }
      #pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps((float*)(y + (c + i) * rows + r), _mm256_permute2f128_ps(t[i], t[i + 4], 0x20));
        _mm256_storeu_ps((float*)(y + (c + i + 4) * rows + r), _mm256_permute2f128_ps(t[i], t[i + 4], 0x31));
      }
    }
}

// C (MR x 16 NV, row stride ldc) = [C +] A B over k2 pairs: A's word p of row r at A[r * ar + p * ap], B's pair
// row p at B + p * ldb
template <int NV, int MR>
BF16 static inline void tile(int64_t k2, const word_t* A, int64_t ar, int64_t ap, const word_t* B, int64_t ldb,
                             float* C, int64_t ldc, bool acc) {
  __m512 c[MR][NV];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < k2; ++p) {
    __m512bh b[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + p * ldb + 16 * v);
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[r * ar + p * ap]));
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
}

// Which part of a product is needed.  A chunk's causal products have triangular inputs or outputs, and a row tile
// [r, r + mr) skips what the triangle makes zero or the mask throws away (the sums are unchanged: the skipped
// terms are exact zeros):
//   FULL     all of it;
//   A_LOWER  A[i][k] = 0 for k > i (P v, dP kn): pairs p <= (r + mr - 1) / 2 only;
//   A_UPPER  A[i][k] = 0 for k < i (P^T dnum, dP^T qn): pairs p >= r / 2 only;
//   C_LOWER  only C[i][j], j <= i, is kept (qn kn^T, dnum V^T before the mask): columns < r + mr, in whole
//            16-column vectors (the columns left unwritten are all above the diagonal, for the mask to clear).
enum Shape { FULL, A_LOWER, A_UPPER, C_LOWER };

template <int MR>
BF16 static void columns(int64_t n, int64_t k2, const word_t* A, int64_t ar, int64_t ap, const word_t* B,
                         int64_t ldb, float* C, int64_t ldc, bool acc) {
  for (int64_t c = 0; c < n; c += 64) {
    switch (std::min<int64_t>(4, (n - c) / 16)) {
      case 4: tile<4, MR>(k2, A, ar, ap, B + c, ldb, C + c, ldc, acc); break;
      case 3: tile<3, MR>(k2, A, ar, ap, B + c, ldb, C + c, ldc, acc); break;
      case 2: tile<2, MR>(k2, A, ar, ap, B + c, ldb, C + c, ldc, acc); break;
      case 1: tile<1, MR>(k2, A, ar, ap, B + c, ldb, C + c, ldc, acc); break;
    }
  }
}

// C (m x n, row stride ldc) = [C +] A B, the inner dimension k2 pairs (A, B as `tile`'s; n % 16 == 0), the part
// `shape` says
BF16 static void mm(int64_t m, int64_t n, int64_t k2, const word_t* A, int64_t ar, int64_t ap, const word_t* B,
                    int64_t ldb, float* C, int64_t ldc, bool acc, Shape shape = FULL) {
  for (int64_t r = 0; r < m; r += 4) {
    const int64_t mr = std::min<int64_t>(4, m - r);
    int64_t p0 = 0, p1 = k2, cols = n;
    if (shape == A_LOWER) p1 = std::min(k2, (r + mr - 1) / 2 + 1);
    if (shape == A_UPPER) p0 = std::min(k2, r / 2);
    if (shape == C_LOWER) cols = std::min(n, (r + mr + 15) / 16 * 16);
    const word_t* Ar = A + r * ar + p0 * ap; const word_t* Br = B + p0 * ldb; float* Cr = C + r * ldc;
    switch (mr) {
      case 4: columns<4>(cols, p1 - p0, Ar, ar, ap, Br, ldb, Cr, ldc, acc); break;
      case 3: columns<3>(cols, p1 - p0, Ar, ar, ap, Br, ldb, Cr, ldc, acc); break;
      case 2: columns<2>(cols, p1 - p0, Ar, ar, ap, Br, ldb, Cr, ldc, acc); break;
      case 1: columns<1>(cols, p1 - p0, Ar, ar, ap, Br, ldb, Cr, ldc, acc); break;
    }
  }
}

// For tests: `mm` on float32 matrices rounded to bfloat16: C (m x n) = op(a) b in the part `shape` says, where op(a)
// = a (m x K, words along its rows, as `narrow` gives them) or, with transposed, a^T (a: K x m, read as `pack_rows`
// gives it); b: K x n.  K and n multiples of 16; entries `shape` leaves unwritten are NaN.
at::Tensor product_bf16(at::Tensor a, at::Tensor b, int64_t shape, bool transposed) {
  a = a.contiguous(); b = b.contiguous();
  const int64_t K = b.size(0), n = b.size(1), m = transposed ? a.size(1) : a.size(0), k2 = K / 2;
  TORCH_CHECK(K % 16 == 0 && n % 16 == 0 && a.numel() == m * K && shape >= FULL && shape <= C_LOWER,
              "product_bf16: K and n multiples of 16, a m x K (K x m transposed), shape 0-3");
  const int64_t m16 = (m + 15) / 16 * 16;  // pack_rows's width: a's rows padded to whole vectors
  std::vector<word_t> A(transposed ? k2 * m16 : m * k2), B(k2 * n);
  if (transposed) {  // a's rows paired, as the walk pairs dP's and P's rows: A's word p of row r at A[p * m16 + r]
    std::vector<float> padded(K * m16, 0.0f);
    for (int64_t i = 0; i < K; ++i)
      std::memcpy(padded.data() + i * m16, a.data_ptr<float>() + i * m, sizeof(float) * m);
    pack_rows(padded.data(), m16, K, m16, A.data());
  } else {
    narrow(a.data_ptr<float>(), K, m, K, reinterpret_cast<uint16_t*>(A.data()), K);
  }
  pack_rows(b.data_ptr<float>(), n, K, n, B.data());
  at::Tensor c = at::full({m, n}, NAN, b.options());
  if (transposed)
    mm(m, n, k2, A.data(), 1, m16, B.data(), n, c.data_ptr<float>(), n, false, static_cast<Shape>(shape));
  else
    mm(m, n, k2, A.data(), k2, 1, B.data(), n, c.data_ptr<float>(), n, false, static_cast<Shape>(shape));
  return c;
}

static void causal_mask(float* P, int64_t rows, int64_t C) {  // P's first rows (row stride C): j > i set to 0
  for (int64_t i = 0; i < rows; ++i) std::fill(P + i * C + i + 1, P + (i + 1) * C, 0.0f);
}

// n rows of bfloat16 (position stride sx) widened into f32 (C x d, rows n .. C zero), then elu+1 and rotated
BF16 static void features_bf16(const uint16_t* x, int64_t sx, const float* cs, int64_t n, int64_t C, int64_t d,
                               float* tmp, float* f, float* r) {
  widen(x, sx, n, d, tmp, d);
  features<float>(tmp, d, cs, n, d, f, d, r, d);
  std::fill(f + n * d, f + C * d, 0.0f);
  std::fill(r + n * d, r + C * d, 0.0f);
}

// n rows of v (bfloat16, stride sv) into V16 (C x dv, rows n .. C zero)
static void values_bf16(const uint16_t* v, int64_t sv, int64_t n, int64_t C, int64_t dv, uint16_t* V16) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(V16 + i * dv, v + i * sv, sizeof(uint16_t) * dv);
  std::fill(V16 + n * dv, V16 + C * dv, uint16_t(0));
}

// One row's forward (native_chunk's `walk`, bfloat16 in and out).  Float buffers: x (C x d, the widened input),
// qf, qn, kf, kn (C x d), P (C x C), num, o (C x dv), S (d x dv), z (d).  Words: Q16, K16 (C x d/2: qn, kn),
// KT (d/2 x C: K16^T), KP (C/2 x d: kn's rows paired), V16 (C x dv/2), VP (C/2 x dv), SP (d/2 x dv), P16 (C x C/2).
BF16 static void walk_bf16(const Row& w, const float* cs, int64_t N, int64_t d, int64_t dv, int64_t C,
                           int64_t block, int64_t ssS, int64_t ssZ, float eps, std::vector<float>& buf,
                           std::vector<word_t>& words) {
  const int64_t h = d / 2, hv = dv / 2, hc = C / 2;
  buf.assign(5 * C * d + C * C + 2 * C * dv + d * dv + d, 0.0f);
  words.assign(2 * C * h + h * C + hc * d + C * hv + hc * dv + h * dv + C * hc, 0);
  float* x = buf.data(); float* qf = x + C * d; float* qn = qf + C * d; float* kf = qn + C * d;
  float* kn = kf + C * d; float* P = kn + C * d; float* num = P + C * C; float* o = num + C * dv;
  float* S = o + C * dv; float* z = S + d * dv;
  word_t* Q16 = words.data(); word_t* K16 = Q16 + C * h; word_t* KT = K16 + C * h; word_t* KP = KT + h * C;
  word_t* V16 = KP + hc * d; word_t* VP = V16 + C * hv; word_t* SP = VP + hc * dv; word_t* P16 = SP + h * dv;
  if (w.S0) std::memcpy(S, w.S0, sizeof(float) * d * dv);
  if (w.z0) std::memcpy(z, w.z0, sizeof(float) * d);
  const uint16_t* q = static_cast<const uint16_t*>(w.q); const uint16_t* k = static_cast<const uint16_t*>(w.k);
  const uint16_t* v = static_cast<const uint16_t*>(w.v);
  uint16_t* out = static_cast<uint16_t*>(w.out); float* denom = static_cast<float*>(w.denom);
  for (int64_t c = 0, s = 0; s < N; ++c, s += C) {
    if (c > 0 && c % block == 0) {  // the state entering block c / block
      const int64_t b = c / block - 1;
      std::memcpy(static_cast<float*>(w.savedS) + b * ssS, S, sizeof(float) * d * dv);
      std::memcpy(static_cast<float*>(w.savedZ) + b * ssZ, z, sizeof(float) * d);
    }
    const int64_t n = std::min(C, N - s);
    features_bf16(q + s * w.sq, w.sq, cs + s * d, n, C, d, x, qf, qn);
    features_bf16(k + s * w.sk, w.sk, cs + s * d, n, C, d, x, kf, kn);
    values_bf16(v + s * w.sv, w.sv, n, C, dv, reinterpret_cast<uint16_t*>(V16));
    narrow(qn, d, C, d, reinterpret_cast<uint16_t*>(Q16), d);
    narrow(kn, d, C, d, reinterpret_cast<uint16_t*>(K16), d);
    transpose_words(K16, C, h, KT);
    pack_rows(kn, d, C, d, KP);
    pack_rows(reinterpret_cast<const uint16_t*>(V16), dv, C, dv, VP);
    pack_rows(S, dv, d, dv, SP);
    mm(n, C, h, Q16, h, 1, KT, C, P, C, false, C_LOWER);  // P = qn kn^T
    causal_mask(P, n, C);
    narrow(P, C, n, C, reinterpret_cast<uint16_t*>(P16), C);
    mm(n, dv, hc, P16, hc, 1, VP, dv, num, dv, false, A_LOWER);  // num = P v + qn S
    mm(n, dv, h, Q16, h, 1, SP, dv, num, dv, true);
    normalise<float>(qf, kf, z, num, n, d, dv, eps, denom + s * w.sd, w.sd, o, dv);
    narrow(o, dv, n, dv, out + s * w.so, w.so);
    mm(d, dv, hc, KP, 1, d, VP, dv, S, dv, true);  // S += kn^T v
  }
  std::memcpy(w.S, S, sizeof(float) * d * dv);
  std::memcpy(w.z, z, sizeof(float) * d);
}

struct Scratch16 {  // a thread's buffers for the bfloat16 walks
  std::vector<float> buf;
  std::vector<word_t> words;
};

// `forward` for bfloat16 q, k, v and out; cs, S0, z0, denom, S, z and the saved states float32
void forward_bf16(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor cs,
                  c10::optional<at::Tensor> S0, c10::optional<at::Tensor> z0, at::Tensor out,
                  at::Tensor denom, at::Tensor S, at::Tensor z, at::Tensor savedS, at::Tensor savedZ,
                  int64_t C, int64_t block, double eps) {
  pybind11::gil_scoped_release no_gil;
  const int64_t N = q.size(2), d = q.size(3), dv = v.size(3), nb = savedS.size(0);
  const int64_t ssS = nb ? savedS.stride(0) : 0, ssZ = nb ? savedZ.stride(0) : 0;
  const float* c = cs.data_ptr<float>();
  each_row<Scratch16>(q.size(0) * q.size(1), [&](int64_t r, Scratch16& s) {
    walk_bf16(row_at(r, q, k, v, S0, z0, out, denom, S, z, savedS, savedZ), c, N, d, dv, C, block, ssS, ssZ,
              static_cast<float>(eps), s.buf, s.words);
  });
}
// One row's backward (native_chunk's `walk_back`, bfloat16 q, k, v, g, o in and dq, dk, dv out).  Float buffers:
// x (C x max(d, dv): widened input), Sc (per x d x dv), zs (per x d), qf, qn, kf, kn, dqn, dkn, dqf, dkf (C x d),
// P, dP (C x C), gw, ow, dnum, dV (C x dv), R (d x dv), rz, zc (d), dden (C).  Words: Q16, K16 (C x d/2), QP, KP
// (C/2 x d), KT (d/2 x C), V16 (C x dv/2), VT (dv/2 x C), VP, DP (C/2 x dv), D16 (C x dv/2), PP, dPP (C/2 x C),
// dP16 (C x C/2), S16, R16 (d x dv/2), ST, RT (dv/2 x d), RP (d/2 x dv).
BF16 static void walk_back_bf16(const RowBack& w, const float* cs, int64_t N, int64_t d, int64_t dv, int64_t C,
                                int64_t block, int64_t ssS, int64_t ssZ, std::vector<float>& buf,
                                std::vector<word_t>& words) {
  const int64_t nch = (N + C - 1) / C, nblocks = (nch + block - 1) / block;
  const int64_t per = std::min(block, nch), h = d / 2, hv = dv / 2, hc = C / 2, wx = std::max(d, dv);
  buf.assign(C * wx + per * (d * dv + d) + 8 * C * d + 2 * C * C + 4 * C * dv + d * dv + 2 * d + C, 0.0f);
  float* x = buf.data(); float* Sc = x + C * wx; float* zs = Sc + per * d * dv; float* qf = zs + per * d;
  float* qn = qf + C * d; float* kf = qn + C * d; float* kn = kf + C * d; float* dqn = kn + C * d;
  float* dkn = dqn + C * d; float* dqf = dkn + C * d; float* dkf = dqf + C * d; float* P = dkf + C * d;
  float* dP = P + C * C; float* gw = dP + C * C; float* ow = gw + C * dv; float* dnum = ow + C * dv;
  float* dV = dnum + C * dv; float* R = dV + C * dv; float* rz = R + d * dv; float* zc = rz + d;
  float* dden = zc + d;
  words.assign(2 * C * h + 2 * hc * d + h * C + 2 * C * hv + hv * C + 2 * hc * dv + 2 * hc * C + C * hc +
               2 * d * hv + 2 * hv * d + h * dv, 0);
  word_t* Q16 = words.data(); word_t* K16 = Q16 + C * h; word_t* QP = K16 + C * h; word_t* KP = QP + hc * d;
  word_t* KT = KP + hc * d; word_t* V16 = KT + h * C; word_t* D16 = V16 + C * hv; word_t* VT = D16 + C * hv;
  word_t* VP = VT + hv * C; word_t* DP = VP + hc * dv; word_t* PP = DP + hc * dv; word_t* dPP = PP + hc * C;
  word_t* dP16 = dPP + hc * C; word_t* S16 = dP16 + C * hc; word_t* R16 = S16 + d * hv; word_t* ST = R16 + d * hv;
  word_t* RT = ST + hv * d; word_t* RP = RT + hv * d;
  auto u16 = [](word_t* p) { return reinterpret_cast<uint16_t*>(p); };
  const uint16_t* q = static_cast<const uint16_t*>(w.q); const uint16_t* k = static_cast<const uint16_t*>(w.k);
  const uint16_t* v = static_cast<const uint16_t*>(w.v); const uint16_t* g = static_cast<const uint16_t*>(w.g);
  const uint16_t* o = static_cast<const uint16_t*>(w.o); const float* D = static_cast<const float*>(w.D);
  uint16_t* dq = static_cast<uint16_t*>(w.dq); uint16_t* dk = static_cast<uint16_t*>(w.dk);
  uint16_t* dvo = static_cast<uint16_t*>(w.dv);
  if (w.gS) std::memcpy(R, w.gS, sizeof(float) * d * dv);
  if (w.gz) std::memcpy(rz, w.gz, sizeof(float) * d);
  for (int64_t b = nblocks - 1; b >= 0; --b) {
    const int64_t c0 = b * block, c1 = std::min(nch, c0 + block);
    // the states entering chunks c0 .. c1-1
    const float* S_in = b == 0 ? static_cast<const float*>(w.S0) : static_cast<const float*>(w.savedS) + (b - 1) * ssS;
    const float* z_in = b == 0 ? static_cast<const float*>(w.z0) : static_cast<const float*>(w.savedZ) + (b - 1) * ssZ;
    if (S_in) std::memcpy(Sc, S_in, sizeof(float) * d * dv); else std::fill(Sc, Sc + d * dv, 0.0f);
    if (z_in) std::memcpy(zs, z_in, sizeof(float) * d); else std::fill(zs, zs + d, 0.0f);
    for (int64_t c = c0; c + 1 < c1; ++c) {
      const int64_t s = c * C, n = std::min(C, N - s), l = c - c0;
      float* Snext = Sc + (l + 1) * d * dv; float* znext = zs + (l + 1) * d;
      features_bf16(k + s * w.sk, w.sk, cs + s * d, n, C, d, x, kf, kn);
      values_bf16(v + s * w.sv, w.sv, n, C, dv, u16(V16));
      pack_rows(kn, d, C, d, KP);
      pack_rows(u16(V16), dv, C, dv, VP);
      std::memcpy(Snext, Sc + l * d * dv, sizeof(float) * d * dv);
      mm(d, dv, hc, KP, 1, d, VP, dv, Snext, dv, true);
      std::memcpy(znext, zs + l * d, sizeof(float) * d);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) znext[t] += kf[i * d + t];
    }
    for (int64_t c = c1 - 1; c >= c0; --c) {
      const int64_t s = c * C, n = std::min(C, N - s), l = c - c0;
      const float* S = Sc + l * d * dv;
      features_bf16(q + s * w.sq, w.sq, cs + s * d, n, C, d, x, qf, qn);
      features_bf16(k + s * w.sk, w.sk, cs + s * d, n, C, d, x, kf, kn);
      values_bf16(v + s * w.sv, w.sv, n, C, dv, u16(V16));
      widen(g + s * w.sg, w.sg, n, dv, gw, dv);
      widen(o + s * w.so, w.so, n, dv, ow, dv);
      den_back<float>(gw, dv, ow, dv, D + s * w.sD, w.sD, n, C, d, dv, qf, kf, zs + l * d, zc, rz, dnum, dden, dqf,
                      dkf);
      narrow(qn, d, C, d, u16(Q16), d); pack_rows(qn, d, C, d, QP);
      narrow(kn, d, C, d, u16(K16), d); pack_rows(kn, d, C, d, KP); transpose_words(K16, C, h, KT);
      transpose_words(V16, C, hv, VT); pack_rows(u16(V16), dv, C, dv, VP);
      narrow(dnum, dv, C, dv, u16(D16), dv); pack_rows(dnum, dv, C, dv, DP);
      narrow(S, dv, d, dv, u16(S16), dv); transpose_words(S16, d, hv, ST);
      narrow(R, dv, d, dv, u16(R16), dv); transpose_words(R16, d, hv, RT); pack_rows(R, dv, d, dv, RP);
      mm(C, C, h, Q16, h, 1, KT, C, P, C, false, C_LOWER);  // P = tril(qn kn^T)
      mm(C, C, hv, D16, hv, 1, VT, C, dP, C, false, C_LOWER);  // dP = tril(dnum V^T)
      causal_mask(P, C, C);
      causal_mask(dP, C, C);
      pack_rows(P, C, C, C, PP);
      narrow(dP, C, C, C, u16(dP16), C); pack_rows(dP, C, C, C, dPP);
      mm(C, d, hc, dP16, hc, 1, KP, d, dqn, d, false, A_LOWER);  // dqn = dP kn + dnum S^T
      mm(C, d, hv, D16, hv, 1, ST, d, dqn, d, true);
      mm(C, d, hc, dPP, 1, C, QP, d, dkn, d, false, A_UPPER);  // dkn = dP^T qn + V R^T
      mm(C, d, hv, V16, hv, 1, RT, d, dkn, d, true);
      mm(C, dv, hc, PP, 1, C, DP, dv, dV, dv, false, A_UPPER);  // dV = P^T dnum + kn R
      mm(C, dv, h, K16, h, 1, RP, dv, dV, dv, true);
      mm(d, dv, hc, QP, 1, d, DP, dv, R, dv, true);  // R: dL/dS entering the chunk
      features_back<float>(qf, dqn, dqf, cs + s * d, n, d, x, d);
      narrow(x, d, n, d, dq + s * w.sdq, w.sdq);
      features_back<float>(kf, dkn, dkf, cs + s * d, n, d, x, d);
      narrow(x, d, n, d, dk + s * w.sdk, w.sdk);
      narrow(dV, dv, n, dv, dvo + s * w.sdv, w.sdv);
    }
  }
  std::memcpy(w.dS0, R, sizeof(float) * d * dv);
  std::memcpy(w.dz0, rz, sizeof(float) * d);
}

// `backward` for bfloat16 q, k, v, g, out and the gradients dq, dk, dv; the rest float32
void backward_bf16(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor cs, at::Tensor g,
                   at::Tensor out, at::Tensor denom, c10::optional<at::Tensor> S0,
                   c10::optional<at::Tensor> z0, c10::optional<at::Tensor> gS, c10::optional<at::Tensor> gz,
                   at::Tensor savedS, at::Tensor savedZ, at::Tensor dq, at::Tensor dk, at::Tensor dv,
                   at::Tensor dS0, at::Tensor dz0, int64_t C, int64_t block) {
  pybind11::gil_scoped_release no_gil;
  const int64_t N = q.size(2), d = q.size(3), V = v.size(3), nb = savedS.size(0);
  const int64_t ssS = nb ? savedS.stride(0) : 0, ssZ = nb ? savedZ.stride(0) : 0;
  const float* c = cs.data_ptr<float>();
  each_row<Scratch16>(q.size(0) * q.size(1), [&](int64_t r, Scratch16& s) {
    walk_back_bf16(row_back_at(r, q, k, v, g, out, denom, S0, z0, gS, gz, savedS, savedZ, dq, dk, dv, dS0, dz0), c, N,
                   d, V, C, block, ssS, ssZ, s.buf, s.words);
  });
}
