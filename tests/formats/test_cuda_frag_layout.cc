// The CUDA GEMM's FP4 weight layout and scale forms (src/cuda/frag_layout.h), checked on the CPU
// for every code, position and scale byte: decode bits × multiplier (a bf16 product, exact here
// in fp32) must be the E2M1 value times the block scale, with the epilogue factor taken out.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/frag_layout.h"
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

// The pair form (two bytes' multipliers in the two halves, the GEMM's half-broadcast) equals the
// per-byte form for every byte in every position: MX kernel bytes 0..254 (255 never occurs), NVFP4
// kernel bytes of every finite non-zero scale (≤ 143) and 0.
TEST(CudaFp4Layout, ScalePairsEqualPerByteMultipliers) {
  std::vector<uint8_t> nv = {0};
  for (int sc = 1; sc < 0x7F; ++sc) nv.push_back(nvfp4_scale_byte(static_cast<uint8_t>(sc)));
  for (int kind = 0; kind < 2; ++kind) {
    const bool is_nv = kind == 1;
    const int n = is_nv ? static_cast<int>(nv.size()) : 255;
    for (int a = 0; a < n; ++a)
      for (int i = 0; i < 4; ++i) {
        const uint32_t b = is_nv ? nv[static_cast<size_t>(a)] : static_cast<uint32_t>(a);
        const uint32_t other = is_nv ? nv[static_cast<size_t>((a * 7 + 3) % n)] : static_cast<uint32_t>((a * 37 + 11) % 255);
        uint32_t word = 0;
        for (int j = 0; j < 4; ++j) word |= (j == i ? b : other) << (8 * j);
        const uint32_t pair = is_nv ? fp4_scale_pair_bf16x2<true>(word, i % 2) : fp4_scale_pair_bf16x2<false>(word, i % 2);
        const uint32_t one = is_nv ? fp4_scale_bf16x2<true>(word, i) : fp4_scale_bf16x2<false>(word, i);
        ASSERT_EQ((pair >> (16 * (i / 2))) & 0xFFFFu, one & 0xFFFFu) << (is_nv ? "nvfp4" : "mx") << " byte " << b << " at " << i;
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

// FP6: every code in every register slot of both m-fragments, alone and in random full words.
template <bool kE3M2>
void check_fp6_planes() {
  const float unscale = kE3M2 ? 0x1p124f : 0x1p126f;
  auto value = [](uint32_t c) {
    return kE3M2 ? fp6_e3m2_decode(static_cast<uint8_t>(c)) : fp6_e2m3_decode(static_cast<uint8_t>(c));
  };
  for (int mt = 0; mt < 2; ++mt)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h)
        for (uint32_t c = 0; c < 64; ++c) {
          const uint32_t w4 = fp4_frag_place(fp6_plane4_code(c, kE3M2), j, h);
          const uint32_t w2 = fp6_plane2_place(c, kE3M2, 4 * mt + j, h);
          uint32_t o[4];
          fp6_frag_decode<kE3M2>(w4, w2, mt, o);
          for (int jj = 0; jj < 4; ++jj)
            for (int hh = 0; hh < 2; ++hh)
              ASSERT_EQ(half_value(o[jj], hh) * unscale, (jj == j && hh == h) ? value(c) : 0.0f)
                  << "code " << c << " at m-fragment " << mt << " register " << j << " half " << h << ", read at " << jj
                  << "/" << hh;
          // The other m-fragment's slots of this plane-2 word read nothing of it.
          fp6_frag_decode<kE3M2>(0u, w2, 1 - mt, o);
          for (int jj = 0; jj < 4; ++jj) ASSERT_EQ(o[jj], 0u) << "code " << c << " leaks into m-fragment " << 1 - mt;
        }
  std::mt19937 rng(kE3M2 ? 5 : 6);
  for (int it = 0; it < 5000; ++it) {
    uint32_t codes[2][8], w4[2] = {0, 0}, w2 = 0;
    for (int mt = 0; mt < 2; ++mt)
      for (int i = 0; i < 8; ++i) {
        codes[mt][i] = rng() & 63u;
        w4[mt] |= fp4_frag_place(fp6_plane4_code(codes[mt][i], kE3M2), i / 2, i % 2);
        w2 |= fp6_plane2_place(codes[mt][i], kE3M2, 4 * mt + i / 2, i % 2);
      }
    for (int mt = 0; mt < 2; ++mt) {
      uint32_t o[4];
      fp6_frag_decode<kE3M2>(w4[mt], w2, mt, o);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(half_value(o[i / 2], i % 2) * unscale, value(codes[mt][i]));
    }
  }
  // Scale bytes: products with every code exact at the bias and margin of Fp6Planes.
  for (int c : {0, 2, 40}) {
    for (int sc = 0; sc < 255; ++sc) {
      if (sc + Fp6Planes<kE3M2>::kBias - c > 254 || sc + Fp6Planes<kE3M2>::kMargin < c) continue;
      const uint32_t m = fp4_scale_bf16x2<false>(mx_fp4_scale_byte(static_cast<uint8_t>(sc), c, Fp6Planes<kE3M2>::kBias), 0);
      for (uint32_t code = 0; code < 64; ++code) {
        const uint32_t w4 = fp4_frag_place(fp6_plane4_code(code, kE3M2), 1, 1);
        uint32_t o[4];
        fp6_frag_decode<kE3M2>(w4, fp6_plane2_place(code, kE3M2, 1, 1), 0, o);
        const float got = bf16_mul_exact(half_value(o[1], 1), half_value(m, 1));
        ASSERT_EQ(got, std::ldexp(value(code), sc - 127 - c)) << "s " << sc << " shift " << c << " code " << code;
      }
    }
  }
}
TEST(CudaFp6Layout, E2M3PlanesDecodeEveryCode) { check_fp6_planes<false>(); }
TEST(CudaFp6Layout, E3M2PlanesDecodeEveryCode) { check_fp6_planes<true>(); }

TEST(CudaFp6Layout, Plane2SlotsTileTheWord) {
  for (const bool e3m2 : {false, true}) {
    uint32_t seen = 0;
    for (int t = 0; t < 8; ++t)
      for (int h = 0; h < 2; ++h) {
        const uint32_t bits = fp6_plane2_place(e3m2 ? 0x11u : 0x3u, e3m2, t, h);
        EXPECT_EQ(__builtin_popcount(bits), 2) << "slot " << t;
        EXPECT_EQ(seen & bits, 0u) << (e3m2 ? "e3m2" : "e2m3") << " slot " << t << " half " << h;
        seen |= bits;
      }
    EXPECT_EQ(seen, 0xFFFFFFFFu) << (e3m2 ? "e3m2" : "e2m3");
  }
}

// The BF16 / INT8 weight rows' 16-byte chunks: sw128_chunk is the 128-byte swizzle as wgmma and TMA
// apply it to shared-memory addresses (bits 4–6 XOR bits 7–9 of the offset in a 1024-byte-aligned
// block), a permutation of each row's 8 chunks, and its own inverse (the repack stores chunk q at
// sw128_chunk(r, q); the mma.sync kernel's copy maps it back).
TEST(CudaSwizzle, Sw128ChunkIsTheHardwareSwizzleAndItsOwnInverse) {
  for (int r = 0; r < 128; ++r) {
    int seen = 0;
    for (int q = 0; q < 8; ++q) {
      const int off = r * 128 + q * 16;
      const int hw = off ^ (((off >> 7) & 7) << 4);
      EXPECT_EQ(hw, r * 128 + sw128_chunk(r, q) * 16) << "row " << r << " chunk " << q;
      EXPECT_EQ(sw128_chunk(r, sw128_chunk(r, q)), q) << "row " << r << " chunk " << q;
      seen |= 1 << sw128_chunk(r, q);
    }
    EXPECT_EQ(seen, 0xFF) << "row " << r;
  }
}

}  // namespace
}  // namespace qmoe::cuda
