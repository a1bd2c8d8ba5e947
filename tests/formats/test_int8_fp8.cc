// INT8 (quark-moe.md §10.8, §16.1, checkpoint-format.md §4.5) and FP8 scale helpers (§10.7, §4.6).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

TEST(Int8, SaturateRneTiesToEven) {
  EXPECT_EQ(int8_saturate_rne(0.5f), 0);
  EXPECT_EQ(int8_saturate_rne(1.5f), 2);
  EXPECT_EQ(int8_saturate_rne(2.5f), 2);
  EXPECT_EQ(int8_saturate_rne(-0.5f), 0);
  EXPECT_EQ(int8_saturate_rne(-1.5f), -2);
  EXPECT_EQ(int8_saturate_rne(-2.5f), -2);
  EXPECT_EQ(int8_saturate_rne(0.49999997f), 0);
  EXPECT_EQ(int8_saturate_rne(0.50000006f), 1);
  EXPECT_EQ(int8_saturate_rne(126.5f), 126);
  EXPECT_EQ(int8_saturate_rne(127.5f), 127);  // → 128, saturated
  EXPECT_EQ(int8_saturate_rne(127.0f), 127);
  EXPECT_EQ(int8_saturate_rne(200.0f), 127);
  EXPECT_EQ(int8_saturate_rne(-128.0f), -128);
  EXPECT_EQ(int8_saturate_rne(-128.5f), -128);
  EXPECT_EQ(int8_saturate_rne(-1e9f), -128);
  EXPECT_EQ(int8_saturate_rne(INFINITY), 127);
  EXPECT_EQ(int8_saturate_rne(-INFINITY), -128);
  EXPECT_EQ(int8_saturate_rne(NAN), 0);  // header contract (cvt.rni.sat maps NaN to 0)
}

TEST(Int8, RoundHalfAwayFromZero) {
  EXPECT_EQ(round_half_away(0.5f), 1.0f);
  EXPECT_EQ(round_half_away(-0.5f), -1.0f);
  EXPECT_EQ(round_half_away(1.5f), 2.0f);
  EXPECT_EQ(round_half_away(2.5f), 3.0f);
  EXPECT_EQ(round_half_away(-2.5f), -3.0f);
  EXPECT_EQ(round_half_away(2.4999998f), 2.0f);
  EXPECT_EQ(round_half_away(0.0f), 0.0f);
  // The largest float below 0.5 must round to 0 (a naive floor(v + 0.5) gives 1: 0.49999997 + 0.5
  // rounds up to 1.0 in fp32). libdevice.round / C roundf give 0.
  EXPECT_EQ(round_half_away(0.49999997f), 0.0f);
  EXPECT_EQ(round_half_away(-0.49999997f), 0.0f);
  // Integers beyond 2^23 are fixed points.
  EXPECT_EQ(round_half_away(8388609.0f), 8388609.0f);
  EXPECT_EQ(round_half_away(-8388609.0f), -8388609.0f);
  // Around every half-integer in [-130, 130] (±3 ulps) against the definition sign(v)·floor(|v| + 1/2)
  // evaluated exactly in double.
  for (int n = -130; n < 130; ++n) {
    float v = static_cast<float>(n) + 0.5f;
    for (int k = 0; k < 3; ++k) v = std::nextafter(v, -INFINITY);
    for (int k = 0; k < 7; ++k, v = std::nextafter(v, INFINITY)) {
      const double want = std::copysign(std::floor(std::fabs(static_cast<double>(v)) + 0.5), v);
      EXPECT_EQ(round_half_away(v), static_cast<float>(want)) << v;
    }
  }
}

TEST(Int8, TokenQuantization) {
  // §16.1: scale = max(absmax, 1e-10) / 127; q = round_half_away(x · 127 / max(absmax, 1e-10)).
  EXPECT_EQ(int8_token_scale(127.0f), 1.0f);
  EXPECT_EQ(int8_token_scale(0.0f), 1e-10f / 127.0f);
  EXPECT_EQ(int8_token_scale(1e-12f), 1e-10f / 127.0f);
  EXPECT_EQ(int8_token_inv_scale(0.0f), 127.0f / 1e-10f);
  EXPECT_EQ(int8_token_inv_scale(254.0f), 0.5f);
  EXPECT_EQ(int8_quantize_token(0.0f, int8_token_inv_scale(0.0f)), 0);
  EXPECT_EQ(int8_quantize_token(1.0f, 1.0f), 1);
  EXPECT_EQ(int8_quantize_token(0.5f, 1.0f), 1);     // half away
  EXPECT_EQ(int8_quantize_token(-0.5f, 1.0f), -1);
  EXPECT_EQ(int8_quantize_token(2.5f, 1.0f), 3);
  EXPECT_EQ(int8_quantize_token(-2.5f, 1.0f), -3);
  EXPECT_EQ(int8_quantize_token(300.0f, 1.0f), 127);  // clamp to ±127
  EXPECT_EQ(int8_quantize_token(-300.0f, 1.0f), -127);
  // The absmax element maps to ±127 exactly.
  const float absmax = 3.7f;
  EXPECT_EQ(int8_quantize_token(absmax, int8_token_inv_scale(absmax)), 127);
  EXPECT_EQ(int8_quantize_token(-absmax, int8_token_inv_scale(absmax)), -127);
}

