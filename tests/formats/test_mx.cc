// OCP MX block quantization: shared exponent rules ("even" of quark-moe.md §10.4, floor, ceil),
// E8M0 bytes (checkpoint-format.md §4.3), block QDQ known answers and random-block error bounds.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

using test::pow2;

struct ElemRef {
  MxElem elem;
  std::string name;
  int mbits, emax;
  std::vector<double> grid;  // positive magnitudes, ascending (independent tables)
};

std::vector<ElemRef> elems() {
  // §10.4: (mbits, emax) = (1, 2) FP4 E2M1; (3, 2) FP6 E2M3; (2, 4) FP6 E3M2; (3, 8) FP8 E4M3.
  return {{MxElem::Fp4E2M1, "fp4", 1, 2, test::e2m1_magnitudes()},
          {MxElem::Fp6E2M3, "fp6_e2m3", 3, 2, test::e2m3_magnitudes()},
          {MxElem::Fp6E3M2, "fp6_e3m2", 2, 4, test::e3m2_magnitudes()},
          {MxElem::Fp8E4M3, "fp8_e4m3", 3, 8, test::e4m3_magnitudes()}};
}

TEST(Mx, ElementParameters) {
  for (const auto& e : elems()) {
    EXPECT_EQ(mx_elem_mbits(e.elem), e.mbits) << e.name;
    EXPECT_EQ(mx_elem_emax(e.elem), e.emax) << e.name;
    EXPECT_EQ(static_cast<double>(mx_elem_max(e.elem)), e.grid.back()) << e.name;
    for (size_t c = 0; c < e.grid.size(); ++c) {
      EXPECT_EQ(static_cast<double>(mx_elem_decode(e.elem, static_cast<uint8_t>(c))), e.grid[c]) << e.name << c;
      EXPECT_EQ(mx_elem_encode(e.elem, static_cast<float>(e.grid[c])), c) << e.name << c;
    }
  }
  EXPECT_EQ(kMxBlock, 32);
}

// Known answers of the "even" rule, computed by hand from §10.4:
// bits(amax) + (1 << (22 − mbits)) carries into the exponent iff the amax mantissa ≥ 2 − 2^-(mbits+1).
TEST(Mx, SharedExponentEvenKnownAnswers) {
  struct Case {
    MxElem e;
    float amax;
    int shared;
  };
  const Case cases[] = {
      // FP4: threshold mantissa 1.75. 1.75 → 2.0 → floor log2 = 1 → 1 − 2 = −1.
      {MxElem::Fp4E2M1, 1.75f, -1},
      {MxElem::Fp4E2M1, 1.74f, -2},
      {MxElem::Fp4E2M1, std::nextafter(1.75f, 0.0f), -2},
      {MxElem::Fp4E2M1, 1.0f, -2},
      {MxElem::Fp4E2M1, 3.5f, 0},   // 1.75·2
      {MxElem::Fp4E2M1, 6.0f, 0},   // 1.5·4
      {MxElem::Fp4E2M1, 6.99f, 0},  // 1.7475·4
      {MxElem::Fp4E2M1, 7.0f, 1},   // 1.75·4
      {MxElem::Fp4E2M1, 0.4375f, -3},
      {MxElem::Fp4E2M1, 1000.0f, 8},  // 1.953·2^9 → 2^10
      // FP6 E2M3: threshold 1.9375.
      {MxElem::Fp6E2M3, 1.9375f, -1},
      {MxElem::Fp6E2M3, 1.93f, -2},
      {MxElem::Fp6E2M3, 1.75f, -2},
      {MxElem::Fp6E2M3, 7.5f, 0},
      {MxElem::Fp6E2M3, 7.75f, 1},
      // FP6 E3M2: threshold 1.875, emax 4.
      {MxElem::Fp6E3M2, 1.875f, -3},
      {MxElem::Fp6E3M2, 1.87f, -4},
      {MxElem::Fp6E3M2, 28.0f, 0},
      {MxElem::Fp6E3M2, 29.0f, 0},
      {MxElem::Fp6E3M2, 30.0f, 1},
      // FP8 E4M3: threshold 1.9375, emax 8.
      {MxElem::Fp8E4M3, 448.0f, 0},
      {MxElem::Fp8E4M3, 480.0f, 0},
      {MxElem::Fp8E4M3, 496.0f, 1},
      {MxElem::Fp8E4M3, 1.0f, -8},
  };
  for (const auto& c : cases)
    EXPECT_EQ(mx_shared_exponent(c.amax, c.e, MxScaleMode::Even), c.shared)
        << "elem " << int(c.e) << " amax " << c.amax;
}

