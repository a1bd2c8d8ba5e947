// Test-only reference values of the element formats, written from the spec text
// (shared/spec/quark-moe.md §10, IEEE 754 definitions) with plain arithmetic. Nothing here calls
// qmoe/formats.h: these tables are what the implementation is checked against.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace qmoe::test {

// 2^k as a double, by repeated doubling / halving (exact for |k| < 1000).
inline double pow2(int k) {
  double r = 1.0;
  for (int i = 0; i < k; ++i) r *= 2.0;
  for (int i = 0; i > k; --i) r *= 0.5;
  return r;
}

// Positive magnitudes of each small format, indexed by the unsigned code (sign bit clear).
// E2M1, spec §10.1: "0:0, 1:0.5, 2:1, 3:1.5, 4:2, 5:3, 6:4, 7:6".
inline std::vector<double> e2m1_magnitudes() { return {0, 0.5, 1, 1.5, 2, 3, 4, 6}; }

// E2M3, spec §10.2: subnormals m/8 (0…0.875); e=1: 1…1.875 step 0.125; e=2: 2…3.75 step 0.25;
// e=3: 4…7.5 step 0.5.
inline std::vector<double> e2m3_magnitudes() {
  std::vector<double> v;
  for (int m = 0; m < 8; ++m) v.push_back(m / 8.0);
  const double start[3] = {1, 2, 4};
  const double step[3] = {0.125, 0.25, 0.5};
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 8; ++i) v.push_back(start[s] + i * step[s]);
  return v;  // 32 entries, last 7.5
}

// E3M2, spec §10.2: subnormals m/16 (0…0.1875); e=1: 0.25…0.4375; e=2: 0.5…0.875; e=3: 1…1.75;
// e=4: 2…3.5; e=5: 4…7; e=6: 8…14; e=7: 16…28 step 4.
inline std::vector<double> e3m2_magnitudes() {
  std::vector<double> v;
  for (int m = 0; m < 4; ++m) v.push_back(m / 16.0);
  const double start[7] = {0.25, 0.5, 1, 2, 4, 8, 16};
  const double step[7] = {0.0625, 0.125, 0.25, 0.5, 1, 2, 4};
  for (int s = 0; s < 7; ++s)
    for (int i = 0; i < 4; ++i) v.push_back(start[s] + i * step[s]);
  return v;  // 32 entries, last 28
}

// IEEE-style value of exponent field e / mantissa field m (no Inf/NaN handling):
// e == 0: 2^(1-bias) · m / 2^mbits (subnormal); else 2^(e-bias) · (1 + m / 2^mbits).
inline double ieee_like_magnitude(uint32_t e, uint32_t m, int mbits, int bias) {
  const double frac = static_cast<double>(m) / pow2(mbits);
  if (e == 0) return pow2(1 - bias) * frac;
  return pow2(static_cast<int>(e) - bias) * (1.0 + frac);
}

// FP8 E4M3FN magnitudes for codes 0..0x7E (spec §10.7: bias 7, max 448, no Inf, 0x7F NaN).
inline std::vector<double> e4m3_magnitudes() {
  std::vector<double> v;
  for (uint32_t c = 0; c < 0x7F; ++c) v.push_back(ieee_like_magnitude(c >> 3, c & 7u, 3, 7));
  return v;
}
// FP8 E5M2 finite magnitudes for codes 0..0x7B (bias 15, exponent 31 = Inf/NaN).
inline std::vector<double> e5m2_magnitudes() {
  std::vector<double> v;
  for (uint32_t c = 0; c < 0x7C; ++c) v.push_back(ieee_like_magnitude(c >> 2, c & 3u, 2, 15));
  return v;
}

// Nearest grid magnitude to v ≥ 0 (ties to the even index = even mantissa LSB), saturating at the
// top. `grid` ascending, grid[0] == 0.
inline double round_to_grid(const std::vector<double>& grid, double v) {
  if (v >= grid.back()) return grid.back();
  size_t j = 0;
  while (grid[j + 1] < v) ++j;  // grid[j] < v <= grid[j+1], or v == 0
  const double lo = grid[j], hi = grid[j + 1];
  if (v - lo < hi - v) return lo;
  if (hi - v < v - lo) return hi;
  return (j % 2 == 0) ? lo : hi;
}
// Half the grid spacing around v (0 ≤ v < max).
inline double half_step_at(const std::vector<double>& grid, double v) {
  size_t j = 0;
  while (j + 2 < grid.size() && grid[j + 1] < v) ++j;
  return (grid[j + 1] - grid[j]) / 2;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// QMOE_TEST_SMALL=1 shrinks the random loops (sanitizer CI).
inline int test_iterations(int normal, int small) {
  const char* s = std::getenv("QMOE_TEST_SMALL");
  return (s != nullptr && s[0] == '1') ? small : normal;
}

}  // namespace qmoe::test
