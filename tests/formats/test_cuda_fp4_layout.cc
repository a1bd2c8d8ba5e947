// The CUDA GEMM's FP4 weight layout and scale forms (src/cuda/fp4_layout.h), checked on the CPU
// for every code, position and scale byte: decode bits × multiplier (a bf16 product, exact here
// in fp32) must be the E2M1 value times the block scale, with the epilogue factor taken out.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda/fp4_layout.h"
#include "qmoe/formats.h"

namespace qmoe::cuda {
namespace {

float half_value(uint32_t w, int h) { return bf16_decode(static_cast<uint16_t>(h ? w >> 16 : w & 0xFFFF)); }

// The device's bf16 multiply, for operands whose exact product is a bf16 value; returns NaN
// when it is not (so that a comparison fails).
float bf16_mul_exact(float a, float b) {
  const float p = a * b;  // ≤ 8 × 8 significant bits: exact in fp32
  return bf16_round(p) == p ? p : NAN;
}

TEST(CudaFp4Layout, EveryCodeInEveryPositionDecodes) {
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h)
      for (uint32_t c = 0; c < 16; ++c) {
        uint32_t o[4];
        fp4_frag_decode(fp4_frag_place(c, j, h), o);
        for (int jj = 0; jj < 4; ++jj)
          for (int hh = 0; hh < 2; ++hh) {
            const float got = half_value(o[jj], hh) * 0x1p126f;
            const float want = (jj == j && hh == h) ? fp4_e2m1_decode(static_cast<uint8_t>(c)) : 0.0f;
            ASSERT_EQ(got, want) << "code " << c << " placed at register " << j << " half " << h
                                 << ", read at register " << jj << " half " << hh;
          }
      }
}

TEST(CudaFp4Layout, PositionsCoverTheWordOnce) {
  uint32_t seen = 0;
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h) {
      const uint32_t bits = fp4_frag_place(15u, j, h);
      EXPECT_EQ(__builtin_popcount(bits), 4);
      EXPECT_EQ(seen & bits, 0u) << "register " << j << " half " << h << " overlaps";
      seen |= bits;
    }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
}

TEST(CudaFp4Layout, RandomWordsDecodeElementwise) {
  std::mt19937 rng(11);
  for (int it = 0; it < 20000; ++it) {
    uint32_t codes[8], w = 0;
    for (int i = 0; i < 8; ++i) {
      codes[i] = rng() & 15u;
      w |= fp4_frag_place(codes[i], i / 2, i % 2);
    }
    uint32_t o[4];
    fp4_frag_decode(w, o);
    for (int i = 0; i < 8; ++i)
      ASSERT_EQ(half_value(o[i / 2], i % 2) * 0x1p126f, fp4_e2m1_decode(static_cast<uint8_t>(codes[i])));
  }
}

TEST(CudaFp4Layout, MxScaleBytesTimesEveryCode) {
  for (int c : {0, 1, 5, 60, 126}) {
    for (int s = 0; s < 255; ++s) {
      if (s > 128 + c || s + 5 < c) continue;  // outside the shift's range (mx_fp4_shift)
      for (int i = 0; i < 4; ++i) {
        const uint32_t word = static_cast<uint32_t>(mx_fp4_scale_byte(static_cast<uint8_t>(s), c)) << (8 * i) |
                              (0xA5u << (8 * ((i + 1) % 4)));  // another byte beside it
        const uint32_t m = fp4_scale_bf16x2<false>(word, i);
        ASSERT_EQ(m & 0xFFFF, m >> 16);
        for (uint32_t code = 0; code < 16; ++code) {
          uint32_t o[4];
          fp4_frag_decode(fp4_frag_place(code, 0, 0), o);
          const float got = bf16_mul_exact(half_value(o[0], 0), half_value(m, 0));
          const float want = std::ldexp(fp4_e2m1_decode(static_cast<uint8_t>(code)), s - 127 - c);
          ASSERT_EQ(got, want) << "s " << s << " shift " << c << " code " << code;
        }
      }
    }
  }
}

TEST(CudaFp4Layout, Nvfp4ScaleBytesTimesEveryCode) {
  for (int sc = 1; sc < 0x7F; ++sc) {
    const uint8_t kb = nvfp4_scale_byte(static_cast<uint8_t>(sc));
    EXPECT_EQ(kb, nvfp4_scale_byte(static_cast<uint8_t>(sc | 0x80))) << "the sign is dropped";
    for (int i = 0; i < 4; ++i) {
      const uint32_t m = fp4_scale_bf16x2<true>(static_cast<uint32_t>(kb) << (8 * i) | (0x5Au << (8 * ((i + 3) % 4))), i);
      ASSERT_EQ(m & 0xFFFF, m >> 16);
      ASSERT_EQ(half_value(m, 0), fp8_e4m3_decode(static_cast<uint8_t>(sc)) * 0x1p118f) << "scale code " << sc;
      for (uint32_t code = 0; code < 16; ++code) {
        uint32_t o[4];
        fp4_frag_decode(fp4_frag_place(code, 3, 1), o);
        const float got = bf16_mul_exact(half_value(o[3], 1), half_value(m, 1)) * kNvfp4EpilogueScale;
        const float want = fp4_e2m1_decode(static_cast<uint8_t>(code)) * fp8_e4m3_decode(static_cast<uint8_t>(sc));
        ASSERT_EQ(got, want) << "scale code " << sc << " code " << code;
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::cuda