TEST(Mx, SharedExponentFloorAndCeil) {
  EXPECT_EQ(mx_shared_exponent(1.75f, MxElem::Fp4E2M1, MxScaleMode::Floor), -2);
  EXPECT_EQ(mx_shared_exponent(7.0f, MxElem::Fp4E2M1, MxScaleMode::Floor), 0);
  EXPECT_EQ(mx_shared_exponent(7.9f, MxElem::Fp4E2M1, MxScaleMode::Floor), 0);
  EXPECT_EQ(mx_shared_exponent(8.0f, MxElem::Fp4E2M1, MxScaleMode::Floor), 1);
  EXPECT_EQ(mx_shared_exponent(30.0f, MxElem::Fp6E3M2, MxScaleMode::Floor), 0);
  EXPECT_EQ(mx_shared_exponent(0.0f, MxElem::Fp4E2M1, MxScaleMode::Floor), -127);
  EXPECT_EQ(mx_shared_exponent(1.75f, MxElem::Fp4E2M1, MxScaleMode::Ceil), -1);
  EXPECT_EQ(mx_shared_exponent(2.0f, MxElem::Fp4E2M1, MxScaleMode::Ceil), -1);  // exact power of two
  EXPECT_EQ(mx_shared_exponent(2.5f, MxElem::Fp4E2M1, MxScaleMode::Ceil), 0);
  EXPECT_EQ(mx_shared_exponent(448.0f, MxElem::Fp8E4M3, MxScaleMode::Ceil), 1);
  EXPECT_EQ(mx_shared_exponent(0.0f, MxElem::Fp6E2M3, MxScaleMode::Ceil), -127);
}

TEST(Mx, SharedExponentClamps) {
  const float tiny = static_cast<float>(pow2(-140));  // float subnormal
  for (const auto& e : elems()) {
    // All-zero block, "even": value 2^-126 → −126 − emax, clamped to −127.
    EXPECT_EQ(mx_shared_exponent(0.0f, e.elem, MxScaleMode::Even), -127) << e.name;
    for (auto mode : {MxScaleMode::Even, MxScaleMode::Floor, MxScaleMode::Ceil})
      EXPECT_EQ(mx_shared_exponent(tiny, e.elem, mode), -127) << e.name;
    EXPECT_EQ(mx_shared_exponent(static_cast<float>(pow2(-110)), e.elem, MxScaleMode::Floor), -110 - e.emax) << e.name;
  }
  // Upper end: the rounded amax overflows to +Inf (bits 0x7F800000) for amax ≥ (2 − 2^-(mbits+1))·2^127;
  // §10.4: floor(log2(Inf)) − emax clamps to 127.
  EXPECT_EQ(mx_shared_exponent(FLT_MAX, MxElem::Fp4E2M1, MxScaleMode::Even), 127);
  EXPECT_EQ(mx_shared_exponent(static_cast<float>(1.75 * pow2(127)), MxElem::Fp4E2M1, MxScaleMode::Even), 127);
  EXPECT_EQ(mx_shared_exponent(static_cast<float>(1.9375 * pow2(127)), MxElem::Fp8E4M3, MxScaleMode::Even), 127);
  EXPECT_EQ(mx_shared_exponent(static_cast<float>(1.5 * pow2(127)), MxElem::Fp4E2M1, MxScaleMode::Even), 125);
  EXPECT_EQ(mx_shared_exponent(FLT_MAX, MxElem::Fp4E2M1, MxScaleMode::Floor), 125);
}

