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
