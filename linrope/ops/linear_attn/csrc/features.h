// The elu+1 features and their rotation, shared by scans.cpp and chunk.cpp: exp for x <= 0, one position's
// features, and their gradient.
// exp for x <= 0 in float: Cody-Waite reduction by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2] (the
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

// One position's features: f = elu(x) + 1 (d numbers, x dense) and r = f rotated by the pairs (cos, sin) of c
template <typename T>
static inline __attribute__((always_inline)) void elu_rope_row(const T* x, const T* c, int64_t d, T* f, T* r) {
  #pragma omp simd
  for (int64_t t = 0; t < d; ++t) {
    const T v = x[t];
    f[t] = v > T(0) ? v + T(1) : exp_nonpos(v < T(0) ? v : T(0));
  }
  #pragma omp simd
  for (int64_t t = 0; t < d; t += 2) {
    const T a = f[t], e = f[t + 1], co = c[t], si = c[t + 1];
    r[t] = a * co - e * si;
    r[t + 1] = a * si + e * co;
  }
}

// One position's gradient of x: out = min(f, 1) * (R^-1 gn + gd) from those of its rotated (gn) and plain (gd, read
// only with_gd) features
template <bool with_gd, typename T>
static inline __attribute__((always_inline)) void elu_rope_back_row(const T* f, const T* gn, const T* gd, const T* c,
                                                                    int64_t d, T* out) {
  #pragma omp simd
  for (int64_t t = 0; t < d; t += 2) {
    const T a = gn[t], e = gn[t + 1], co = c[t], si = c[t + 1];
    T u = a * co + e * si, w = e * co - a * si;
    if (with_gd) { u += gd[t]; w += gd[t + 1]; }
    const T f0 = f[t] < T(1) ? f[t] : T(1), f1 = f[t + 1] < T(1) ? f[t + 1] : T(1);
    out[t] = f0 * u;
    out[t + 1] = f1 * w;
  }
}