TEST(Mx, ScaleBytes) {
  // checkpoint-format §4.3: Quark stores clamp(log2, -126) + 127 → the all-zero block's 2^-127 is byte 1.
  EXPECT_EQ(mx_scale_byte_quark(-127), 1);
  EXPECT_EQ(mx_scale_byte_quark(-126), 1);
  EXPECT_EQ(mx_scale_byte_quark(-125), 2);
  EXPECT_EQ(mx_scale_byte_quark(0), 127);
  EXPECT_EQ(mx_scale_byte_quark(127), 254);
  EXPECT_EQ(mx_scale_byte_quark(mx_shared_exponent(0.0f, MxElem::Fp4E2M1, MxScaleMode::Even)), 1);
}

std::vector<float> qdq(const std::vector<float>& x, MxElem e, MxScaleMode mode = MxScaleMode::Even) {
  std::vector<float> out(x.size());
  mx_qdq_block(x.data(), static_cast<int>(x.size()), e, mode, out.data());
  return out;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << what << " element " << i;  // −0 == +0
}

TEST(Mx, QdqKnownAnswersFp4) {
  // amax 6.99 (mantissa 1.7475 < 1.75) → scale 1: (6, 7) saturates to 6; 5 ties to 4; 5.1 → 6.
  expect_values(qdq({6.99f, 6.9f, 6.5f, 6.1f, 5.1f, 5.0f, -6.99f, 0.25f, 0.26f, -0.75f}, MxElem::Fp4E2M1),
                {6, 6, 6, 6, 6, 4, -6, 0, 0.5f, -1}, "amax 6.99");
  // amax 7 → scale 2: 7/2 = 3.5 ties to 4 → 8; 6.5/2 = 3.25 → 3 → 6; 0.5/2 = 0.25 → 0.
  expect_values(qdq({7.0f, 6.5f, 0.5f, -1.5f}, MxElem::Fp4E2M1), {8, 6, 0, -2}, "amax 7");
  // One huge outlier: scale 2^8; small values flush to (+)0.
  std::vector<float> x = {1000.0f, 1.0f, 0.1f, -3.0f, 2.0f, 100.0f, -64.0f, -63.0f};
  expect_values(qdq(x, MxElem::Fp4E2M1), {1024, 0, 0, 0, 0, 128, -0.0f, -0.0f}, "outlier");
  std::vector<uint8_t> codes(x.size());
  EXPECT_EQ(mx_quantize_block(x.data(), static_cast<int>(x.size()), MxElem::Fp4E2M1, MxScaleMode::Even, codes.data()), 8);
  const uint8_t want_codes[8] = {6, 0, 0, 0, 0, 1, 0, 0};  // −64/256 = −0.25 → +0 (code 0, §16.9)
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(codes[i], want_codes[i]) << i;
  // Floor rule (OCP plain) on the same amax saturates more: 7.9 → 6 at scale 1.
  expect_values(qdq({7.9f, 0.5f}, MxElem::Fp4E2M1, MxScaleMode::Floor), {6, 0.5f}, "floor");
  expect_values(qdq({7.9f, 0.5f}, MxElem::Fp4E2M1, MxScaleMode::Even), {8, 0}, "even");
}

TEST(Mx, QdqKnownAnswersFp6) {
  // E2M3, scale 1: 7.25 ties to 7 (even code 30), 7.3 → 7.5, 0.0625 ties to 0, 0.07 → 0.125.
  expect_values(qdq({7.5f, 7.25f, 7.3f, 0.0625f, 0.07f, -1.0625f}, MxElem::Fp6E2M3), {7.5f, 7, 7.5f, 0, 0.125f, -1},
                "e2m3");
  // E3M2, amax 29 (mantissa 1.8125 < 1.875) → scale 1: 29 saturates to 28; 26 ties to 24; 0.03125 ties to 0.
  expect_values(qdq({29.0f, 26.0f, 27.0f, 0.03125f, -0.1f}, MxElem::Fp6E3M2), {28, 24, 28, 0, -0.125f}, "e3m2");
}

TEST(Mx, AllZeroBlock) {
  for (const auto& e : elems()) {
    std::vector<float> x(32, 0.0f);
    x[3] = -0.0f;
    std::vector<uint8_t> codes(32, 0xAA);
    const int s = mx_quantize_block(x.data(), 32, e.elem, MxScaleMode::Even, codes.data());
    EXPECT_EQ(s, -127) << e.name;
    EXPECT_EQ(mx_scale_byte_quark(s), 1) << e.name;
    for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0) << e.name << i;
    for (float v : qdq(x, e.elem)) EXPECT_EQ(v, 0.0f) << e.name;
  }
}

