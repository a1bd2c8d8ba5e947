// Encoders: round trips, ties to even at every midpoint, saturation, zero and NaN handling
// (quark-moe.md §10.1, §10.2, §10.7, §16.9; IEEE 754 for BF16 / FP16).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

using test::float_bits;

struct SmallFormat {
  std::string name;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  uint8_t sign_bit;
  std::vector<double> magnitudes;  // finite positive values by code, ascending
  uint8_t nan_code;                // what encode(NaN) must return
};

std::vector<SmallFormat> small_formats() {
  return {
      {"e2m1", fp4_e2m1_encode, fp4_e2m1_decode, 0x08, test::e2m1_magnitudes(), 0x07},
      {"e2m3", fp6_e2m3_encode, fp6_e2m3_decode, 0x20, test::e2m3_magnitudes(), 0x1F},
      {"e3m2", fp6_e3m2_encode, fp6_e3m2_decode, 0x20, test::e3m2_magnitudes(), 0x1F},
      {"e4m3fn", fp8_e4m3_encode, fp8_e4m3_decode, 0x80, test::e4m3_magnitudes(), 0x7F},
      {"e5m2", fp8_e5m2_encode, fp8_e5m2_decode, 0x80, test::e5m2_magnitudes(), 0x7E},
  };
}

// Signed code of magnitude index i; zero is always +0 (code 0) — spec §16.9.
uint8_t signed_code(const SmallFormat& f, size_t i, bool negative) {
  if (i == 0) return 0;
  return static_cast<uint8_t>(negative ? (i | f.sign_bit) : i);
}

TEST(Encode, MagnitudeTablesAreAscending) {
  for (const auto& f : small_formats())
    for (size_t i = 1; i < f.magnitudes.size(); ++i) EXPECT_LT(f.magnitudes[i - 1], f.magnitudes[i]) << f.name << i;
}

TEST(Encode, RoundTripEveryFiniteCode) {
  for (const auto& f : small_formats()) {
    const size_t n = f.magnitudes.size();
    for (size_t i = 0; i < n; ++i) {
      for (bool neg : {false, true}) {
        const uint8_t code = static_cast<uint8_t>(neg ? (i | f.sign_bit) : i);
        const float v = f.decode(code);
        ASSERT_FALSE(std::isnan(v)) << f.name << " code " << int(code);
        EXPECT_EQ(f.encode(v), signed_code(f, i, neg)) << f.name << " code " << int(code) << " value " << v;
      }
    }
  }
}

TEST(Encode, ZeroAndTinyNegativeGiveCodeZero) {
  for (const auto& f : small_formats()) {
    const float min_sub = static_cast<float>(f.magnitudes[1]);
    EXPECT_EQ(f.encode(0.0f), 0) << f.name;
    EXPECT_EQ(f.encode(-0.0f), 0) << f.name;  // §16.9: encoders emit +0
    EXPECT_EQ(f.encode(-min_sub / 2), 0) << f.name;  // tie → even (0)
    EXPECT_EQ(f.encode(-min_sub / 4), 0) << f.name;
    EXPECT_EQ(f.encode(-1e-45f), 0) << f.name;  // float subnormal input
    EXPECT_EQ(f.encode(1e-45f), 0) << f.name;
    EXPECT_EQ(f.encode(-std::nextafter(min_sub / 2, 1.0f)), signed_code(f, 1, true)) << f.name;
  }
}

// Every midpoint between neighbouring values ties to the code with the even mantissa LSB; one
// float ulp above / below goes to the nearer code. Codes are consecutive integers in value order,
// so "even mantissa" == "even index".
TEST(Encode, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (const auto& f : small_formats()) {
    const size_t n = f.magnitudes.size();
    for (size_t i = 0; i + 1 < n; ++i) {
      const double mid_d = (f.magnitudes[i] + f.magnitudes[i + 1]) / 2;
      const float mid = static_cast<float>(mid_d);
      ASSERT_EQ(static_cast<double>(mid), mid_d);
      const size_t even = (i % 2 == 0) ? i : i + 1;
      const float above = std::nextafter(mid, INFINITY);
      const float below = std::nextafter(mid, 0.0f);
      for (bool neg : {false, true}) {
        const float s = neg ? -1.0f : 1.0f;
        EXPECT_EQ(f.encode(s * mid), signed_code(f, even, neg)) << f.name << " mid " << s * mid;
        EXPECT_EQ(f.encode(s * above), signed_code(f, i + 1, neg)) << f.name << " above " << s * above;
        EXPECT_EQ(f.encode(s * below), signed_code(f, i, neg)) << f.name << " below " << s * below;
      }
    }
  }
}