TEST(Int8, WeightAndStaticQuantization) {
  // checkpoint-format §4.5: symmetric scale = amax/127.5, at least FLT_EPSILON; q = rne(x·(1/s)).
  EXPECT_EQ(int8_weight_scale(127.5f), 1.0f);
  EXPECT_EQ(int8_weight_scale(255.0f), 2.0f);
  EXPECT_EQ(int8_weight_scale(0.0f), FLT_EPSILON);
  EXPECT_EQ(int8_weight_scale(1e-6f), FLT_EPSILON);
  EXPECT_EQ(int8_weight_scale(1.0f), static_cast<float>(1.0 / 127.5));
  EXPECT_EQ(int8_quantize_weight(-127.5f, 1.0f), -128);  // −128 can occur
  EXPECT_EQ(int8_quantize_weight(127.5f, 1.0f), 127);
  EXPECT_EQ(int8_quantize_weight(2.5f, 1.0f), 2);
  EXPECT_EQ(int8_quantize_weight(3.0f, 2.0f), 2);   // 1.5 → 2
  EXPECT_EQ(int8_quantize_weight(5.0f, 2.0f), 2);   // 2.5 → 2
  EXPECT_EQ(int8_quantize_weight(0.0f, FLT_EPSILON), 0);
  // Static activation (§10.8): sat(rne(x / s)).
  EXPECT_EQ(int8_quantize_static(0.25f, 0.5f), 0);   // 0.5 → 0
  EXPECT_EQ(int8_quantize_static(0.75f, 0.5f), 2);   // 1.5 → 2
  EXPECT_EQ(int8_quantize_static(-1.25f, 0.5f), -2);  // −2.5 → −2
  EXPECT_EQ(int8_quantize_static(1000.0f, 0.5f), 127);
  EXPECT_EQ(int8_quantize_static(-1000.0f, 0.5f), -128);
}

TEST(Fp8, ActAndWeightQuantization) {
  EXPECT_EQ(fp8_quantize_act(1000.0f, 1.0f), 0x7E);  // clamp to ±448
  EXPECT_EQ(fp8_quantize_act(-1000.0f, 1.0f), 0xFE);
  EXPECT_EQ(fp8_quantize_act(INFINITY, 1.0f), 0x7E);
  EXPECT_EQ(fp8_quantize_act(464.0f, 1.0f), 0x7E);  // midpoint 448/480 would be 480 = NaN code: clamps first
  EXPECT_EQ(fp8_quantize_act(1.0f, 2.0f), 0x40);     // 2.0
  EXPECT_EQ(fp8_quantize_act(-0.0f, 1.0f), 0x00);
  EXPECT_EQ(fp8_e4m3_decode(fp8_quantize_act(3.0f, 0.5f)), 1.5f);
  EXPECT_EQ(fp8_weight_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_weight_scale(0.0f), FLT_EPSILON);
  EXPECT_EQ(fp8_weight_scale(896.0f), 2.0f);
  EXPECT_EQ(fp8_quantize_weight(896.0f, 2.0f), 0x7E);
  EXPECT_EQ(fp8_quantize_weight(1e6f, 2.0f), 0x7E);
  EXPECT_EQ(fp8_quantize_weight(-1e6f, 2.0f), 0xFE);
  EXPECT_EQ(fp8_quantize_weight(1.0f, 2.0f), 0x30);  // 0.5
  EXPECT_EQ(fp8_tensor_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_tensor_scale(0.0f), FLT_EPSILON);
}

TEST(Fp8, TokenScaleFloor) {
  // max(absmax/448, 1/(448·512)).
  const float floor_scale = static_cast<float>(1.0 / (448.0 * 512.0));
  EXPECT_EQ(fp8_token_scale(0.0f), floor_scale);
  EXPECT_EQ(fp8_token_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_token_scale(1.0f / 512.0f), floor_scale);
  EXPECT_EQ(fp8_token_scale(1.0f), static_cast<float>(1.0 / 448.0));
}

}  // namespace
}  // namespace qmoe