// Random blocks: the shared exponent puts amax/scale in the range the rule implies, and every
// element is the nearest grid point (ties to even) of x/scale at the block scale, i.e. its error is
// ≤ half a grid step — except values beyond the element max, which saturate.
TEST(Mx, RandomBlocksRespectTheGrid) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-40, 40), spread(-12, 0);
  const int blocks = test::test_iterations(3000, 300);
  for (const auto& e : elems()) {
    const double max = e.grid.back();
    int checked = 0;
    for (int b = 0; b < blocks; ++b) {
      const int base = ex(rng);
      const int n = 1 + static_cast<int>(rng() % 32);
      std::vector<float> x(n);
      for (auto& v : x) v = std::ldexp(u(rng), base + spread(rng));
      if (rng() % 8 == 0) x[rng() % n] = 0.0f;
      std::vector<uint8_t> codes(n);
      const int s = mx_quantize_block(x.data(), n, e.elem, MxScaleMode::Even, codes.data());
      std::vector<float> out(n);
      mx_qdq_block(x.data(), n, e.elem, MxScaleMode::Even, out.data());
      double amax = 0;
      for (float v : x) amax = std::fmax(amax, std::fabs(static_cast<double>(v)));
      if (amax == 0) continue;
      // "even": amax/2^s ∈ [2^emax·(1 − 2^-(mbits+2)), 2^(emax+1)·(1 − 2^-(mbits+2))).
      const double r = amax / pow2(s), k = 1.0 - pow2(-(e.mbits + 2));
      ASSERT_GE(r, pow2(e.emax) * k) << e.name << " amax " << amax << " shared " << s;
      ASSERT_LT(r, pow2(e.emax + 1) * k) << e.name << " amax " << amax << " shared " << s;
      for (int i = 0; i < n; ++i) {
        const double y = std::fabs(static_cast<double>(x[i])) / pow2(s);
        const double got = std::fabs(static_cast<double>(out[i])) / pow2(s);
        ASSERT_EQ(out[i], ldexpf(mx_elem_decode(e.elem, codes[i]), s)) << e.name;
        if (out[i] != 0.0f) {
          ASSERT_EQ(std::signbit(out[i]), std::signbit(x[i])) << e.name;
        }
        if (y >= max) {
          ASSERT_EQ(got, max) << e.name << " y " << y;
          continue;
        }
        size_t j = 0;
        while (e.grid[j + 1] < y) ++j;  // grid[j] < y ≤ grid[j+1] (or y == 0)
        const double lo = e.grid[j], hi = e.grid[j + 1];
        ASSERT_LE(std::fabs(got - y), (hi - lo) / 2) << e.name << " y " << y;
        double want = (y - lo < hi - y) ? lo : (hi - y < y - lo) ? hi : ((j % 2 == 0) ? lo : hi);
        if (y == lo) want = lo;
        ASSERT_EQ(got, want) << e.name << " y " << y;
        ++checked;
      }
    }
    EXPECT_GT(checked, blocks) << e.name;
  }
}

TEST(Mx, RandomBlocksFloorAndCeilExponents) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.001f, 1.0f);
  std::uniform_int_distribution<int> ex(-60, 60);
  const int n = test::test_iterations(5000, 500);
  for (const auto& e : elems()) {
    for (int i = 0; i < n; ++i) {
      const float amax = std::ldexp(u(rng), ex(rng));
      const int fl = mx_shared_exponent(amax, e.elem, MxScaleMode::Floor);
      const int ce = mx_shared_exponent(amax, e.elem, MxScaleMode::Ceil);
      const double rf = amax / pow2(fl), rc = amax / pow2(ce);
      ASSERT_GE(rf, pow2(e.emax)) << amax;  // floor: amax/2^s ∈ [2^emax, 2^(emax+1))
      ASSERT_LT(rf, pow2(e.emax + 1)) << amax;
      ASSERT_GT(rc, pow2(e.emax - 1)) << amax;  // ceil: amax/2^s ∈ (2^(emax−1), 2^emax]
      ASSERT_LE(rc, pow2(e.emax)) << amax;
    }
  }
}

}  // namespace
}  // namespace qmoe