TEST(Encode, SaturatesBeyondMaxAndForInfinity) {
  for (const auto& f : small_formats()) {
    const size_t top = f.magnitudes.size() - 1;
    const float max = static_cast<float>(f.magnitudes[top]);
    const float step = static_cast<float>(f.magnitudes[top] - f.magnitudes[top - 1]);
    const float beyond[] = {std::nextafter(max, INFINITY), max + step / 2, max + step, 2 * max, 1e30f, FLT_MAX, INFINITY};
    for (float v : beyond) {
      EXPECT_EQ(f.encode(v), signed_code(f, top, false)) << f.name << " " << v;
      EXPECT_EQ(f.encode(-v), signed_code(f, top, true)) << f.name << " " << -v;
    }
    EXPECT_EQ(f.decode(f.encode(INFINITY)), max) << f.name;
    EXPECT_EQ(f.decode(f.encode(-INFINITY)), -max) << f.name;
  }
  EXPECT_EQ(fp4_e2m1_decode(fp4_e2m1_encode(1e9f)), 6.0f);
  EXPECT_EQ(fp6_e2m3_decode(fp6_e2m3_encode(1e9f)), 7.5f);
  EXPECT_EQ(fp6_e3m2_decode(fp6_e3m2_encode(1e9f)), 28.0f);
  EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(1e9f)), 448.0f);
  EXPECT_EQ(fp8_e5m2_decode(fp8_e5m2_encode(1e9f)), 57344.0f);
}

TEST(Encode, NaNFollowsHeaderContract) {
  // formats.h: E4M3FN → 0x7F, E5M2 → 0x7E; E2M1 / FP6 have no NaN → +max.
  for (const auto& f : small_formats()) {
    EXPECT_EQ(f.encode(NAN), f.nan_code) << f.name;
    EXPECT_EQ(f.encode(-NAN), f.nan_code) << f.name;
  }
  EXPECT_TRUE(std::isnan(fp8_e4m3_decode(fp8_e4m3_encode(NAN))));
  EXPECT_TRUE(std::isnan(fp8_e5m2_decode(fp8_e5m2_encode(NAN))));
}

// Spec §10.1 thresholds for E2M1, applied to |x|: [0,0.25]→0, (0.25,0.75)→0.5, [0.75,1.25]→1,
// (1.25,1.75)→1.5, [1.75,2.5]→2, (2.5,3.5)→3, [3.5,5]→4, >5→6.
TEST(Encode, E2M1ThresholdsOfSpec) {
  struct Interval {
    float lo, hi;
    bool lo_closed, hi_closed;
    float value;
  };
  const Interval table[] = {
      {0.0f, 0.25f, true, true, 0.0f},  {0.25f, 0.75f, false, false, 0.5f}, {0.75f, 1.25f, true, true, 1.0f},
      {1.25f, 1.75f, false, false, 1.5f}, {1.75f, 2.5f, true, true, 2.0f},  {2.5f, 3.5f, false, false, 3.0f},
      {3.5f, 5.0f, true, true, 4.0f},   {5.0f, 1e30f, false, true, 6.0f},
  };
  for (const auto& iv : table) {
    std::vector<float> pts = {std::nextafter(iv.lo, INFINITY), std::nextafter(iv.hi, 0.0f), (iv.lo + iv.hi) / 2};
    if (iv.lo_closed) pts.push_back(iv.lo);
    if (iv.hi_closed) pts.push_back(iv.hi);
    for (float p : pts) {
      EXPECT_EQ(fp4_e2m1_decode(fp4_e2m1_encode(p)), iv.value) << p;
      if (iv.value != 0.0f) {
        EXPECT_EQ(fp4_e2m1_decode(fp4_e2m1_encode(-p)), -iv.value) << -p;
      } else {
        EXPECT_EQ(fp4_e2m1_encode(-p), 0) << -p;
      }
    }
  }
  // Spot list of exact codes.
  EXPECT_EQ(fp4_e2m1_encode(0.25f), 0);
  EXPECT_EQ(fp4_e2m1_encode(0.75f), 2);
  EXPECT_EQ(fp4_e2m1_encode(1.25f), 2);
  EXPECT_EQ(fp4_e2m1_encode(1.75f), 4);
  EXPECT_EQ(fp4_e2m1_encode(2.5f), 4);
  EXPECT_EQ(fp4_e2m1_encode(3.5f), 6);
  EXPECT_EQ(fp4_e2m1_encode(5.0f), 6);
  EXPECT_EQ(fp4_e2m1_encode(-5.0f), 14);
  EXPECT_EQ(fp4_e2m1_encode(5.0001f), 7);
  EXPECT_EQ(fp4_e2m1_encode(-6.9f), 15);
}

// ---- BF16 ------------------------------------------------------------------------------------
float bf16_ref_value(uint32_t c) {  // finite codes only
  const double mag = test::ieee_like_magnitude((c >> 7) & 0xFF, c & 0x7F, 7, 127);
  return static_cast<float>((c & 0x8000u) ? -mag : mag);
}

