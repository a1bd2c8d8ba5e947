// Every code of every element / scale format decodes to the value the spec gives
// (quark-moe.md §10.1–10.3, §10.7; IEEE 754 for BF16 / FP16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "qmoe/formats.h"
#include "reference_tables.h"

namespace qmoe {
namespace {

using test::bits_float;
using test::float_bits;
using test::pow2;

// Exact equality including the sign of zero (decoders are exact; -0 is a real code here).
void expect_same(float got, double want, int code) {
  const float w = static_cast<float>(want);
  ASSERT_EQ(static_cast<double>(w), want) << "reference not representable, code " << code;
  EXPECT_EQ(float_bits(got), float_bits(w)) << "code 0x" << std::hex << code << ": got " << got << " want " << w;
}

TEST(Decode, E2M1AllCodesFromSpecList) {
  // spec §10.1, literally: 8:−0 … 15:−6.
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) expect_same(fp4_e2m1_decode(static_cast<uint8_t>(c)), want[c], c);
  EXPECT_EQ(kFp4Max, 6.0f);
}

TEST(Decode, E2M1BitTrickOfSpecMatches) {
  // §10.1: bits32 = ((c&7)<<22) | ((c&8)<<28), viewed as fp32, × 2^126.
  for (uint32_t c = 0; c < 16; ++c) {
    const float v = bits_float(((c & 7u) << 22) | ((c & 8u) << 28)) * static_cast<float>(pow2(126));
    EXPECT_EQ(float_bits(fp4_e2m1_decode(static_cast<uint8_t>(c))), float_bits(v)) << c;
  }
}

TEST(Decode, Fp6E2M3AllCodes) {
  const auto mag = test::e2m3_magnitudes();
  ASSERT_EQ(mag.size(), 32u);
  EXPECT_EQ(mag[31], 7.5);
  for (int c = 0; c < 64; ++c) {
    const double m = mag[c & 31];
    expect_same(fp6_e2m3_decode(static_cast<uint8_t>(c)), (c & 32) ? -m : m, c);
  }
  // Cross-check the spec table with the IEEE-style definition (bias 1, 3 mantissa bits).
  for (uint32_t c = 0; c < 32; ++c) EXPECT_EQ(mag[c], test::ieee_like_magnitude(c >> 3, c & 7u, 3, 1)) << c;
  EXPECT_EQ(kFp6E2M3Max, 7.5f);
}

TEST(Decode, Fp6E3M2AllCodes) {
  const auto mag = test::e3m2_magnitudes();
  ASSERT_EQ(mag.size(), 32u);
  EXPECT_EQ(mag[31], 28.0);
  for (int c = 0; c < 64; ++c) {
    const double m = mag[c & 31];
    expect_same(fp6_e3m2_decode(static_cast<uint8_t>(c)), (c & 32) ? -m : m, c);
  }
  for (uint32_t c = 0; c < 32; ++c) EXPECT_EQ(mag[c], test::ieee_like_magnitude(c >> 2, c & 3u, 2, 3)) << c;
  EXPECT_EQ(kFp6E3M2Max, 28.0f);
}

TEST(Decode, Fp6BitTrickOfSpecMatches) {
  // §10.2: ((c&0x1F) << (23−mbits)) | ((c&0x20) << 26), viewed as fp32, × 2^(127−bias).
  for (uint32_t c = 0; c < 64; ++c) {
    const float e2m3 = bits_float(((c & 0x1Fu) << 20) | ((c & 0x20u) << 26)) * static_cast<float>(pow2(126));
    const float e3m2 = bits_float(((c & 0x1Fu) << 21) | ((c & 0x20u) << 26)) * static_cast<float>(pow2(124));
    EXPECT_EQ(float_bits(fp6_e2m3_decode(static_cast<uint8_t>(c))), float_bits(e2m3)) << c;
    EXPECT_EQ(float_bits(fp6_e3m2_decode(static_cast<uint8_t>(c))), float_bits(e3m2)) << c;
  }
}

TEST(Decode, Fp8E4M3FnAllCodes) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(got)) << "0x" << std::hex << c << " must be NaN";
      continue;
    }
    const double m = test::ieee_like_magnitude((c >> 3) & 15, c & 7, 3, 7);
    expect_same(got, (c & 0x80) ? -m : m, c);
  }
  // Spot checks of §10.7: max 448, min subnormal 2^-9, min normal 2^-6, one.
  EXPECT_EQ(fp8_e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_decode(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3_decode(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(fp8_e4m3_decode(0x07), 7 * 0.001953125f);
  EXPECT_EQ(fp8_e4m3_decode(0x08), 0.015625f);  // 2^-6
  EXPECT_EQ(fp8_e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_decode(0x78), 256.0f);  // exponent 15 is finite in E4M3FN
  EXPECT_EQ(kFp8E4M3Max, 448.0f);
}

TEST(Decode, Fp8E5M2AllCodes) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_e5m2_decode(static_cast<uint8_t>(c));
    const int mag_code = c & 0x7F;
    if (mag_code == 0x7C) {
      EXPECT_TRUE(std::isinf(got)) << c;
      EXPECT_EQ(got > 0, (c & 0x80) == 0) << c;
      continue;
    }
    if (mag_code > 0x7C) {
      EXPECT_TRUE(std::isnan(got)) << "0x" << std::hex << c;
      continue;
    }
    const double m = test::ieee_like_magnitude(mag_code >> 2, mag_code & 3, 2, 15);
    expect_same(got, (c & 0x80) ? -m : m, c);
  }
  EXPECT_EQ(fp8_e5m2_decode(0x7B), 57344.0f);
  EXPECT_EQ(fp8_e5m2_decode(0x01), static_cast<float>(pow2(-16)));
  EXPECT_EQ(fp8_e5m2_decode(0x3C), 1.0f);
  EXPECT_EQ(kFp8E5M2Max, 57344.0f);
}