TEST(EncodeBf16, RoundTripAndMidpoints) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint32_t e = (c >> 7) & 0xFF;
    if (e == 0xFF && (c & 0x7F)) continue;  // NaN
    if (bf16_encode(bf16_decode(static_cast<uint16_t>(c))) != c) {
      ADD_FAILURE() << "bf16 round trip 0x" << std::hex << c;
      return;
    }
  }
  // Midpoints between consecutive positive finite codes (c, c+1): ties to even, ±1 ulp nearest.
  int failures = 0;
  for (uint32_t c = 0; c < 0x7F7F && failures < 5; ++c) {
    const double lo = bf16_ref_value(c), hi = bf16_ref_value(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    const uint32_t even = (c % 2 == 0) ? c : c + 1;
    for (uint32_t sign : {0u, 0x8000u}) {
      const float s = sign ? -1.0f : 1.0f;
      if (bf16_encode(s * mid) != (even | sign) || bf16_encode(s * std::nextafter(mid, INFINITY)) != ((c + 1) | sign) ||
          bf16_encode(s * std::nextafter(mid, 0.0f)) != (c | sign)) {
        ADD_FAILURE() << "bf16 midpoint after 0x" << std::hex << c << " sign " << sign;
        ++failures;
      }
    }
  }
  // Above the largest finite value: the midpoint to 2^128 rounds (to even) to Inf, below stays.
  const float top_mid = test::bits_float(0x7F7F8000u);
  EXPECT_EQ(bf16_encode(top_mid), 0x7F80);
  EXPECT_EQ(bf16_encode(std::nextafter(top_mid, 0.0f)), 0x7F7F);
  EXPECT_EQ(bf16_encode(FLT_MAX), 0x7F80);
  EXPECT_EQ(bf16_encode(-INFINITY), 0xFF80);
  EXPECT_EQ(bf16_encode(-0.0f), 0x8000);  // IEEE: sign of zero kept
  EXPECT_EQ(bf16_encode(1.0f), 0x3F80);
}

TEST(EncodeBf16, NaNStaysNaN) {
  // Signalling NaN whose payload is only in the low 16 bits must not truncate to Inf.
  for (uint32_t bits : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    const uint16_t b = bf16_encode(test::bits_float(bits));
    EXPECT_TRUE(std::isnan(bf16_decode(b))) << std::hex << bits;
  }
  EXPECT_TRUE(std::isnan(bf16_round(NAN)));
}

// ---- FP16 ------------------------------------------------------------------------------------
float fp16_ref_value(uint32_t c) {
  const double mag = test::ieee_like_magnitude((c >> 10) & 0x1F, c & 0x3FF, 10, 15);
  return static_cast<float>((c & 0x8000u) ? -mag : mag);
}

TEST(EncodeFp16, RoundTripAndMidpoints) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint32_t e = (c >> 10) & 0x1F;
    if (e == 0x1F && (c & 0x3FF)) continue;  // NaN
    if (fp16_encode(fp16_decode(static_cast<uint16_t>(c))) != c) {
      ADD_FAILURE() << "fp16 round trip 0x" << std::hex << c;
      return;
    }
  }
  int failures = 0;
  for (uint32_t c = 0; c < 0x7BFF && failures < 5; ++c) {  // includes subnormals and 0 → min subnormal
    const double lo = fp16_ref_value(c), hi = fp16_ref_value(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    const uint32_t even = (c % 2 == 0) ? c : c + 1;
    for (uint32_t sign : {0u, 0x8000u}) {
      const float s = sign ? -1.0f : 1.0f;
      if (fp16_encode(s * mid) != (even | sign) || fp16_encode(s * std::nextafter(mid, INFINITY)) != ((c + 1) | sign) ||
          fp16_encode(s * std::nextafter(mid, 0.0f)) != (c | sign)) {
        ADD_FAILURE() << "fp16 midpoint after 0x" << std::hex << c << " sign " << sign;
        ++failures;
      }
    }
  }
  // 65520 is the midpoint between 65504 (odd mantissa) and 65536: RNE overflows to Inf.
  EXPECT_EQ(fp16_encode(65520.0f), 0x7C00);
  EXPECT_EQ(fp16_encode(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(fp16_encode(-65520.0f), 0xFC00);
  EXPECT_EQ(fp16_encode(INFINITY), 0x7C00);
  EXPECT_EQ(fp16_encode(-INFINITY), 0xFC00);
  EXPECT_EQ(fp16_encode(FLT_MAX), 0x7C00);
  EXPECT_EQ(fp16_encode(-0.0f), 0x8000);
  EXPECT_EQ(fp16_encode(-1e-40f), 0x8000);  // underflow keeps the sign (IEEE)
  EXPECT_EQ(fp16_encode(static_cast<float>(test::pow2(-25))), 0x0000);  // tie → even (0)
  EXPECT_EQ(fp16_encode(std::nextafter(static_cast<float>(test::pow2(-25)), 1.0f)), 0x0001);
  EXPECT_TRUE(std::isnan(fp16_decode(fp16_encode(NAN))));
  EXPECT_TRUE(std::isnan(fp16_round(-NAN)));
  EXPECT_EQ(fp16_round(1.0f / 3.0f), static_cast<float>(1365.0 / 4096.0));  // 0x3555
}

}  // namespace
}  // namespace qmoe