TEST(Decode, E8M0AllBytes) {
  // §10.3: 2^(s−127); 255 is NaN; s = 0 is 2^-127 (a float subnormal), not 0.
  for (int s = 0; s < 255; ++s) expect_same(e8m0_decode(static_cast<uint8_t>(s)), pow2(s - 127), s);
  EXPECT_TRUE(std::isnan(e8m0_decode(255)));
  EXPECT_GT(e8m0_decode(0), 0.0f);
  EXPECT_EQ(e8m0_decode(127), 1.0f);
  EXPECT_EQ(e8m0_decode(254), static_cast<float>(pow2(127)));
  EXPECT_EQ(e8m0_from_exponent(-127), 0);
  EXPECT_EQ(e8m0_from_exponent(0), 127);
  EXPECT_EQ(e8m0_from_exponent(127), 254);
}

// BF16: 1 sign, 8 exponent (bias 127), 7 mantissa, IEEE semantics.
TEST(Decode, Bf16AllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float got = bf16_decode(static_cast<uint16_t>(c));
    const uint32_t e = (c >> 7) & 0xFF, m = c & 0x7F;
    if (e == 0xFF) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got)) << c;
        EXPECT_EQ(std::signbit(got), (c & 0x8000u) != 0);
      } else {
        EXPECT_TRUE(std::isnan(got)) << c;
      }
      continue;
    }
    const double mag = test::ieee_like_magnitude(e, m, 7, 127);
    const double want = (c & 0x8000u) ? -mag : mag;
    if (float_bits(got) != float_bits(static_cast<float>(want))) {
      ADD_FAILURE() << "bf16 0x" << std::hex << c << " got " << got << " want " << want;
      return;
    }
  }
  EXPECT_EQ(bf16_decode(0x3F80), 1.0f);
  EXPECT_EQ(bf16_decode(0xC000), -2.0f);
  EXPECT_EQ(bf16_decode(0x0001), static_cast<float>(pow2(-133)));
  EXPECT_EQ(bf16_decode(0x7F7F), static_cast<float>(pow2(127) * (1.0 + 127.0 / 128.0)));
}

// FP16: 1 sign, 5 exponent (bias 15), 10 mantissa, IEEE semantics. All 65536 codes.
TEST(Decode, Fp16AllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float got = fp16_decode(static_cast<uint16_t>(c));
    const uint32_t e = (c >> 10) & 0x1F, m = c & 0x3FF;
    if (e == 0x1F) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got)) << c;
        EXPECT_EQ(std::signbit(got), (c & 0x8000u) != 0);
      } else {
        EXPECT_TRUE(std::isnan(got)) << c;
      }
      continue;
    }
    const double mag = test::ieee_like_magnitude(e, m, 10, 15);
    const double want = (c & 0x8000u) ? -mag : mag;
    if (float_bits(got) != float_bits(static_cast<float>(want))) {
      ADD_FAILURE() << "fp16 0x" << std::hex << c << " got " << got << " want " << want;
      return;
    }
  }
  EXPECT_EQ(fp16_decode(0x3C00), 1.0f);
  EXPECT_EQ(fp16_decode(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_decode(0x0001), static_cast<float>(pow2(-24)));
  EXPECT_EQ(fp16_decode(0x0400), static_cast<float>(pow2(-14)));
  EXPECT_EQ(float_bits(fp16_decode(0x8000)), 0x80000000u);
}

}  // namespace
}  // namespace qmoe
